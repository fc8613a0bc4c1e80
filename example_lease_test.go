package selector_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Cache-aside through GetOrLoad: 100 requests of a key that is not cached
// cost the database one query; after an update, Invalidate marks the
// value stale, and the next 100 cost one query again. Here against a
// memcached process on this machine that the example starts, and a
// database stand-in that counts its queries.
func ExampleClient_GetOrLoad() {
	k := startCluster(1, "memcache")
	defer k.Close()
	var ss selector.ServerList
	if err := ss.SetServers(k.LocalAddrs()...); err != nil {
		log.Fatal(err)
	}
	c, err := selector.NewClientFromList(&ss, selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var queries atomic.Int64
	price := "10"
	loadPrice := func(ctx context.Context, key string) (*memcache.Item, error) {
		queries.Add(1) // SELECT price FROM products WHERE id = ...
		return &memcache.Item{Value: []byte(price), Expiration: 3600}, nil
	}
	serve := func() string {
		var wg sync.WaitGroup
		var got atomic.Value
		for range 100 {
			wg.Go(func() {
				it, err := c.GetOrLoad(context.Background(), "price:42", selector.LoadOptions{}, loadPrice)
				if err != nil {
					log.Fatal(err)
				}
				got.Store(string(it.Value))
			})
		}
		wg.Wait()
		return got.Load().(string)
	}

	fmt.Println("price", serve(), "queries", queries.Load())
	price = "12" // UPDATE products SET price = 12 WHERE id = ...
	if err := c.Invalidate(context.Background(), "price:42"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("price", serve(), "queries", queries.Load())
	// Output:
	// price 10 queries 1
	// price 12 queries 2
}
