package proxybench

import (
	"context"
	"flag"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// The impls of BenchmarkClientVsGomemcache, in the order each case measures
// them.
const (
	vsClient  = "client"             // selector.NewClientFromList, its defaults
	vsBest    = "gomemcache-best"    // memcache.New, MaxIdleConns = vsParallel
	vsDefault = "gomemcache-default" // memcache.New, MaxIdleConns = memcache.DefaultMaxIdleConns
)

var vsImpls = []string{vsClient, vsBest, vsDefault}

var vsRotate = flag.Int("proxy.vs-rotate", 0,
	"BenchmarkClientVsGomemcache measures each case's impls starting this many places into client, gomemcache-best, gomemcache-default (make bench passes the round, so that no impl always runs first)")

// vsParallel is the goroutines of the parallel cases, whatever GOMAXPROCS.
const vsParallel = 64

// vsCases are the cases of BenchmarkClientVsGomemcache: an operation and
// the goroutines that run it.
var vsCases = []struct {
	op         operation
	goroutines int
}{
	{operations[0], 1},          // get
	{operations[1], 1},          // set
	{operations[0], vsParallel}, // get
	{operations[1], vsParallel}, // set
	{operations[2], 1},          // getmulti of multiKeys
}

var vsConfigOnce sync.Once

// BenchmarkClientVsGomemcache is the Client against gomemcache's own Client
// over the same 3 real memcached servers (the shared Tier), for the goals of
// the Client's own connections: Get and Set with 1 goroutine (b.N in turn,
// in the benchmark's goroutine), Get and Set with exactly vsParallel
// goroutines (b.N split evenly among them, whatever GOMAXPROCS is), and
// GetMulti of multiKeys keys with 1 goroutine. Each case measures the
// Client with its defaults (WithTimeout aside), gomemcache with
// MaxIdleConns = vsParallel (its best: no goroutine ever waits for a dial
// once warm) and gomemcache with its default MaxIdleConns of 2, each with a
// new client, one after the other, in an order that -proxy.vs-rotate
// rotates.
//
// Metrics, besides ns/op (wall time per operation across the goroutines)
// and -benchmem's: ops/s, b.N over the elapsed time; p50-ns and p99-ns, the
// latency of one call, every call timed into a per-goroutine buffer
// allocated before the timing; conns/server, the most connections open to
// one server at once, and dials/server, the most dials to one server, both
// from the warm-up on (counted by the client's DialContext). Every client
// has a 5 s timeout, so that a slow moment on a busy machine is a slow
// sample and not an error, and every key is set through the same placement
// before the timing, so that every Get hits (a miss fails the benchmark).
func BenchmarkClientVsGomemcache(b *testing.B) {
	t, err := sharedTier()
	vsConfigOnce.Do(func() {
		// Configuration lines, for the report.
		if t != nil {
			fmt.Printf("memcached: %s\n", t.MemcachedVersion)
		}
		fmt.Printf("goroutines: %d\ngomemcache-best-max-idle-conns: %d\ngomemcache-default-max-idle-conns: %d\n",
			vsParallel, vsParallel, memcache.DefaultMaxIdleConns)
	})
	if err != nil {
		// go test shows skips only with -v: say it on stdout.
		fmt.Printf("--- NOT MEASURED: %s: %v\n", b.Name(), err)
		b.Skip(err)
	}
	order := slices.Clone(vsImpls)
	r := (*vsRotate%len(order) + len(order)) % len(order)
	order = append(order[r:], order[:r]...)
	for _, vc := range vsCases {
		for _, impl := range order {
			b.Run(fmt.Sprintf("op=%s/goroutines=%d/impl=%s", vc.op.name, vc.goroutines, impl), func(b *testing.B) {
				dc := newDialCounter(t.Servers)
				c, placement, closeClient, err := vsNewClient(t, impl, dc.dial)
				if err != nil {
					b.Fatal(err)
				}
				defer closeClient()
				if err := load(c, placement); err != nil {
					b.Fatalf("setting the keys through %s: %v", impl, err)
				}
				lat := vsRun(b, c, vc.op, vc.goroutines)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				b.ReportMetric(float64(quantile(lat, 0.50)), "p50-ns")
				b.ReportMetric(float64(quantile(lat, 0.99)), "p99-ns")
				peak, dials := dc.perServer()
				b.ReportMetric(float64(peak), "conns/server")
				b.ReportMetric(float64(dials), "dials/server")
				if n := dc.others.Load(); n > 0 {
					b.Errorf("%d dials to addresses not of the tier's servers %v", n, t.Servers)
				}
			})
		}
	}
}

// vsNewClient returns a new client of impl over t's servers that dials
// with dial; placement names the key placement it shares with load's other
// clients (BenchmarkProxy's paths), so that the keys are set once per
// placement.
func vsNewClient(t *Tier, impl string, dial func(context.Context, string, string) (net.Conn, error)) (c cache, placement string, closeClient func(), err error) {
	switch impl {
	case vsClient:
		ss := new(selector.ServerList)
		if err := ss.SetServers(t.Servers...); err != nil {
			return nil, "", nil, err
		}
		sc, err := selector.NewClientFromList(ss, selector.WithTimeout(5*time.Second), selector.WithDialContext(dial))
		if err != nil {
			return nil, "", nil, err
		}
		return sc, withClient, func() { sc.Close() }, nil
	case vsBest, vsDefault:
		mc := memcache.New(t.Servers...)
		mc.Timeout = 5 * time.Second
		mc.MaxIdleConns = memcache.DefaultMaxIdleConns
		if impl == vsBest {
			mc.MaxIdleConns = vsParallel
		}
		mc.DialContext = dial
		return mc, gomemcache, func() { mc.Close() }, nil
	}
	panic("unknown impl " + impl)
}

// vsRun warms c up with goroutines goroutines, then runs op b.N times,
// split evenly among them (in the benchmark's goroutine if there is one),
// and returns the sorted latencies of the calls.
func vsRun(b *testing.B, c cache, op operation, goroutines int) []time.Duration {
	// Warm up: every goroutine's connections dialled, before the timing.
	var wg sync.WaitGroup
	var warmErr atomic.Pointer[error]
	for g := range goroutines {
		wg.Go(func() {
			item := &memcache.Item{Value: benchValue}
			for i := range 20 {
				if err := op.do(c, g*1031+i, item); err != nil {
					warmErr.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := warmErr.Load(); err != nil {
		b.Fatalf("warm-up: %v", *err)
	}

	// lat[g] is goroutine g's share of b.N, a latency per call, allocated
	// before the timing and written by g alone.
	lat := make([][]time.Duration, goroutines)
	for g := range lat {
		n := b.N / goroutines
		if g < b.N%goroutines {
			n++
		}
		lat[g] = make([]time.Duration, n)
	}
	var failures atomic.Int64
	var firstErr atomic.Pointer[error]
	loop := func(g int) {
		l := lat[g]
		item := &memcache.Item{Value: benchValue}
		i := g * 1031 // each goroutine starts at another key
		for j := range l {
			start := time.Now()
			err := op.do(c, i+j, item)
			l[j] = time.Since(start)
			if err != nil && failures.Add(1) == 1 {
				firstErr.Store(&err)
			}
		}
	}
	b.ReportAllocs()
	if goroutines == 1 {
		b.ResetTimer()
		loop(0)
		b.StopTimer()
	} else {
		// The goroutines start before the timing and wait for it.
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				<-start
				loop(g)
			})
		}
		b.ResetTimer()
		close(start)
		wg.Wait()
		b.StopTimer()
	}
	if f := failures.Load(); f > 0 {
		b.Fatalf("%d of %d operations failed; the first: %v", f, b.N, *firstErr.Load())
	}
	all := make([]time.Duration, 0, b.N)
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	return all
}

// A dialCounter dials TCP and counts, per server, the dials and the
// connections open.
type dialCounter struct {
	servers map[string]*connCount // read-only once made
	others  atomic.Int64          // dials to any other address
	d       net.Dialer
}

type connCount struct {
	dials, open, peak atomic.Int64
}

func newDialCounter(servers []string) *dialCounter {
	dc := &dialCounter{servers: map[string]*connCount{}}
	for _, s := range servers {
		dc.servers[s] = &connCount{}
	}
	return dc
}

// dial is a DialContext: net.Dialer's, counted.
func (dc *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n := dc.servers[addr]
	if n == nil {
		dc.others.Add(1)
		return dc.d.DialContext(ctx, network, addr)
	}
	n.dials.Add(1)
	c, err := dc.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	open := n.open.Add(1)
	for p := n.peak.Load(); open > p && !n.peak.CompareAndSwap(p, open); p = n.peak.Load() {
	}
	return &countedConn{Conn: c, n: n}, nil
}

// perServer returns the most connections open to one server at once, and
// the most dials to one server.
func (dc *dialCounter) perServer() (peak, dials int64) {
	for _, n := range dc.servers {
		peak = max(peak, n.peak.Load())
		dials = max(dials, n.dials.Load())
	}
	return peak, dials
}

// countedConn counts its Close, once, in its server's open connections.
type countedConn struct {
	net.Conn
	n      *connCount
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.n.open.Add(-1)
	}
	return c.Conn.Close()
}

// TestDialCounter checks the counts of dials and open connections.
func TestDialCounter(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	addr := l.Addr().String()
	dc := newDialCounter([]string{addr, "127.0.0.1:1"})
	var conns []net.Conn
	for range 3 {
		c, err := dc.dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	conns[0].Close()
	conns[0].Close() // counted once
	c, err := dc.dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, c)
	if peak, dials := dc.perServer(); peak != 3 || dials != 4 {
		t.Errorf("perServer() = %d open at most, %d dials; want 3, 4", peak, dials)
	}
	for _, c := range conns {
		c.Close()
	}
	if n := dc.servers[addr].open.Load(); n != 0 {
		t.Errorf("%d open after closing all", n)
	}
}
