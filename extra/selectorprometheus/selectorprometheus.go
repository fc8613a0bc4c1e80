// Package selectorprometheus reports what a k8s-memcache-selector Client
// and ServerList do as Prometheus metrics: it is a selector.Metrics and a
// prometheus.Collector.
//
//	m := selectorprometheus.New(selectorprometheus.Options{})
//	prometheus.MustRegister(m)
//	c, err := selector.NewClient(ctx, "memcache:11211", selector.WithMetrics(m))
//
// The metrics, each prefixed with the namespace (default memcache_selector_):
//
//	requests_total{op,outcome}                 Client operations, by outcome (hit, miss, ok, timeout, ...)
//	request_duration_seconds{op}               their latency (histogram)
//	keys_total{op,result}                      keys read: result hit or miss (Get, GetAndTouch, GetMulti)
//	server_errors_total{server,kind}           requests to a server that failed: timeout, unreachable, broken
//	server_health_changes_total{server,state,reason}  a server out, failing (kept in), up
//	invalidation_keys_total{server,event}      keys logged for a server that missed their write, and replayed
//	invalidation_overflows_total{server}       invalidation logs that overflowed (the server will be flushed)
//	server_flushes_total{server}               servers flushed when they returned
//	handoffs_total{cause,result}               keys copied to their new server (cause read or replay)
//	ring_changes_total{service}                changes of a ServerList's servers
//	ring_servers{service}                      a ServerList's servers now
//	ring_lag_seconds{service}                  from the EndpointSlice change to the ring change (histogram)
//	discovery_events_total{service,event}      synced, relist, watch_restart, error, recovered
//	discovery_synced{service}                  1 once the ServerList has synced
//	discovery_healthy{service}                 0 after a discovery error, 1 once the API server answers again
//
// And, for the Clients given to AddClient, summed, their moves (see
// selector.Moves and selector.MoveStats), read at each scrape:
//
//	moves_moved_keys_total                     keys moved to their new server
//	moves_left_keys_total                      keys a move left where they were (tried again later)
//	moves_bytes_total                          bytes of the values moved
//	moves_pending_keys                         keys still to move: what a preStop hook waits for
//	moves_busy                                 1 while a round of moves is due, under way, or to try again
//	moves_eta_seconds                          how long the pending keys take at the rate moved so far (the longest Client's)
//
// service is "namespace/name" ("" for a ServerList filled by SetServers).
// One Metrics may serve several Clients and ServerLists: the counters add
// up, and the gauges are by service.
package selectorprometheus

