package selector_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// In a pod whose service account may list and watch EndpointSlices, route
// keys to the pods of the headless Service memcache-headless.
func ExampleNewServerList() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "memcache-headless:11211")
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer ss.Close()

	cache := memcache.NewFromSelector(ss)
	if err := cache.Set(&memcache.Item{Key: "greeting", Value: []byte("hello")}); err != nil {
		log.Printf("set: %v", err)
	}
}

// Outside a cluster, through kubectl proxy, with the server count logged on
// every change.
func ExampleNewServerList_outsideCluster() {
	ss, err := selector.NewServerList(context.Background(), "memcache-headless.cache:memcache",
		selector.WithAPIServer("http://127.0.0.1:8001"),
		selector.WithSlog(slog.Default()),
		selector.WithOnChange(func(servers []net.Addr) {
			slog.Info("memcached servers changed", "count", len(servers))
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer ss.Close()
	_ = memcache.NewFromSelector(ss)
}

// The zero ServerList is a consistent-hashing drop-in for
// memcache.ServerList: adding a server moves only the keys the new server
// takes over.
func ExampleServerList_SetServers() {
	var ss selector.ServerList
	if err := ss.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"); err != nil {
		log.Fatal(err)
	}
	owner := func() map[string]string {
		m := map[string]string{}
		for i := range 10000 {
			key := fmt.Sprintf("user:%d", i)
			addr, _ := ss.PickServer(key)
			m[key] = addr.String()
		}
		return m
	}
	before := owner()

	if err := ss.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211"); err != nil {
		log.Fatal(err)
	}
	movedTo := map[string]int{}
	for key, addr := range owner() {
		if addr != before[key] {
			movedTo[addr]++
		}
	}
	fmt.Println(ss.Servers())
	fmt.Printf("moved to the new server: %.0f%%, to others: %d\n", float64(movedTo["10.0.0.4:11211"])/100, len(movedTo)-1)
	// Output:
	// [10.0.0.1:11211 10.0.0.2:11211 10.0.0.3:11211 10.0.0.4:11211]
	// moved to the new server: 24%, to others: 0
}

// A readiness check and a health endpoint from the ServerList's own state,
// without a metrics dependency.
func ExampleServerList_Stats() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "memcache-headless:11211", selector.WithWaitForServers())
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer ss.Close()

	http.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ss.HasSynced() {
			http.Error(w, "memcached servers not discovered yet", http.StatusServiceUnavailable)
		}
	})
	http.HandleFunc("/debug/memcache", func(w http.ResponseWriter, r *http.Request) {
		s := ss.Stats()
		fmt.Fprintf(w, "servers %d, last sync %s ago, relists %d, watch restarts %d, last error %v\n",
			len(s.Servers), time.Since(s.LastSync).Round(time.Second), s.Relists, s.WatchRestarts, s.LastError)
	})
}

// A Client in place of memcache.NewFromSelector: the same methods, plus
// failover, no stale reads when a server returns, a warm handoff when pods
// roll, and no connections left to pods that are gone.
func ExampleNewClient() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211", selector.WithTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()

	item, err := c.Get("user:42")
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		// Load it, then c.Set it.
	case err != nil:
		log.Printf("get: %v", err)
	default:
		fmt.Printf("%s\n", item.Value)
	}
}

// A Client over fixed servers, outside Kubernetes: SetServers changes them
// later, and the Client follows.
func ExampleNewClientFromList() {
	var ss selector.ServerList
	if err := ss.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"); err != nil {
		log.Fatal(err)
	}
	c, err := selector.NewClientFromList(&ss)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	_ = c.Set(&memcache.Item{Key: "greeting", Value: []byte("hello")})
}

// A Client whose cache outlives a zone: the memcached pods spread over the
// zones, one ring per zone, each key in every zone, and reads in the
// client's own zone (from SELECTOR_ZONE, which the downward API sets; see
// the README), failing over to the other zones on an error or a miss.
func ExampleByZone() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211",
		selector.WithPool(selector.ByZone("").WithMissFailover()))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
	_ = c.Set(&memcache.Item{Key: "session:7", Value: []byte("...")})
}

// A pool over one Service per zone (examples/kubernetes/memcached-by-zone.yaml):
// each client names its own zone's Service first.
func ExampleAcrossServices() {
	zone := os.Getenv(selector.ZoneEnv) // the node's zone: "zone-a", "zone-b" or "zone-c"
	var others []string
	for _, z := range []string{"zone-a", "zone-b", "zone-c"} {
		if z != zone {
			others = append(others, "memcache-"+z+":11211")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-"+zone+":11211",
		selector.WithPool(selector.AcrossServices(others...)))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
}

// Sharing memcached with PHP (php-memcached with OPT_LIBKETAMA_COMPATIBLE),
// libmemcached or twemproxy (ketama, md5): the same servers, under the same
// names, give every key the same server.
func ExampleKetama() {
	var ss selector.ServerList
	if err := ss.SetHashing(selector.Ketama()); err != nil {
		log.Fatal(err)
	}
	if err := ss.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"); err != nil {
		log.Fatal(err)
	}
	a, _ := ss.PickServer("user:42")
	fmt.Println(a) // as PHP's $m->getServerByKey("user:42") over the same servers
	// Output: 10.0.0.1:11211
}

// Beside an mcrouter pool of a StatefulSet's pods: Ch3 places each pod at
// its ordinal, as the pool's list has them.
func ExampleCh3() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211", selector.WithHashing(selector.Ch3()))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
}
