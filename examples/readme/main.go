package main

import (
	"context"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

func main() {
	// The context bounds the first sync: without a deadline, an API server
	// that cannot be reached is retried for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "memcache-headless:11211")
	if err != nil {
		log.Fatalf("creating server selector: %v", err)
	}
	defer ss.Close()
	cache := memcache.NewFromSelector(ss)

	// Use cache...
	_ = cache
}
