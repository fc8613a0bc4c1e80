package selectorprometheus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/internal/testcluster"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newClient returns a Client from NewClient over a fake API server whose
// Service has the given servers, reporting to m.
func newClient(t *testing.T, m selector.Metrics, api *testcluster.API) *selector.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, testcluster.Addr, selector.WithAPIServer(api.URL), selector.WithMetrics(m),
		selector.WithSlog(slog.New(slog.DiscardHandler)), selector.WithTimeout(2*time.Second), selector.WithDialContext(testcluster.Dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scrape returns the text of GET /metrics from a handler of reg.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
// through a fake API server, read back by scraping /metrics.
func TestThroughClient(t *testing.T) {
	s1, s2 := testcluster.Memcached(t), testcluster.Memcached(t)
	api := testcluster.NewAPI(t, s1)
	m := New(Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	c := newClient(t, m, api)

	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("k"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("absent"); err != memcache.ErrCacheMiss {
		t.Fatalf("Get(absent): %v", err)
	}
	if items, err := c.GetMulti([]string{"k", "absent", "absent-2"}); err != nil || len(items) != 1 {
		t.Fatalf("GetMulti: %v, %v", items, err)
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP memcache_selector_requests_total Client operations, by operation and outcome.
# TYPE memcache_selector_requests_total counter
memcache_selector_requests_total{op="get",outcome="hit"} 1
memcache_selector_requests_total{op="get",outcome="miss"} 1
memcache_selector_requests_total{op="get_multi",outcome="hit"} 1
memcache_selector_requests_total{op="set",outcome="ok"} 1
# HELP memcache_selector_keys_total Keys read by Get, GetAndTouch and GetMulti: result hit or miss.
# TYPE memcache_selector_keys_total counter
memcache_selector_keys_total{op="get",result="hit"} 1
memcache_selector_keys_total{op="get",result="miss"} 1
memcache_selector_keys_total{op="get_multi",result="hit"} 1
memcache_selector_keys_total{op="get_multi",result="miss"} 2
# HELP memcache_selector_discovery_synced 1 once a ServerList has listed its Service's endpoints and is watching them.
# TYPE memcache_selector_discovery_synced gauge
memcache_selector_discovery_synced{service="default/memcache"} 1
# HELP memcache_selector_ring_servers A ServerList's servers.
# TYPE memcache_selector_ring_servers gauge
memcache_selector_ring_servers{service="default/memcache"} 1
`), "memcache_selector_requests_total", "memcache_selector_keys_total", "memcache_selector_discovery_synced", "memcache_selector_ring_servers"); err != nil {
		t.Error(err)
	}
	text := scrape(t, reg)
	for _, want := range []string{
		`memcache_selector_request_duration_seconds_count{op="get"} 2`,
		`memcache_selector_request_duration_seconds_bucket{op="set",le="+Inf"} 1`,
		`memcache_selector_discovery_events_total{event="synced",service="default/memcache"} 1`,
		`memcache_selector_discovery_healthy{service="default/memcache"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics has no %s:\n%s", want, text)
		}
	}

	// A second server, which the EndpointSlice controller saw 2 s ago.
	api.Add(s2, time.Now().Add(-2*time.Second))
	eventually(t, "the second server", func() bool { return len(c.Stats().Discovery.Servers) == 2 })
	eventually(t, "ring_servers 2", func() bool { return testutil.ToFloat64(m.servers.WithLabelValues("default/memcache")) == 2 })
	text = scrape(t, reg)
	for _, want := range []string{
		`memcache_selector_ring_changes_total{service="default/memcache"} 2`,
		`memcache_selector_ring_lag_seconds_count{service="default/memcache"} 1`,
		`memcache_selector_ring_lag_seconds_bucket{service="default/memcache",le="0.5"} 0`,
		`memcache_selector_ring_lag_seconds_bucket{service="default/memcache",le="10"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics has no %s:\n%s", want, text)
		}
	}

	// The second server dies: the Client's reads of its keys fail over, and
	// it is out (one of two: the cap allows it).
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
	if n := testutil.ToFloat64(m.serverErrors.WithLabelValues(s2.PodAddr, "unreachable")); n < 1 {
		t.Errorf("server_errors_total{server=%q,kind=unreachable} = %v, want at least 1", s2.PodAddr, n)
	}
	if n := testutil.ToFloat64(m.health.WithLabelValues(s2.PodAddr, "out", "unreachable")); n != 1 {
		t.Errorf("server_health_changes_total{server=%q,state=out,reason=unreachable} = %v, want 1", s2.PodAddr, n)
	}
	if n := testutil.ToFloat64(m.requests.WithLabelValues("get", "miss")); n != 51 {
		t.Errorf(`requests_total{op="get",outcome="miss"} = %v, want 51: the reads failed over`, n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// The moves of the Clients given to AddClient, read at each scrape: a
// second server joins, this client moves its keys there, and the metrics
// say what Stats says, with nothing pending once done.
func TestMoves(t *testing.T) {
	s1, s2 := testcluster.Memcached(t), testcluster.Memcached(t)
	var ss selector.ServerList
	if err := ss.SetServers(s1.PodAddr); err != nil {
		t.Fatal(err)
	}
	m := New(Options{})
	c, err := selector.NewClientFromList(&ss, selector.WithMetrics(m), selector.WithSlog(slog.New(slog.DiscardHandler)),
		selector.WithTimeout(2*time.Second), selector.WithDialContext(testcluster.Dial))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
	if mv.Bytes != int64(mv.Moved*len(value)) {
		t.Fatalf("MoveStats %+v: %d bytes for %d keys of %d", mv, mv.Bytes, mv.Moved, len(value))
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(fmt.Sprintf(`
# HELP memcache_selector_moves_moved_keys_total Keys moved to their new server after a change of servers, by the Clients given to AddClient.
# TYPE memcache_selector_moves_moved_keys_total counter
memcache_selector_moves_moved_keys_total %d
# HELP memcache_selector_moves_left_keys_total Keys a move left where they were (a server failed, another copy was under way); tried again later.
# TYPE memcache_selector_moves_left_keys_total counter
memcache_selector_moves_left_keys_total %d
# HELP memcache_selector_moves_bytes_total Bytes of the values moved to their new server.
# TYPE memcache_selector_moves_bytes_total counter
memcache_selector_moves_bytes_total %d
# HELP memcache_selector_moves_pending_keys Keys listed at servers that no longer own them and not moved yet: what a preStop hook waits for.
# TYPE memcache_selector_moves_pending_keys gauge
memcache_selector_moves_pending_keys 0
# HELP memcache_selector_moves_busy 1 while a round of moves is due, under way, or will try again the keys it left.
# TYPE memcache_selector_moves_busy gauge
memcache_selector_moves_busy 0
# HELP memcache_selector_moves_eta_seconds How long the pending keys take to move at the rate the Clients have moved keys so far.
# TYPE memcache_selector_moves_eta_seconds gauge
memcache_selector_moves_eta_seconds 0
`, mv.Moved, mv.Left, mv.Bytes)), "memcache_selector_moves_moved_keys_total", "memcache_selector_moves_left_keys_total",
		"memcache_selector_moves_bytes_total", "memcache_selector_moves_pending_keys", "memcache_selector_moves_busy", "memcache_selector_moves_eta_seconds"); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// The hot path allocates nothing once its labels have been seen.
func TestAllocs(t *testing.T) {
	m := New(Options{})
	ev := selector.RequestEvent{Op: "get", Outcome: selector.OutcomeHit, Duration: time.Millisecond, Hits: 1}
	se := selector.ServerErrorEvent{Addr: "10.0.0.1:11211", Kind: selector.OutcomeTimeout}
	m.End(context.Background(), ev, nil)
	m.ServerError(se)
	if n := testing.AllocsPerRun(1000, func() { m.End(context.Background(), ev, nil); m.ServerError(se) }); n != 0 {
		t.Errorf("%v allocations a Request and ServerError", n)
	}
}
