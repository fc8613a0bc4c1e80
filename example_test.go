package selector_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// In a pod whose service account may list and watch EndpointSlices, route
// keys to the pods of the headless Service memcache-headless.
//
// This example is compiled but not run: it needs a pod, whose service
// account token, CA and API server address NewServerList reads. The
// outsideCluster example below makes the same calls against a stand-in.
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
// every change. Here a stand-in that the example starts plays kubectl proxy
// (at http://127.0.0.1:8001 once you run `kubectl proxy --port 8001`).
func ExampleNewServerList_outsideCluster() {
	proxy := startProxy(3, "memcache-headless")
	defer proxy.Close()

	// The deadline bounds the first sync: without one, an API server that
	// cannot be reached is retried for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "memcache-headless.cache:memcache",
		selector.WithAPIServer(proxy.URL),
		selector.WithSlog(slog.Default()),
		selector.WithOnChange(func(servers []net.Addr) {
			slog.Info("memcached servers changed", "count", len(servers))
		}),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer ss.Close()
	fmt.Println(ss.Servers())
	_ = memcache.NewFromSelector(ss)
	// Output: [10.244.0.1:11211 10.244.0.2:11211 10.244.0.3:11211]
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
// without a metrics dependency. Here against a stand-in for kubectl proxy
// that the example starts; in a pod, leave WithAPIServer out.
func ExampleServerList_Stats() {
	proxy := startProxy(3, "memcache-headless")
	defer proxy.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "memcache-headless:11211", selector.WithWaitForServers(),
		selector.WithAPIServer(proxy.URL))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer ss.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ss.HasSynced() {
			http.Error(w, "memcached servers not discovered yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/debug/memcache", func(w http.ResponseWriter, r *http.Request) {
		s := ss.Stats()
		fmt.Fprintf(w, "servers %d, synced %t, relists %d, watch restarts %d, last error %v",
			len(s.Servers), s.Synced, s.Relists, s.WatchRestarts, s.LastError)
	})

	// Serve mux (http.ListenAndServe(":8080", mux)); here, one request to each.
	for _, path := range []string{"/readyz", "/debug/memcache"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		fmt.Println(path, w.Code, w.Body.String())
	}
	// Output:
	// /readyz 200 ok
	// /debug/memcache 200 servers 3, synced true, relists 0, watch restarts 0, last error <nil>
}

// A Client in place of memcache.NewFromSelector: the same methods, plus
// failover, invalidations when a server returns, a warm handoff when pods
// roll, and no connections left to pods that are gone (docs/client.md).
//
// Here against a stand-in for a cluster that the example starts: an API
// server as kubectl proxy serves it, and three memcached pods on this
// machine. In a pod, NewClient needs none of the stand-in's three
// options: its API server, the way to its pods, and a timeout (500 ms by
// default) that a busy test machine cannot miss.
func ExampleNewClient() {
	k := startCluster(3, "memcache-headless")
	defer k.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211",
		selector.WithAPIServer(k.URL), selector.WithDialContext(k.Dial), selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()

	for range 2 {
		item, err := c.Get("user:42")
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			fmt.Println("miss: load it, then Set it")
			if err := c.Set(&memcache.Item{Key: "user:42", Value: []byte("Ada"), Expiration: 300}); err != nil {
				log.Printf("set: %v", err)
			}
		case err != nil:
			log.Printf("get: %v", err)
		default:
			fmt.Printf("hit: %s\n", item.Value)
		}
	}
	fmt.Println("user:42 is on", k.Holders("user:42"))
	// Output:
	// miss: load it, then Set it
	// hit: Ada
	// user:42 is on [memcache-0 (zone-a)]
}

