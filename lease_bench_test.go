package selector

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// The lease measurement (issue 21) runs only when asked, without -race:
//
//	go test -run '^TestLeaseMeasure$' -count 1 -v -lease.measure [-lease.json leases.json] .
var (
	leaseMeasure = flag.Bool("lease.measure", false, "run TestLeaseMeasure: GetOrLoad against plain cache-aside under a herd")
	leaseJSON    = flag.String("lease.json", "", "TestLeaseMeasure writes its results here, for internal/benchreport")
)

// leaseResult is one row of TestLeaseMeasure.
type leaseResult struct {
	Scenario string  `json:"scenario"` // "hot-key-invalidated" or "server-restarted"
	Mode     string  `json:"mode"`     // "cache-aside", "GetOrLoad", "GetOrLoad-stale"
	Loads    float64 `json:"loads"`    // database loads per invalidation, or per key of the restarted server
	P50us    float64 `json:"p50_us"`   // readers' latency
	P99us    float64 `json:"p99_us"`
	Reads    int     `json:"reads"`
	Errors   int     `json:"errors"`
}

// herdDB is the database behind the herd: a version per key, and a query
// that takes queryTime, counted per key.
type herdDB struct {
	mu      sync.Mutex
	version map[string]int
	loads   map[string]int
}

const queryTime = 2 * time.Millisecond

func (db *herdDB) load(ctx context.Context, key string) (*memcache.Item, error) {
	db.mu.Lock()
	v := db.version[key]
	db.loads[key]++
	db.mu.Unlock()
	time.Sleep(queryTime)
	return &memcache.Item{Value: fmt.Appendf(nil, "%s-v%d", key, v)}, nil
}

func (db *herdDB) update(key string) {
	db.mu.Lock()
	db.version[key]++
	db.mu.Unlock()
}

func (db *herdDB) loadsOf(keys ...string) int {
	db.mu.Lock()
	defer db.mu.Unlock()
	n := 0
	for _, k := range keys {
		n += db.loads[k]
	}
	return n
}

// readMode is how a reader reads through the cache.
type readMode struct {
	name  string
	read  func(c *Client, db *herdDB, key string) error
	inval func(c *Client, key string) error
}

var readModes = []readMode{
	{"cache-aside", func(c *Client, db *herdDB, key string) error {
		_, err := c.Get(key)
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return err
		}
		it, err := db.load(context.Background(), key)
		if err != nil {
			return err
		}
		it.Key = key
		return c.Set(it)
	}, func(c *Client, key string) error { return c.Delete(key) }},
	{"GetOrLoad", func(c *Client, db *herdDB, key string) error {
		_, err := c.GetOrLoad(context.Background(), key, LoadOptions{}, db.load)
		return err
	}, func(c *Client, key string) error { return c.Invalidate(context.Background(), key) }},
	{"GetOrLoad-stale", func(c *Client, db *herdDB, key string) error {
		_, err := c.GetOrLoad(context.Background(), key, LoadOptions{Stale: true}, db.load)
		return err
	}, func(c *Client, key string) error { return c.Invalidate(context.Background(), key) }},
}

// herd runs clients × goroutines readers of keys through m until stop is
// closed, and returns their latencies and error count.
func herd(t *testing.T, cs []*Client, goroutines int, m readMode, db *herdDB, keys []string, stop chan struct{}) (func() ([]time.Duration, int), *sync.WaitGroup) {
	var wg sync.WaitGroup
	lat := make([][]time.Duration, len(cs)*goroutines)
	var errs atomic.Int64
	for i := range lat {
		c := cs[i%len(cs)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[rng.IntN(len(keys))]
				t0 := time.Now()
				if err := m.read(c, db, k); err != nil {
					errs.Add(1)
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	return func() ([]time.Duration, int) {
		wg.Wait()
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		slices.Sort(all)
		return all, int(errs.Load())
	}, &wg
}

func pctl(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3
}

// TestLeaseMeasure measures GetOrLoad against plain cache-aside through the
// same Client (Get, load on a miss, Set; Delete on an update), with 20
// Clients of 50 goroutines each reading, and a database query of 2 ms:
// (1) one hot key, updated and invalidated 10 times, 100 ms apart: loads
// per invalidation and the readers' p50/p99; (2) 3 servers of 30 hot keys,
// one restarted empty under the load: loads per key of that server in the
// 1.5 s after.
func TestLeaseMeasure(t *testing.T) {
	if !*leaseMeasure {
		t.Skip("a measurement: run with -lease.measure")
	}
	const clients, goroutines = 20, 50
	var results []leaseResult
	for _, m := range readModes {
		ms := startMemcached(t, 1)
		cs := make([]*Client, clients)
		for i := range cs {
			cs[i], _ = newTestClient(t, addrsOf(ms), WithTimeout(time.Second), WithMaxIdleConns(8))
		}
		db := &herdDB{version: map[string]int{}, loads: map[string]int{}}
		stop := make(chan struct{})
		wait, _ := herd(t, cs, goroutines, m, db, []string{"hot"}, stop)
		time.Sleep(300 * time.Millisecond) // warm
		before := db.loadsOf("hot")
		const rounds = 10
		for range rounds {
			db.update("hot")
			if err := m.inval(cs[0], "hot"); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
				t.Errorf("%s: invalidate: %v", m.name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		loads := db.loadsOf("hot") - before
		close(stop)
		lat, errs := wait()
		r := leaseResult{Scenario: "hot-key-invalidated", Mode: m.name, Loads: float64(loads) / rounds,
			P50us: pctl(lat, .5), P99us: pctl(lat, .99), Reads: len(lat), Errors: errs}
		results = append(results, r)
		t.Logf("%-20s %-16s loads/invalidation %6.1f  p50 %7.0f µs  p99 %7.0f µs  reads %d errors %d", r.Scenario, r.Mode, r.Loads, r.P50us, r.P99us, r.Reads, r.Errors)
	}
	for _, m := range readModes {
		ms := startMemcached(t, 3)
		cs := make([]*Client, clients)
		var ss *ServerList
		for i := range cs {
			cs[i], ss = newTestClient(t, addrsOf(ms), WithTimeout(time.Second), WithMaxIdleConns(8))
		}
		keys := make([]string, 30)
		for i := range keys {
			keys[i] = fmt.Sprint("hot-", i)
		}
		var restarted []string
		for _, k := range keys {
			if a, _ := ss.PickServer(k); a.String() == ms[0].addr {
				restarted = append(restarted, k)
			}
		}
		db := &herdDB{version: map[string]int{}, loads: map[string]int{}}
		stop := make(chan struct{})
		wait, _ := herd(t, cs, goroutines, m, db, keys, stop)
		time.Sleep(500 * time.Millisecond) // warm
		before := db.loadsOf(restarted...)
		ms[0].restart()
		time.Sleep(1500 * time.Millisecond)
		loads := db.loadsOf(restarted...) - before
		close(stop)
		lat, errs := wait()
		r := leaseResult{Scenario: "server-restarted", Mode: m.name, Loads: float64(loads) / float64(len(restarted)),
			P50us: pctl(lat, .5), P99us: pctl(lat, .99), Reads: len(lat), Errors: errs}
		results = append(results, r)
		t.Logf("%-20s %-16s loads/key %6.1f (%d keys)  p50 %7.0f µs  p99 %7.0f µs  reads %d errors %d", r.Scenario, r.Mode, r.Loads, len(restarted), r.P50us, r.P99us, r.Reads, r.Errors)
	}
	if *leaseJSON != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(*leaseJSON, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
