// Command basic finds the memcached pods behind a headless Service, stores
// one key through them and reads it back, saying which pod holds it.
//
// Run it in a pod whose service account has the Role in
// ../kubernetes/rbac.yaml, or outside a cluster through kubectl proxy:
//
//	kubectl proxy &
//	go run ./examples/basic -api http://127.0.0.1:8001 -addr memcache-headless.default:11211
package main

import (
	"context"
	"flag"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

func main() {
	addr := flag.String("addr", "memcache-headless:11211", "the memcached Service, as service[.namespace]:port")
	api := flag.String("api", "", "the API server URL when running outside a cluster, such as http://127.0.0.1:8001 for kubectl proxy")
	flag.Parse()

	var opts []selector.Option
	if *api != "" {
		opts = append(opts, selector.WithAPIServer(*api))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, *addr, opts...)
	if err != nil {
		log.Fatalf("creating server selector: %v", err)
	}
	defer ss.Close()
	cache := memcache.NewFromSelector(ss)

	if err := cache.Set(&memcache.Item{Key: "hello", Value: []byte("world")}); err != nil {
		log.Fatalf("set: %v", err)
	}
	it, err := cache.Get("hello")
	if err != nil {
		log.Fatalf("get: %v", err)
	}
	server, _ := ss.PickServer("hello")
	log.Printf("hello = %s, stored on %s, one of %d servers", it.Value, server, len(ss.Servers()))
}
