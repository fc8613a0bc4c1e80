package selectorotel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/internal/testcluster"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// reader collects the instruments' data points.
type reader struct {
	t *testing.T
	r *sdkmetric.ManualReader
}

func newMetrics(t *testing.T) (*Metrics, reader) {
	r := sdkmetric.NewManualReader()
	m, err := New(Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))})
	if err != nil {
		t.Fatal(err)
	}
	return m, reader{t, r}
}

func (r reader) metric(name string) (metricdata.Metrics, bool) {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.r.Collect(context.Background(), &rm); err != nil {
		r.t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// has reports whether set has each of kvs, given as "key=value".
func has(set attribute.Set, kvs ...string) bool {
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.Emit() != v {
			return false
		}
	}
	return true
}

// sum returns the sum of a counter's points with the attributes kvs.
func (r reader) sum(name string, kvs ...string) int64 {
	r.t.Helper()
	m, ok := r.metric(name)
	if !ok {
		return 0
	}
	var n int64
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if has(p.Attributes, kvs...) {
			n += p.Value
		}
	}
	return n
}

// gauge returns a gauge's value with the attributes kvs, or -1.
func (r reader) gauge(name string, kvs ...string) int64 {
	r.t.Helper()
	if m, ok := r.metric(name); ok {
		for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
			if has(p.Attributes, kvs...) {
				return p.Value
			}
		}
	}
	return -1
}