import (
	"context"
	"sync"
	"sync/atomic"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configures New. The zero value is the defaults.
type Options struct {
	// Namespace prefixes every metric name; default "memcache_selector".
	Namespace string
	// ConstLabels are added to every metric, such as the cache's name.
	ConstLabels prometheus.Labels
	// DurationBuckets are request_duration_seconds' buckets; default
	// 100 µs to 2.5 s, which spans a memcached round trip on a LAN and the
	// default timeout of 500 ms.
	DurationBuckets []float64
	// LagBuckets are ring_lag_seconds' buckets; default 10 ms to 60 s.
	LagBuckets []float64
}

// DefaultDurationBuckets are the default buckets of request_duration_seconds.
var DefaultDurationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// DefaultLagBuckets are the default buckets of ring_lag_seconds.
var DefaultLagBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// Metrics records a Client's and a ServerList's events (see the package
// documentation). Register it with a prometheus.Registerer and give it to
// selector.WithMetrics. Its methods allocate nothing once a set of labels
// has been seen.
type Metrics struct {
	selector.NopMetrics

	requests, keys, serverErrors, health, invalidationKeys, overflows, flushes,
	handoffs, ringChanges, discovery *prometheus.CounterVec
	duration, lag            *prometheus.HistogramVec
	servers, synced, healthy *prometheus.GaugeVec
	requestCounters          cache[reqKey, prometheus.Counter]
	durationObservers        cache[string, prometheus.Observer]
	keyCounters              cache[reqKey, prometheus.Counter] // outcome "hit" or "miss"
	serverErrorCounters      cache[serverKey, prometheus.Counter]
	collectors               []prometheus.Collector

	moved, left, bytes, pending, busy, eta *prometheus.Desc
	clientsMu                              sync.Mutex
	clients                                []*selector.Client // see AddClient
}

var _ selector.Metrics = (*Metrics)(nil)
var _ prometheus.Collector = (*Metrics)(nil)

type reqKey struct {
	op      string
	outcome selector.Outcome
}

type serverKey struct {
	addr string
	kind selector.Outcome
}

// New returns Metrics with the given options.
func New(o Options) *Metrics {
	if o.Namespace == "" {
		o.Namespace = "memcache_selector"
	}
	if o.DurationBuckets == nil {
		o.DurationBuckets = DefaultDurationBuckets
	}
	if o.LagBuckets == nil {
		o.LagBuckets = DefaultLagBuckets
	}
	m := &Metrics{}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels}, labels)
		m.collectors = append(m.collectors, v)
		return v
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels}, labels)
		m.collectors = append(m.collectors, v)
		return v
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Name: name, Help: help, ConstLabels: o.ConstLabels, Buckets: buckets}, labels)
		m.collectors = append(m.collectors, v)
		return v
	}
	m.requests = counter("requests_total", "Client operations, by operation and outcome.", "op", "outcome")
	m.duration = histogram("request_duration_seconds", "The latency of Client operations.", o.DurationBuckets, "op")
	m.keys = counter("keys_total", "Keys read by Get, GetAndTouch and GetMulti: result hit or miss.", "op", "result")
	m.serverErrors = counter("server_errors_total", "Requests to a server that failed for the server's reason.", "server", "kind")
	m.health = counter("server_health_changes_total", "A server out for a Client, failing but kept in by the cap on servers out, or up again.", "server", "state", "reason")
	m.invalidationKeys = counter("invalidation_keys_total", "Keys logged for deletion at a server that missed their write (logged), and deleted when it returned (replayed).", "server", "event")
	m.overflows = counter("invalidation_overflows_total", "Invalidation logs that overflowed: the server is flushed when it returns.", "server")
	m.flushes = counter("server_flushes_total", "Servers flushed when they returned, their invalidation log having overflowed.", "server")
	m.handoffs = counter("handoffs_total", "Keys copied to their new server from where they were: after a change of servers (read) or back to a server that returned (replay).", "cause", "result")
	m.ringChanges = counter("ring_changes_total", "Changes of a ServerList's servers.", "service")
	m.servers = gauge("ring_servers", "A ServerList's servers.", "service")
	m.lag = histogram("ring_lag_seconds", "From an EndpointSlice change (its last-change-trigger-time) to the ServerList's new ring.", o.LagBuckets, "service")
	m.discovery = counter("discovery_events_total", "A ServerList's discovery: synced, relist, watch_restart, error, recovered.", "service", "event")
	m.synced = gauge("discovery_synced", "1 once a ServerList has listed its Service's endpoints and is watching them.", "service")
	m.healthy = gauge("discovery_healthy", "0 after a discovery error, 1 once the API server answers again.", "service")
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(o.Namespace, "", name), help, nil, o.ConstLabels)
	}
	m.moved = desc("moves_moved_keys_total", "Keys moved to their new server after a change of servers, by the Clients given to AddClient.")
	m.left = desc("moves_left_keys_total", "Keys a move left where they were (a server failed, another copy was under way); tried again later.")
	m.bytes = desc("moves_bytes_total", "Bytes of the values moved to their new server.")
	m.pending = desc("moves_pending_keys", "Keys listed at servers that no longer own them and not moved yet: what a preStop hook waits for.")
	m.busy = desc("moves_busy", "1 while a round of moves is due, under way, or will try again the keys it left.")
	m.eta = desc("moves_eta_seconds", "How long the pending keys take to move at the rate the Clients have moved keys so far.")
	return m
}

// AddClient reports c's moves (c.Stats().Moves), summed with those of the
// other Clients added, at every scrape: a pod that drains, or an operator,
// can see what is left and how long it takes. A closed Client keeps
// reporting its totals.
func (m *Metrics) AddClient(c *selector.Client) {
	m.clientsMu.Lock()
	defer m.clientsMu.Unlock()
	m.clients = append(m.clients, c)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{m.moved, m.left, m.bytes, m.pending, m.busy, m.eta} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
	m.clientsMu.Lock()
	clients := m.clients
	m.clientsMu.Unlock()
	if len(clients) == 0 {
		return
	}
	var moved, left, bytes, pending, busy, eta float64
	for _, c := range clients {
		mv := c.Stats().Moves
		moved, left, bytes, pending = moved+float64(mv.Moved), left+float64(mv.Left), bytes+float64(mv.Bytes), pending+float64(mv.Pending)
		if mv.Busy {
			busy = 1
		}
		eta = max(eta, mv.ETA().Seconds()) // the Clients move at once: done when the last is
	}
	ch <- prometheus.MustNewConstMetric(m.moved, prometheus.CounterValue, moved)
	ch <- prometheus.MustNewConstMetric(m.left, prometheus.CounterValue, left)
	ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.CounterValue, bytes)
	ch <- prometheus.MustNewConstMetric(m.pending, prometheus.GaugeValue, pending)
	ch <- prometheus.MustNewConstMetric(m.busy, prometheus.GaugeValue, busy)
	ch <- prometheus.MustNewConstMetric(m.eta, prometheus.GaugeValue, eta)
}