// A Client over fixed servers, outside Kubernetes: SetServers changes them
// later, and the Client follows. Here the servers are three memcached
// processes on this machine that the example starts.
func ExampleNewClientFromList() {
	k := startCluster(3, "memcache")
	defer k.Close()
	servers := k.LocalAddrs() // in production, say "10.0.0.1:11211", "10.0.0.2:11211", ...

	var ss selector.ServerList
	if err := ss.SetServers(servers...); err != nil {
		log.Fatal(err)
	}
	c, err := selector.NewClientFromList(&ss, selector.WithTimeout(5*time.Second)) // 500 ms by default; here, room for a busy test machine
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Set(&memcache.Item{Key: "greeting", Value: []byte("hello")}); err != nil {
		log.Fatal(err)
	}
	item, err := c.Get("greeting")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", item.Value)
	if err := c.Delete("greeting"); err != nil {
		log.Fatal(err)
	}
	_, err = c.Get("greeting")
	fmt.Println("a miss after Delete:", errors.Is(err, memcache.ErrCacheMiss))
	// Output:
	// hello
	// a miss after Delete: true
}

// A Client whose cache outlives a zone: the memcached pods spread over the
// zones, one ring per zone, each key in every zone, and reads in the
// client's own zone, failing over to the other zones on an error or a miss
// (docs/pools.md).
//
// Here against a stand-in for a cluster that the example starts: an API
// server and six memcached pods on this machine, two in each of three
// zones. In a pod, NewClient needs none of the stand-in's three
// options: its API server, the way to its pods, and a timeout (500 ms by
// default) that a busy test machine cannot miss.
func ExampleByZone() {
	k := startCluster(6, "memcache-headless")
	defer k.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// ByZone("") reads the client's zone from SELECTOR_ZONE, which the
	// pod's manifest sets (examples/kubernetes/app.yaml); here it is given.
	c, err := selector.NewClient(ctx, "memcache-headless:11211",
		selector.WithPool(selector.ByZone("zone-a").WithMissFailover()),
		selector.WithAPIServer(k.URL), selector.WithDialContext(k.Dial), selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "session:7", Value: []byte("...")}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(k.Holders("session:7")) // one pod in each zone
	// Output: [memcache-2 (zone-c) memcache-3 (zone-a) memcache-4 (zone-b)]
}

// A pool over one Service per zone (examples/kubernetes/memcached-by-zone.yaml):
// each client names its own zone's Service first.
//
// Here against a stand-in for a cluster that the example starts: an API
// server and three Services of two memcached pods each, on this machine.
// In a pod, NewClient needs none of the stand-in's three options: its API
// server, the way to its pods, and a timeout (500 ms by default) that a
// busy test machine cannot miss.
func ExampleAcrossServices() {
	k := startCluster(2, "memcache-zone-a", "memcache-zone-b", "memcache-zone-c")
	defer k.Close()

	zone := "zone-a" // in a pod: os.Getenv(selector.zoneEnv), which the downward API sets
	var others []string
	for _, z := range []string{"zone-a", "zone-b", "zone-c"} {
		if z != zone {
			others = append(others, "memcache-"+z+":11211")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-"+zone+":11211",
		selector.WithPool(selector.AcrossServices(others...)),
		selector.WithAPIServer(k.URL), selector.WithDialContext(k.Dial), selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "session:7", Value: []byte("...")}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(k.Holders("session:7")) // one pod of each Service
	// Output: [memcache-zone-a-0 (zone-a) memcache-zone-b-1 (zone-b) memcache-zone-c-1 (zone-c)]
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
// its ordinal, as the pool's list (memcache-0, memcache-1, ...) has them.
//
// Here against a stand-in for a cluster that the example starts: an API
// server and three StatefulSet pods on this machine. In a pod, NewClient
// needs none of the stand-in's three options: its API server, the way to
// its pods, and a timeout (500 ms by default) that a busy test machine
// cannot miss.
func ExampleCh3() {
	k := startCluster(3, "memcache-headless")
	defer k.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, "memcache-headless:11211", selector.WithHashing(selector.Ch3()),
		selector.WithAPIServer(k.URL), selector.WithDialContext(k.Dial), selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatalf("discovering memcached: %v", err)
	}
	defer c.Close()
	if err := c.Set(&memcache.Item{Key: "user:42", Value: []byte("Ada")}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(k.Holders("user:42")) // where mcrouter's ch3 over the same list looks
	// Output: [memcache-1 (zone-b)]
}