// histogram returns a histogram's count and sum with the attributes kvs,
// and its unit.
func (r reader) histogram(name string, kvs ...string) (count uint64, sum float64, unit string) {
	r.t.Helper()
	m, ok := r.metric(name)
	if !ok {
		return 0, 0, ""
	}
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if has(p.Attributes, kvs...) {
			count += p.Count
			sum += p.Sum
		}
	}
	return count, sum, m.Unit
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Known operations through a real Client over real memcached, discovered
// through a fake API server, read back through the SDK's ManualReader.
func TestThroughClient(t *testing.T) {
	s1, s2 := testcluster.Memcached(t), testcluster.Memcached(t)
	api := testcluster.NewAPI(t, s1)
	m, r := newMetrics(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, testcluster.Addr, selector.WithAPIServer(api.URL), selector.WithMetrics(m),
		selector.WithSlog(slog.New(slog.DiscardHandler)), selector.WithTimeout(2*time.Second), selector.WithDialContext(testcluster.Dial))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	start := time.Now()
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("k"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("absent"); err != memcache.ErrCacheMiss {
		t.Fatalf("Get(absent): %v", err)
	}
	if _, err := c.Get("a bad key"); !errors.Is(err, memcache.ErrMalformedKey) {
		t.Fatalf("Get(a bad key): %v", err)
	}
	took := time.Since(start)
	const dur = "db.client.operation.duration"
	for _, tc := range []struct {
		kvs  []string
		want uint64
	}{
		{[]string{"db.system.name=memcached", "db.operation.name=set", "memcache.selector.outcome=ok"}, 1},
		{[]string{"db.operation.name=get", "memcache.selector.outcome=hit"}, 1},
		{[]string{"db.operation.name=get", "memcache.selector.outcome=miss"}, 1},
		{[]string{"db.operation.name=get", "memcache.selector.outcome=malformed_key", "error.type=malformed_key"}, 1},
		{[]string{"db.operation.name=get"}, 3},
	} {
		if n, _, _ := r.histogram(dur, tc.kvs...); n != tc.want {
			t.Errorf("%s %v: count %d, want %d", dur, tc.kvs, n, tc.want)
		}
	}
	if n, _, _ := r.histogram(dur, "memcache.selector.outcome=miss", "error.type=miss"); n != 0 {
		t.Errorf("a miss has error.type")
	}
	if _, sum, unit := r.histogram(dur); unit != "s" || sum <= 0 || sum > took.Seconds() {
		t.Errorf("%s: unit %q, sum %v s, want s and up to %v", dur, unit, sum, took.Seconds())
	}
	if n := r.sum("memcache.selector.keys", "db.operation.name=get", "memcache.selector.result=miss"); n != 2 {
		t.Errorf("keys missed: %d, want 2", n)
	}
	svc := []string{"k8s.namespace.name=default", "k8s.service.name=memcache"}
	if n := r.gauge("memcache.selector.discovery.synced", svc...); n != 1 {
		t.Errorf("discovery.synced %d, want 1", n)
	}
	if n := r.sum("memcache.selector.discovery.events", append(svc, "memcache.selector.event=synced")...); n != 1 {
		t.Errorf("synced events %d, want 1", n)
	}

	api.Add(s2, time.Now().Add(-2*time.Second))
	eventually(t, "ring.servers 2", func() bool { return r.gauge("memcache.selector.ring.servers", svc...) == 2 })
	if n := r.sum("memcache.selector.ring.changes", svc...); n != 2 {
		t.Errorf("ring.changes %d, want 2", n)
	}
	if n, sum, unit := r.histogram("memcache.selector.ring.lag", svc...); n != 1 || sum < 1 || sum > 12 || unit != "s" {
		t.Errorf("ring.lag: %d points, sum %v %s; want 1, about 2 s", n, sum, unit)
	}

	eventually(t, "the client to route to the new server", func() bool {
		for _, st := range c.Stats().Servers {
			if st.Addr == s2.PodAddr && st.State == "up" {
				return true
			}
		}
		return false
	})
	s2.Kill()
	for i := range 50 {
		c.Get(fmt.Sprint("key-", i))
	}
	port := s2.PodAddr[strings.LastIndexByte(s2.PodAddr, ':')+1:]
	at := []string{"server.address=192.0.2.1", "server.port=" + port}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	if n := r.sum("memcache.selector.server.errors", append(at, "error.type=unreachable")...); n < 1 {
		t.Errorf("server.errors at %s: %d, want at least 1", s2.PodAddr, n)
	}
	if n := r.sum("memcache.selector.server.health_changes", append(at, "memcache.selector.state=out", "memcache.selector.reason=unreachable")...); n != 1 {
		t.Errorf("health_changes out at %s: %d, want 1", s2.PodAddr, n)
	}
}

// The moves of the Clients given to AddClient, observed at each
// collection: a second server joins, this client moves its keys there,
// and the instruments say what Stats says, with nothing pending once done.
func TestMoves(t *testing.T) {
	s1, s2 := testcluster.Memcached(t), testcluster.Memcached(t)
	var ss selector.ServerList
	if err := ss.SetServers(s1.PodAddr); err != nil {
		t.Fatal(err)
	}
	m, r := newMetrics(t)
	c, err := selector.NewClientFromList(&ss, selector.WithMetrics(m), selector.WithSlog(slog.New(slog.DiscardHandler)),
		selector.WithTimeout(2*time.Second), selector.WithDialContext(testcluster.Dial))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := r.metric("memcache.selector.moves.moved"); ok {
		t.Error("moves observed before a Client was added")
	}
	m.AddClient(c)
	value := []byte(strings.Repeat("v", 100))
	for i := range 300 {
		if err := c.Set(&memcache.Item{Key: fmt.Sprint("key-", i), Value: value}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ss.SetServers(s1.PodAddr, s2.PodAddr); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the moves", func() bool { mv := c.Stats().Moves; return mv.Moved > 0 && !mv.Busy && mv.Pending == 0 })
	mv := c.Stats().Moves
	for name, want := range map[string]int64{"moves.moved": int64(mv.Moved), "moves.left": int64(mv.Left), "moves.bytes": mv.Bytes} {
		if got := r.sum("memcache.selector."+name, "db.system.name=memcached"); got != want {
			t.Errorf("%s = %d, want %d (MoveStats %+v)", name, got, want, mv)
		}
	}
	if mv.Bytes != int64(mv.Moved*len(value)) {
		t.Errorf("MoveStats %+v: %d bytes for %d keys of %d", mv, mv.Bytes, mv.Moved, len(value))
	}
	for _, name := range []string{"moves.pending", "moves.busy"} {
		if got := r.gauge("memcache.selector."+name, "db.system.name=memcached"); got != 0 {
			t.Errorf("%s = %d, want 0 once the moves are done", name, got)
		}
	}
	eta, ok := r.metric("memcache.selector.moves.eta")
	if !ok || eta.Unit != "s" || len(eta.Data.(metricdata.Gauge[float64]).DataPoints) != 1 || eta.Data.(metricdata.Gauge[float64]).DataPoints[0].Value != 0 {
		t.Errorf("moves.eta: %+v", eta)
	}
}

// The hot path allocates nothing once its attributes have been seen.
func TestAllocs(t *testing.T) {
	m, _ := newMetrics(t)
	ev := selector.RequestEvent{Op: "get", Outcome: selector.OutcomeHit, Duration: time.Millisecond, Hits: 1}
	se := selector.ServerErrorEvent{Addr: "10.0.0.1:11211", Kind: selector.OutcomeTimeout}
	m.End(context.Background(), ev, nil)
	m.ServerError(se)
	if n := testing.AllocsPerRun(1000, func() { m.End(context.Background(), ev, nil); m.ServerError(se) }); n != 0 {
		t.Errorf("%v allocations a Request and ServerError", n)
	}
}