// End implements selector.Metrics: it counts the operation, its duration
// and its keys.
func (m *Metrics) End(_ context.Context, e selector.RequestEvent, _ error) {
	m.requestCounters.get(reqKey{e.Op, e.Outcome}, func(k reqKey) prometheus.Counter {
		return m.requests.WithLabelValues(string(k.op), string(k.outcome))
	}).Inc()
	m.durationObservers.get(e.Op, func(op string) prometheus.Observer {
		return m.duration.WithLabelValues(string(op))
	}).Observe(e.Duration.Seconds())
	if e.Hits > 0 {
		m.keyCounter(e.Op, "hit").Add(float64(e.Hits))
	}
	if e.Misses > 0 {
		m.keyCounter(e.Op, "miss").Add(float64(e.Misses))
	}
}

func (m *Metrics) keyCounter(op string, result selector.Outcome) prometheus.Counter {
	return m.keyCounters.get(reqKey{op, result}, func(k reqKey) prometheus.Counter {
		return m.keys.WithLabelValues(string(k.op), string(k.outcome))
	})
}

// ServerError implements selector.Metrics.
func (m *Metrics) ServerError(e selector.ServerErrorEvent) {
	m.serverErrorCounters.get(serverKey{e.Addr, e.Kind}, func(k serverKey) prometheus.Counter {
		return m.serverErrors.WithLabelValues(k.addr, string(k.kind))
	}).Inc()
}

// ServerHealth implements selector.Metrics.
func (m *Metrics) ServerHealth(e selector.HealthEvent) {
	m.health.WithLabelValues(e.Addr, string(e.State), e.Reason).Inc()
}

// Invalidation implements selector.Metrics.
func (m *Metrics) Invalidation(e selector.InvalidationEvent) {
	switch e.Kind {
	case selector.InvalidationLogged, selector.InvalidationReplayed:
		m.invalidationKeys.WithLabelValues(e.Addr, string(e.Kind)).Add(float64(e.Keys))
	case selector.InvalidationOverflowed:
		m.overflows.WithLabelValues(e.Addr).Inc()
	case selector.InvalidationFlushed:
		m.flushes.WithLabelValues(e.Addr).Inc()
	}
}

// Handoff implements selector.Metrics.
func (m *Metrics) Handoff(e selector.HandoffEvent) {
	m.handoffs.WithLabelValues(string(e.Cause), string(e.Result)).Inc()
}

// Ring implements selector.Metrics.
func (m *Metrics) Ring(e selector.RingEvent) {
	m.ringChanges.WithLabelValues(e.Service).Inc()
	m.servers.WithLabelValues(e.Service).Set(float64(e.Servers))
	if e.Lag > 0 {
		m.lag.WithLabelValues(e.Service).Observe(e.Lag.Seconds())
	}
}

// Discovery implements selector.Metrics.
func (m *Metrics) Discovery(e selector.DiscoveryEvent) {
	m.discovery.WithLabelValues(e.Service, string(e.Kind)).Inc()
	switch e.Kind {
	case selector.DiscoverySynced:
		m.synced.WithLabelValues(e.Service).Set(1)
		m.healthy.WithLabelValues(e.Service).Set(1)
	case selector.DiscoveryRecovered:
		m.healthy.WithLabelValues(e.Service).Set(1)
	case selector.DiscoveryError:
		m.healthy.WithLabelValues(e.Service).Set(0)
	}
}

// cache holds the metric of each set of labels seen, so that the hot path
// (Request, ServerError) reads a map instead of hashing label values into
// a slice that WithLabelValues would allocate. It is copied on write: a
// new set of labels is rare, a read is every request.
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
