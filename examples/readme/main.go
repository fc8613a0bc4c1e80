package main

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

func main() {
	// The deadline bounds the first sync: without one, an unreachable API server is retried for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211") // a headless Service, and its port
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Set(&memcache.Item{Key: "greeting", Value: []byte("hello"), Expiration: 300}); err != nil {
		log.Fatal(err)
	}
	item, err := c.Get("greeting")
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		log.Print("miss: load the value, then Set it")
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("greeting = %s", item.Value)
	}
}
