// Command local runs the Client over a fixed list of memcached servers,
// with no Kubernetes: the quickest way to try the library. It stores and
// reads keys with Set, Get and GetMulti, loads one through GetOrLoad, and
// prints which server holds each key and what the Client knows of the
// servers.
//
//	memcached -p 11211 -d && memcached -p 11212 -d
//	go run ./examples/local -servers 127.0.0.1:11211,127.0.0.1:11212
//
// The servers come from -servers, else from MEMCACHE_SERVERS (the same
// form), else 127.0.0.1:11211. A second run finds the value that the first
// one's GetOrLoad cached, and loads nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

func main() {
	list := flag.String("servers", "", "memcached servers, as host:port,host:port (default $MEMCACHE_SERVERS, else 127.0.0.1:11211)")
	flag.Parse()
	servers := serversOf(*list, os.Getenv("MEMCACHE_SERVERS"), "127.0.0.1:11211")
	log.SetFlags(0)

	var ss selector.ServerList
	if err := ss.SetServers(servers...); err != nil {
		log.Fatal(err)
	}
	c, err := selector.NewClientFromList(&ss) // or memcache.NewFromSelector(&ss)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Set and Get, as with gomemcache's Client.
	if err := c.Set(&memcache.Item{Key: "greeting", Value: []byte("hello"), Expiration: 300}); err != nil {
		log.Fatalf("Set: %v (is memcached running at %s?)", err, strings.Join(servers, ", "))
	}
	item, err := c.Get("greeting")
	if err != nil {
		log.Fatalf("Get: %v", err)
	}
	fmt.Printf("Get greeting: %q, held by %s\n", item.Value, holder(&ss, "greeting"))

	// GetMulti: one request to each server holding some of the keys; a
	// key that is not there is left out.
	if err := c.Set(&memcache.Item{Key: "color", Value: []byte("blue"), Expiration: 300}); err != nil {
		log.Fatalf("Set: %v", err)
	}
	items, err := c.GetMulti([]string{"greeting", "color", "size"})
	if err != nil {
		log.Fatalf("GetMulti: %v", err)
	}
	fmt.Printf("GetMulti greeting, color, size: %d found (color %q, held by %s); size is not cached\n",
		len(items), items["color"].Value, holder(&ss, "color"))

	// GetOrLoad: a miss runs the load (a database query, say) once, and
	// caches its value; the next call is a hit.
	loads := 0
	loadPrice := func(ctx context.Context, key string) (*memcache.Item, error) {
		loads++
		return &memcache.Item{Value: []byte("12.50"), Expiration: 300}, nil
	}
	for range 2 {
		it, err := c.GetOrLoad(context.Background(), "price:42", selector.LoadOptions{}, loadPrice)
		if err != nil {
			log.Fatalf("GetOrLoad: %v", err)
		}
		item = it
	}
	fmt.Printf("GetOrLoad price:42 twice: %q, loaded %d time(s)\n", item.Value, loads)

	// A key memcached would refuse is refused here, with an error that
	// says why; errors.Is(err, memcache.ErrMalformedKey) holds.
	_, err = c.Get("a key with spaces")
	fmt.Printf("Get of a malformed key: %v\n", err)

	fmt.Println("Stats:")
	for _, s := range c.Stats().Servers {
		fmt.Printf("  %s %s\n", s.Addr, s.State)
	}
}

// serversOf returns the servers of the first list given of lists, each
// comma-separated.
func serversOf(lists ...string) []string {
	for _, l := range lists {
		var servers []string
		for _, s := range strings.Split(l, ",") {
			if s = strings.TrimSpace(s); s != "" {
				servers = append(servers, s)
			}
		}
		if len(servers) > 0 {
			return servers
		}
	}
	return nil
}

// holder returns the server that ss maps key to.
func holder(ss *selector.ServerList, key string) string {
	addr, err := ss.PickServer(key)
	if err != nil {
		return err.Error()
	}
	return addr.String()
}
