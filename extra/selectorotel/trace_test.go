package selectorotel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/internal/testcluster"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracing is a Client over real memcached whose spans go to an in-memory
// exporter, as each ends.
type tracing struct {
	c        *selector.Client
	ss       *selector.ServerList
	servers  []*testcluster.Server
	spans    *tracetest.InMemoryExporter
	provider *sdktrace.TracerProvider
}

func newTracing(t *testing.T, n int) *tracing {
	tr := &tracing{ss: new(selector.ServerList), spans: tracetest.NewInMemoryExporter()}
	var addrs []string
	for range n {
		s := testcluster.Memcached(t)
		tr.servers = append(tr.servers, s)
		addrs = append(addrs, s.Addr)
	}
	if err := tr.ss.SetServers(addrs...); err != nil {
		t.Fatal(err)
	}
	tr.provider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.spans))
	t.Cleanup(func() { tr.provider.Shutdown(context.Background()) })
	m, err := New(Options{MeterProvider: sdkmetric.NewMeterProvider(), TracerProvider: tr.provider})
	if err != nil {
		t.Fatal(err)
	}
	tr.c, err = selector.NewClientFromList(tr.ss, selector.WithMetrics(m), selector.WithSlog(slog.New(slog.DiscardHandler)),
		selector.WithTimeout(2*time.Second), selector.WithMoves(selector.Moves{Rate: -1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.c.Close() })
	return tr
}

// take returns the spans ended so far, and forgets them.
func (tr *tracing) take() tracetest.SpanStubs {
	spans := tr.spans.GetSpans()
	tr.spans.Reset()
	return spans
}

// keyAt returns a key whose server is the one at addr.
func (tr *tracing) keyAt(t *testing.T, addr string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprint("key-", i)
		if a, err := tr.ss.PickServer(k); err == nil && a.String() == addr {
			return k
		}
	}
	t.Fatalf("no key at %s", addr)
	return ""
}

// attrs returns kvs as "key=value" strings, sorted.
func attrs(kvs []attribute.KeyValue) []string {
	var s []string
	for _, kv := range kvs {
		s = append(s, string(kv.Key)+"="+kv.Value.Emit())
	}
	slices.Sort(s)
	return s
}

// hostPort returns server.address and server.port of addr, as attributes.
func hostPort(addr string) []string {
	host, port, _ := strings.Cut(addr, ":")
	return []string{"server.address=" + host, "server.port=" + port}
}

// only returns the one span of spans, failing otherwise.
func only(t *testing.T, spans tracetest.SpanStubs) tracetest.SpanStub {
	t.Helper()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1: %v", len(spans), names(spans))
	}
	return spans[0]
}

func names(spans tracetest.SpanStubs) (ns []string) {
	for _, s := range spans {
		ns = append(ns, s.Name)
	}
	return ns
}

func eventNames(s tracetest.SpanStub) (ns []string) {
	for _, e := range s.Events {
		ns = append(ns, e.Name)
	}
	return ns
}

