// Package selectorotel reports what a k8s-memcache-selector Client and
// ServerList do through the OpenTelemetry metric API, and traces the
// Client's operations through its trace API: it is a selector.Metrics that
// records into instruments of a MeterProvider and, given a TracerProvider,
// spans.
//
//	m, err := selectorotel.New(selectorotel.Options{MeterProvider: mp, TracerProvider: tp})
//	if err != nil { ... }
//	c, err := selector.NewClient(ctx, "memcache:11211", selector.WithMetrics(m))
//
// # Traces
//
// With Options.TracerProvider, each Client operation is a span of kind
// client, a child of the span of the context it was given (the Context
// forms' ctx), named after its operation ("get", "set", "get_multi", ...)
// and with the attributes of OpenTelemetry's semantic conventions for
// database client spans: db.system.name "memcached", db.operation.name,
// server.address and server.port (the server of its last request, after
// a retry or a failover), memcache.selector.outcome (hit, miss, ok, ...,
// as the metrics'), db.operation.batch.size for a GetMulti of several
// keys. An error (not a miss, nor memcached's other answers: not stored,
// a CAS conflict) sets error.type, the status Error and an exception
// event. A GetMulti's request to each server is a span of its own under
// the operation's, named "get_multi host:port"; a GetOrLoad's load
// function runs under the GetOrLoad's span. Within an operation's span these are
// events:
//
//	memcache.selector.retry     a request failed for its server's reason and is sent again: server.*, error.type
//	memcache.selector.failover  the request goes to server.* in place of its key's server, memcache.selector.from, out
//	memcache.selector.handoff   a key missed at server.*, its server, and was read and copied from memcache.selector.from
//
// A pool's operation is one span, with its groups' servers and events (a
// pool's GetMulti has no span a server).
//
// # Metrics
//
// The instruments, named and with attributes as OpenTelemetry's semantic
// conventions have them where there is one (the database client's
// operation duration, server.address, error.type, k8s.*), and under
// memcache.selector. otherwise:
//
//	db.client.operation.duration (s)                  Client operations: db.operation.name, memcache.selector.outcome, error.type on errors
//	memcache.selector.keys ({key})                    keys read: db.operation.name, memcache.selector.result (hit, miss)
//	memcache.selector.server.errors ({error})         server.address, server.port, error.type (timeout, unreachable, broken)
//	memcache.selector.server.health_changes ({change})  server.*, memcache.selector.state (out, failing, up), memcache.selector.reason
//	memcache.selector.invalidation.keys ({key})       server.*, memcache.selector.event (logged, replayed)
//	memcache.selector.invalidation.overflows ({overflow})  server.*
//	memcache.selector.server.flushes ({flush})        server.*
//	memcache.selector.handoffs ({key})                memcache.selector.cause (read, replay), memcache.selector.result
//	memcache.selector.ring.changes ({change})         k8s.namespace.name, k8s.service.name
//	memcache.selector.ring.servers ({server})         gauge, by Service
//	memcache.selector.ring.lag (s)                    from the EndpointSlice change to the ring change
//	memcache.selector.discovery.events ({event})      k8s.*, memcache.selector.event (synced, relist, watch_restart, error, recovered)
//	memcache.selector.discovery.synced (1)            gauge: 1 once the ServerList has synced
//	memcache.selector.discovery.healthy (1)           gauge: 0 after a discovery error, 1 once the API server answers again
//
// And, for the Clients given to AddClient, summed, their moves (see
// selector.Moves and selector.MoveStats), observed at each collection:
//
//	memcache.selector.moves.moved ({key})             counter: keys moved to their new server
//	memcache.selector.moves.left ({key})              counter: keys a move left where they were (tried again later)
//	memcache.selector.moves.bytes (By)                counter: bytes of the values moved
//	memcache.selector.moves.pending ({key})           gauge: keys still to move, what a preStop hook waits for
//	memcache.selector.moves.busy (1)                  gauge: 1 while a round of moves is due, under way, or to try again
//	memcache.selector.moves.eta (s)                   gauge: how long the pending keys take at the rate moved so far (the longest Client's)
//
// Every instrument has db.system.name "memcached". A ServerList filled by
// SetServers has no k8s attributes.
package selectorotel

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	selector "github.com/kubecache/k8s-memcache-selector"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the instruments and spans: the
// meter's and the tracer's name.
const ScopeName = "github.com/kubecache/k8s-memcache-selector"