// A span per operation, of kind client, named and with attributes as the
// semantic conventions for database client spans say; a miss and
// memcached's other answers are not errors, a malformed key is.
func TestTraceOperations(t *testing.T) {
	tr := newTracing(t, 1)
	c, at := tr.c, hostPort(tr.servers[0].Addr)
	if err := c.Set(&memcache.Item{Key: "present", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	tr.take()
	for _, tc := range []struct {
		name    string
		op      func() error
		want    error // errors.Is
		span    string
		attrs   []string
		failed  bool
		noServe bool // no request sent: no server.*
	}{
		{"Get hit", func() error { _, err := c.Get("present"); return err }, nil,
			"get", []string{"db.operation.name=get", "memcache.selector.outcome=hit"}, false, false},
		{"Get miss", func() error { _, err := c.Get("absent"); return err }, memcache.ErrCacheMiss,
			"get", []string{"db.operation.name=get", "memcache.selector.outcome=miss"}, false, false},
		{"Set", func() error { return c.Set(&memcache.Item{Key: "k", Value: []byte("v")}) }, nil,
			"set", []string{"db.operation.name=set", "memcache.selector.outcome=ok"}, false, false},
		{"Add not stored", func() error { return c.Add(&memcache.Item{Key: "present", Value: []byte("v")}) }, memcache.ErrNotStored,
			"add", []string{"db.operation.name=add", "memcache.selector.outcome=not_stored"}, false, false},
		{"Delete", func() error { return c.Delete("k") }, nil,
			"delete", []string{"db.operation.name=delete", "memcache.selector.outcome=ok"}, false, false},
		{"a malformed key", func() error { _, err := c.Get("a bad key"); return err }, memcache.ErrMalformedKey,
			"get", []string{"db.operation.name=get", "memcache.selector.outcome=malformed_key", "error.type=malformed_key"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			s := only(t, tr.take())
			want := append([]string{"db.system.name=memcached"}, tc.attrs...)
			if !tc.noServe {
				want = append(want, at...)
			}
			slices.Sort(want)
			if s.Name != tc.span || s.SpanKind != trace.SpanKindClient || !slices.Equal(attrs(s.Attributes), want) {
				t.Errorf("span %q, kind %v, attributes %v; want %q, client, %v", s.Name, s.SpanKind, attrs(s.Attributes), tc.span, want)
			}
			if s.InstrumentationScope.Name != ScopeName {
				t.Errorf("scope %q, want %q", s.InstrumentationScope.Name, ScopeName)
			}
			switch {
			case tc.failed && (s.Status.Code != codes.Error || s.Status.Description != err.Error() || !slices.Equal(eventNames(s), []string{"exception"})):
				t.Errorf("status %+v, events %v; want Error %q and an exception", s.Status, eventNames(s), err)
			case !tc.failed && (s.Status.Code != codes.Unset || len(s.Events) != 0):
				t.Errorf("status %+v, events %v; want unset, none", s.Status, eventNames(s))
			}
			if s.StartTime.IsZero() || s.EndTime.Before(s.StartTime) {
				t.Errorf("span from %v to %v", s.StartTime, s.EndTime)
			}
		})
	}
}

// A GetMulti across 3 servers is a span with one span a server under it,
// each with its server, keys and time within the operation's.
func TestTraceGetMulti(t *testing.T) {
	tr := newTracing(t, 3)
	var keys []string
	for i, s := range tr.servers {
		k := tr.keyAt(t, s.Addr)
		keys = append(keys, k)
		if i > 0 { // a hit at two servers, a miss at the first
			if err := tr.c.Set(&memcache.Item{Key: k, Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys = append(keys, tr.keyAt(t, tr.servers[0].Addr)+"-") // 2 keys at one server, if it is its
	tr.take()
	items, err := tr.c.GetMulti(keys)
	if err != nil || len(items) != 2 {
		t.Fatalf("GetMulti: %d items, %v", len(items), err)
	}
	spans := tr.take()
	if len(spans) != 4 {
		t.Fatalf("spans %v, want 3 requests and the operation", names(spans))
	}
	op := spans[len(spans)-1] // the operation's span ends last
	want := []string{"db.operation.batch.size=4", "db.operation.name=get_multi", "db.system.name=memcached", "memcache.selector.outcome=hit"}
	if op.Name != "get_multi" || !slices.Equal(attrs(op.Attributes), want) {
		t.Errorf("operation span %q %v, want get_multi %v", op.Name, attrs(op.Attributes), want)
	}
	perServer := map[string]int{}
	for _, k := range keys {
		a, _ := tr.ss.PickServer(k)
		perServer[a.String()]++
	}
	var seen []string
	for _, s := range spans[:3] {
		addr := strings.TrimPrefix(s.Name, "get_multi ")
		seen = append(seen, addr)
		want := append([]string{"db.operation.name=get_multi", "db.system.name=memcached", "memcache.selector.outcome=ok"}, hostPort(addr)...)
		if n := perServer[addr]; n > 1 {
			want = append(want, fmt.Sprint("db.operation.batch.size=", n))
		}
		slices.Sort(want)
		if !slices.Equal(attrs(s.Attributes), want) || s.SpanKind != trace.SpanKindClient {
			t.Errorf("span %q: %v %v, want client %v", s.Name, s.SpanKind, attrs(s.Attributes), want)
		}
		if s.Parent.SpanID() != op.SpanContext.SpanID() || s.SpanContext.TraceID() != op.SpanContext.TraceID() {
			t.Errorf("span %q is not under the operation's", s.Name)
		}
		if s.StartTime.Before(op.StartTime) || s.EndTime.After(op.EndTime) || s.EndTime.Before(s.StartTime) {
			t.Errorf("span %q from %v to %v, outside the operation's %v to %v", s.Name, s.StartTime, s.EndTime, op.StartTime, op.EndTime)
		}
	}
	slices.Sort(seen)
	var servers []string
	for _, s := range tr.servers {
		servers = append(servers, s.Addr)
	}
	slices.Sort(servers)
	if !slices.Equal(seen, servers) {
		t.Errorf("request spans at %v, want %v", seen, servers)
	}
}

// A server killed: a Get of one of its keys is retried there, fails over
// to the next server and misses there, which its span says; with no
// server left, the span is an error.
func TestTraceFailover(t *testing.T) {
	tr := newTracing(t, 2)
	dead, next := tr.servers[0], tr.servers[1]
	key := tr.keyAt(t, dead.Addr)
	if err := tr.c.Set(&memcache.Item{Key: key, Value: []byte("v")}); err != nil { // a pooled connection, which the kill breaks
		t.Fatal(err)
	}
	dead.Kill()
	tr.take()
	if _, err := tr.c.Get(key); err != memcache.ErrCacheMiss {
		t.Fatalf("Get after a kill: %v, want a miss at the next server", err)
	}
	s := only(t, tr.take())
	if got, want := attrs(s.Attributes), append([]string{"db.operation.name=get", "db.system.name=memcached", "memcache.selector.outcome=miss"}, hostPort(next.Addr)...); !slices.Equal(got, want) {
		t.Errorf("attributes %v, want %v (the server the Get failed over to)", got, want)
	}
	if s.Status.Code != codes.Unset {
		t.Errorf("status %+v: a miss is not an error", s.Status)
	}
	evs := eventNames(s)
	if len(evs) < 2 || evs[len(evs)-1] != eventFailover || slices.ContainsFunc(evs[:len(evs)-1], func(e string) bool { return e != eventRetry }) {
		t.Fatalf("events %v, want retries, then a failover", evs)
	}
	for _, e := range s.Events[:len(s.Events)-1] {
		got := attrs(e.Attributes)
		if !slices.Contains(got, "server.address=127.0.0.1") || !slices.Contains(got, hostPort(dead.Addr)[1]) ||
			!slices.Contains(got, "error.type=unreachable") && !slices.Contains(got, "error.type=broken") {
			t.Errorf("retry %v, want at %s, unreachable or broken", got, dead.Addr)
		}
	}
	if got, want := attrs(s.Events[len(s.Events)-1].Attributes), append([]string{"memcache.selector.from=" + dead.Addr}, hostPort(next.Addr)...); !slices.Equal(got, want) {
		t.Errorf("failover %v, want %v", got, want)
	}

	next.Kill()
	tr.take()
	_, err := tr.c.Get(key)
	if !errors.Is(err, selector.ErrNoServers) {
		t.Fatalf("Get with no server: %v", err)
	}
	s = only(t, tr.take())
	if s.Status.Code != codes.Error || s.Status.Description != err.Error() || !slices.Contains(attrs(s.Attributes), "error.type=no_servers") {
		t.Errorf("status %+v, attributes %v; want Error %q, error.type=no_servers", s.Status, attrs(s.Attributes), err)
	}
	if evs := eventNames(s); !slices.Contains(evs, eventRetry) || !slices.Contains(evs, "exception") {
		t.Errorf("events %v, want a retry at the server killed, and the exception", evs)
	}
}

// A read that misses at a key's new server and finds it where it was has
// a handoff event.
func TestTraceHandoff(t *testing.T) {
	tr := newTracing(t, 2)
	was := tr.servers[0]
	var keys []string
	for i := range 200 {
		k := fmt.Sprint("h-", i)
		if a, _ := tr.ss.PickServer(k); a.String() == was.Addr {
			keys = append(keys, k)
			if err := tr.c.Set(&memcache.Item{Key: k, Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	joined := testcluster.Memcached(t)
	if err := tr.ss.SetServers(tr.servers[0].Addr, tr.servers[1].Addr, joined.Addr); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the client to route to the new server", func() bool {
		for _, st := range tr.c.Stats().Servers {
			if st.Addr == joined.Addr {
				return true
			}
		}
		return false
	})
	key := ""
	for _, k := range keys {
		if a, _ := tr.ss.PickServer(k); a.String() == joined.Addr {
			key = k
			break
		}
	}
	if key == "" {
		t.Fatal("no key moved to the new server")
	}
	tr.take()
	if _, err := tr.c.Get(key); err != nil {
		t.Fatalf("Get of a key that moved: %v", err)
	}
	s := only(t, tr.take())
	if !slices.Equal(eventNames(s), []string{eventHandoff}) {
		t.Fatalf("events %v, want a handoff", eventNames(s))
	}
	want := append([]string{"memcache.selector.from=" + was.Addr, "memcache.selector.outcome=ok"}, hostPort(joined.Addr)...)
	slices.Sort(want)
	if got := attrs(s.Events[0].Attributes); !slices.Equal(got, want) {
		t.Errorf("handoff %v, want %v", got, want)
	}
	if !slices.Contains(attrs(s.Attributes), "memcache.selector.outcome=hit") || !slices.Contains(attrs(s.Attributes), hostPort(joined.Addr)[1]) {
		t.Errorf("attributes %v, want a hit at %s", attrs(s.Attributes), joined.Addr)
	}
}

// The span of an operation given a context with a span is that span's
// child, in its trace; one given none starts a trace.
func TestTraceParent(t *testing.T) {
	tr := newTracing(t, 1)
	ctx, parent := tr.provider.Tracer("app").Start(context.Background(), "handler")
	if err := tr.c.SetContext(ctx, &memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if err := tr.c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	spans := tr.take()
	if !slices.Equal(names(spans), []string{"set", "handler", "set"}) {
		t.Fatalf("spans %v, want set, handler, set", names(spans))
	}
	child, handler, root := spans[0], spans[1], spans[2]
	if child.Parent.SpanID() != handler.SpanContext.SpanID() || child.SpanContext.TraceID() != handler.SpanContext.TraceID() {
		t.Errorf("set's parent %v in trace %v, want handler's span %v in %v", child.Parent.SpanID(), child.SpanContext.TraceID(),
			handler.SpanContext.SpanID(), handler.SpanContext.TraceID())
	}
	if root.Parent.IsValid() || root.SpanContext.TraceID() == handler.SpanContext.TraceID() {
		t.Errorf("a Set without a context is under %v, in the handler's trace", root.Parent.SpanID())
	}
}

// Without a TracerProvider, the hooks of the traces do nothing, and
// allocate nothing.
func TestTraceOff(t *testing.T) {
	m, _ := newMetrics(t)
	ctx := context.Background()
	step := selector.StepEvent{Kind: selector.StepRetry, Addr: "10.0.0.1:11211", Outcome: selector.OutcomeTimeout}
	end := selector.RequestEvent{Op: "get", Outcome: selector.OutcomeHit, Hits: 1}
	if n := testing.AllocsPerRun(1000, func() {
		if m.Begin(ctx, "get") != ctx {
			t.Fatal("Begin without a TracerProvider changed the context")
		}
		m.Step(ctx, step)
		m.End(ctx, end, nil)
	}); n != 0 {
		t.Errorf("%v allocations a Begin, Step and End without traces", n)
	}
}

// BenchmarkTrace is the cost of the traces: a Get hit and a GetMulti of 3
// keys at 3 servers through a Client with no Metrics, with the metrics
// only, with traces (every span sampled, and given to a batching
// processor whose exporter drops them), and with traces not sampled.
func BenchmarkTrace(b *testing.B) {
	var ss selector.ServerList
	var addrs []string
	for range 3 {
		addrs = append(addrs, testcluster.Memcached(b).Addr)
	}
	if err := ss.SetServers(addrs...); err != nil {
		b.Fatal(err)
	}
	var keys []string
	for _, a := range addrs {
		for i := 0; ; i++ {
			k := fmt.Sprint("bench-", i)
			if s, _ := ss.PickServer(k); s.String() == a {
				keys = append(keys, k)
				break
			}
		}
	}
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no traces
		metrics bool
	}{
		{"none", nil, false},
		{"metrics", nil, true},
		{"metrics+traces", sdktrace.AlwaysSample(), true},
		{"metrics+traces-unsampled", sdktrace.NeverSample(), true},
	} {
		opts := []selector.Option{selector.WithSlog(slog.New(slog.DiscardHandler))}
		if tc.metrics {
			o := Options{MeterProvider: sdkmetric.NewMeterProvider()}
			if tc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				defer tp.Shutdown(context.Background())
				o.TracerProvider = tp
			}
			m, err := New(o)
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, selector.WithMetrics(m))
		}
		c, err := selector.NewClientFromList(&ss, opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		for _, k := range keys {
			if err := c.Set(&memcache.Item{Key: k, Value: []byte("value")}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("Get/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Get(keys[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("GetMulti/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.GetMulti(keys); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTraceHooks is the tracer's own cost an operation, without the
// network: Begin, a Step (its server) and End, as a Get makes them.
func BenchmarkTraceHooks(b *testing.B) {
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no traces
	}{{"off", nil}, {"sampled", sdktrace.AlwaysSample()}, {"unsampled", sdktrace.NeverSample()}} {
		b.Run(tc.name, func(b *testing.B) {
			o := Options{MeterProvider: sdkmetric.NewMeterProvider()}
			if tc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				defer tp.Shutdown(context.Background())
				o.TracerProvider = tp
			}
			m, err := New(o)
			if err != nil {
				b.Fatal(err)
			}
			step := selector.StepEvent{Kind: selector.StepRequest, Addr: "10.0.0.1:11211", Outcome: selector.OutcomeOK}
			end := selector.RequestEvent{Op: "get", Outcome: selector.OutcomeHit, Hits: 1}
			b.ReportAllocs()
			for b.Loop() {
				ctx := m.Begin(context.Background(), "get")
				m.Step(ctx, step)
				m.End(ctx, end, nil)
			}
		})
	}
}