// Options configures New. The zero value is the defaults.
type Options struct {
	// MeterProvider makes the instruments; default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// DurationBuckets advises db.client.operation.duration's bucket
	// boundaries, in seconds; default DefaultDurationBuckets.
	DurationBuckets []float64
	// TracerProvider makes the spans of the Client's operations (see
	// Traces); default none: no spans, and no cost. To trace with the
	// global provider, give otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// DefaultDurationBuckets are the default boundaries of
// db.client.operation.duration: 100 µs to 2.5 s, finer than the semantic
// conventions' advice for databases, as a memcached round trip is shorter.
var DefaultDurationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Metrics records a Client's and a ServerList's events into OpenTelemetry
// instruments (see the package documentation).
type Metrics struct {
	selector.NopMetrics

	duration, lag                                                                               metric.Float64Histogram
	keys, serverErrors, health, invalidationKeys, overflows, flushes, handoffs, ring, discovery metric.Int64Counter
	servers, synced, healthy                                                                    metric.Int64Gauge

	clientsMu sync.Mutex
	clients   []*selector.Client // see AddClient

	// The attribute sets of the hot path, made once for each set of labels,
	// as the slices a variadic call would otherwise allocate.
	requestAttrs cache[reqKey, []metric.RecordOption]
	keyAttrs     cache[reqKey, []metric.AddOption]
	serverAttrs  cache[serverKey, []metric.AddOption]

	tracer     trace.Tracer // nil without Options.TracerProvider
	spanOpts   cache[string, []trace.SpanStartOption]
	spanServer cache[string, []attribute.KeyValue]
}

var _ selector.Metrics = (*Metrics)(nil)

type reqKey struct {
	op      string
	outcome selector.Outcome
}

type serverKey struct {
	addr string
	kind selector.Outcome
}

// The attributes.
var (
	system = attribute.String("db.system.name", "memcached")
	opKey  = attribute.Key("db.operation.name")
)

const prefix = "memcache.selector."

// New returns Metrics whose instruments come from o.MeterProvider.
func New(o Options) (*Metrics, error) {
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.DurationBuckets == nil {
		o.DurationBuckets = DefaultDurationBuckets
	}
	meter := o.MeterProvider.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(prefix+name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64Gauge {
		g, err := meter.Int64Gauge(prefix+name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	m := &Metrics{}
	if o.TracerProvider != nil {
		m.tracer = o.TracerProvider.Tracer(ScopeName)
	}
	var err error
	m.duration, err = meter.Float64Histogram("db.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of Client operations."), metric.WithExplicitBucketBoundaries(o.DurationBuckets...))
	errs = append(errs, err)
	m.lag, err = meter.Float64Histogram(prefix+"ring.lag", metric.WithUnit("s"),
		metric.WithDescription("From an EndpointSlice change (its last-change-trigger-time) to the ServerList's new ring."),
		metric.WithExplicitBucketBoundaries(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
	errs = append(errs, err)
	m.keys = counter("keys", "{key}", "Keys read by Get, GetAndTouch and GetMulti, hit or miss.")
	m.serverErrors = counter("server.errors", "{error}", "Requests to a server that failed for the server's reason.")
	m.health = counter("server.health_changes", "{change}", "A server out for a Client, failing but kept in by the cap on servers out, or up again.")
	m.invalidationKeys = counter("invalidation.keys", "{key}", "Keys logged for deletion at a server that missed their write, and deleted when it returned.")
	m.overflows = counter("invalidation.overflows", "{overflow}", "Invalidation logs that overflowed: the server is flushed when it returns.")
	m.flushes = counter("server.flushes", "{flush}", "Servers flushed when they returned, their invalidation log having overflowed.")
	m.handoffs = counter("handoffs", "{key}", "Keys copied to their new server from where they were.")
	m.ring = counter("ring.changes", "{change}", "Changes of a ServerList's servers.")
	m.discovery = counter("discovery.events", "{event}", "A ServerList's discovery: synced, relist, watch_restart, error, recovered.")
	m.servers = gauge("ring.servers", "{server}", "A ServerList's servers.")
	m.synced = gauge("discovery.synced", "1", "1 once a ServerList has listed its Service's endpoints and is watching them.")
	m.healthy = gauge("discovery.healthy", "1", "0 after a discovery error, 1 once the API server answers again.")
	errs = append(errs, m.observeMoves(meter))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// observeMoves makes the moves' instruments, observed from the Clients
// given to AddClient.
func (m *Metrics) observeMoves(meter metric.Meter) error {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(prefix+name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(prefix+name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	moved := counter("moves.moved", "{key}", "Keys moved to their new server after a change of servers, by the Clients given to AddClient.")
	left := counter("moves.left", "{key}", "Keys a move left where they were (a server failed, another copy was under way); tried again later.")
	bytes := counter("moves.bytes", "By", "Bytes of the values moved to their new server.")
	pending := gauge("moves.pending", "{key}", "Keys listed at servers that no longer own them and not moved yet: what a preStop hook waits for.")
	busy := gauge("moves.busy", "1", "1 while a round of moves is due, under way, or will try again the keys it left.")
	eta, err := meter.Float64ObservableGauge(prefix+"moves.eta", metric.WithUnit("s"),
		metric.WithDescription("How long the pending keys take to move at the rate the Clients have moved keys so far."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.clientsMu.Lock()
		clients := m.clients
		m.clientsMu.Unlock()
		if len(clients) == 0 {
			return nil
		}
		var nMoved, nLeft, nBytes, nPending, nBusy int64
		var secs float64
		for _, c := range clients {
			mv := c.Stats().Moves
			nMoved, nLeft, nBytes, nPending = nMoved+int64(mv.Moved), nLeft+int64(mv.Left), nBytes+mv.Bytes, nPending+int64(mv.Pending)
			if mv.Busy {
				nBusy = 1
			}
			secs = max(secs, mv.ETA().Seconds()) // the Clients move at once: done when the last is
		}
		attrs := metric.WithAttributes(system)
		o.ObserveInt64(moved, nMoved, attrs)
		o.ObserveInt64(left, nLeft, attrs)
		o.ObserveInt64(bytes, nBytes, attrs)
		o.ObserveInt64(pending, nPending, attrs)
		o.ObserveInt64(busy, nBusy, attrs)
		o.ObserveFloat64(eta, secs, attrs)
		return nil
	}, moved, left, bytes, pending, busy, eta)
	return err
}

// AddClient reports c's moves (c.Stats().Moves), summed with those of the
// other Clients added, at every collection: a pod that drains, or an
// operator, can see what is left and how long it takes. A closed Client
// keeps reporting its totals.
func (m *Metrics) AddClient(c *selector.Client) {
	m.clientsMu.Lock()
	defer m.clientsMu.Unlock()
	m.clients = append(m.clients, c)
}

// request records an operation's duration and keys (see End).
func (m *Metrics) request(e selector.RequestEvent) {
	ctx := context.Background()
	m.duration.Record(ctx, e.Duration.Seconds(), m.requestAttrs.get(reqKey{e.Op, e.Outcome}, func(k reqKey) []metric.RecordOption {
		kvs := []attribute.KeyValue{system, opKey.String(string(k.op)), attribute.String(prefix+"outcome", string(k.outcome))}
		if isError(k.outcome) {
			kvs = append(kvs, attribute.String("error.type", string(k.outcome)))
		}
		return []metric.RecordOption{metric.WithAttributes(kvs...)}
	})...)
	if e.Hits > 0 {
		m.keys.Add(ctx, int64(e.Hits), m.keyOpts(e.Op, "hit")...)
	}
	if e.Misses > 0 {
		m.keys.Add(ctx, int64(e.Misses), m.keyOpts(e.Op, "miss")...)
	}
}

func (m *Metrics) keyOpts(op string, result selector.Outcome) []metric.AddOption {
	return m.keyAttrs.get(reqKey{op, result}, func(k reqKey) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributes(system, opKey.String(string(k.op)), attribute.String(prefix+"result", string(k.outcome)))}
	})
}

// isError reports whether an outcome is an error, not one of memcached's
// answers (a miss, not stored, a CAS conflict) or a success.
func isError(o selector.Outcome) bool {
	switch o {
	case selector.OutcomeOK, selector.OutcomeHit, selector.OutcomeMiss, selector.OutcomeNotStored, selector.OutcomeCASConflict:
		return false
	}
	return true
}

// ServerError implements selector.Metrics.
func (m *Metrics) ServerError(e selector.ServerErrorEvent) {
	m.serverErrors.Add(context.Background(), 1, m.serverAttrs.get(serverKey{e.Addr, e.Kind}, func(k serverKey) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributes(append(serverKVs(k.addr), attribute.String("error.type", string(k.kind)))...)}
	})...)
}

// serverKVs returns the attributes of a server at addr, host:port.
func serverKVs(addr string) []attribute.KeyValue {
	kvs := []attribute.KeyValue{system}
	host, port, err := net.SplitHostPort(addr)
	if err != nil { // a Unix socket
		return append(kvs, attribute.String("server.address", addr))
	}
	kvs = append(kvs, attribute.String("server.address", host))
	if p, err := strconv.Atoi(port); err == nil {
		kvs = append(kvs, attribute.Int("server.port", p))
	}
	return kvs
}

// ServerHealth implements selector.Metrics.
func (m *Metrics) ServerHealth(e selector.HealthEvent) {
	m.health.Add(context.Background(), 1, metric.WithAttributes(append(serverKVs(e.Addr),
		attribute.String(prefix+"state", string(e.State)), attribute.String(prefix+"reason", e.Reason))...))
}

// Invalidation implements selector.Metrics.
func (m *Metrics) Invalidation(e selector.InvalidationEvent) {
	ctx, kvs := context.Background(), serverKVs(e.Addr)
	switch e.Kind {
	case selector.InvalidationLogged, selector.InvalidationReplayed:
		m.invalidationKeys.Add(ctx, int64(e.Keys), metric.WithAttributes(append(kvs, attribute.String(prefix+"event", string(e.Kind)))...))
	case selector.InvalidationOverflowed:
		m.overflows.Add(ctx, 1, metric.WithAttributes(kvs...))
	case selector.InvalidationFlushed:
		m.flushes.Add(ctx, 1, metric.WithAttributes(kvs...))
	}
}

// Handoff implements selector.Metrics.
func (m *Metrics) Handoff(e selector.HandoffEvent) {
	m.handoffs.Add(context.Background(), 1, metric.WithAttributes(system,
		attribute.String(prefix+"cause", string(e.Cause)), attribute.String(prefix+"result", string(e.Result))))
}

// serviceKVs returns the attributes of a ServerList's Service,
// "namespace/name", or none for "".
func serviceKVs(service string, more ...attribute.KeyValue) metric.MeasurementOption {
	kvs := []attribute.KeyValue{system}
	if ns, name, ok := strings.Cut(service, "/"); ok {
		kvs = append(kvs, attribute.String("k8s.namespace.name", ns), attribute.String("k8s.service.name", name))
	}
	return metric.WithAttributes(append(kvs, more...)...)
}

// Ring implements selector.Metrics.
func (m *Metrics) Ring(e selector.RingEvent) {
	ctx, attrs := context.Background(), serviceKVs(e.Service)
	m.ring.Add(ctx, 1, attrs)
	m.servers.Record(ctx, int64(e.Servers), attrs)
	if e.Lag > 0 {
		m.lag.Record(ctx, e.Lag.Seconds(), attrs)
	}
}

// Discovery implements selector.Metrics.
func (m *Metrics) Discovery(e selector.DiscoveryEvent) {
	ctx, attrs := context.Background(), serviceKVs(e.Service)
	m.discovery.Add(ctx, 1, serviceKVs(e.Service, attribute.String(prefix+"event", string(e.Kind))))
	switch e.Kind {
	case selector.DiscoverySynced:
		m.synced.Record(ctx, 1, attrs)
		m.healthy.Record(ctx, 1, attrs)
	case selector.DiscoveryRecovered:
		m.healthy.Record(ctx, 1, attrs)
	case selector.DiscoveryError:
		m.healthy.Record(ctx, 0, attrs)
	}
}

// cache holds the attributes of each set of labels seen, so that the hot
// path (Request, ServerError) reads a map instead of building an attribute
// set a call. It is copied on write: a new set of labels is rare, a read
// is every request.
type cache[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

func (c *cache[K, V]) get(k K, create func(K) V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	m := make(map[K]V, 1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	v := create(k)
	m[k] = v
	c.m.Store(&m)
	return v
}
