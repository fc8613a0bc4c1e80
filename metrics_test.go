package selector

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recMetrics records every event, for tests that check what was reported.
type recMetrics struct {
	NopMetrics
	mu           sync.Mutex
	requests     []RequestEvent
	serverErrs   []ServerErrorEvent
	health       []HealthEvent
	invalidation []InvalidationEvent
	handoffs     []HandoffEvent
	rings        []RingEvent
	discovery    []DiscoveryEvent
}

func (m *recMetrics) End(_ context.Context, e RequestEvent, _ error) {
	m.add(func() { m.requests = append(m.requests, e) })
}
func (m *recMetrics) ServerError(e ServerErrorEvent) {
	m.add(func() { m.serverErrs = append(m.serverErrs, e) })
}
func (m *recMetrics) ServerHealth(e HealthEvent) { m.add(func() { m.health = append(m.health, e) }) }
func (m *recMetrics) Invalidation(e InvalidationEvent) {
	m.add(func() { m.invalidation = append(m.invalidation, e) })
}
func (m *recMetrics) Handoff(e HandoffEvent) { m.add(func() { m.handoffs = append(m.handoffs, e) }) }
func (m *recMetrics) Ring(e RingEvent)       { m.add(func() { m.rings = append(m.rings, e) }) }
func (m *recMetrics) Discovery(e DiscoveryEvent) {
	m.add(func() { m.discovery = append(m.discovery, e) })
}
func (m *recMetrics) add(f func())               { m.mu.Lock(); f(); m.mu.Unlock() }
func (m *recMetrics) read(f func(m *recMetrics)) { m.mu.Lock(); defer m.mu.Unlock(); f(m) }
func (m *recMetrics) ringEvents() (rs []RingEvent) {
	m.read(func(m *recMetrics) { rs = slices.Clone(m.rings) })
	return
}

// discoveryKinds returns the kinds of the Discovery events so far.
func (m *recMetrics) discoveryKinds() (ks []DiscoveryKind) {
	m.read(func(m *recMetrics) {
		for _, e := range m.discovery {
			ks = append(ks, e.Kind)
		}
	})
	return ks
}

// countMetrics is the simplest useful Metrics: atomic counters, as a
// metrics library's are. The allocation tests run with it.
type countMetrics struct {
	NopMetrics
	requests, hits, misses, serverErrs atomic.Int64
	nanos                              atomic.Int64
}

func (m *countMetrics) End(_ context.Context, e RequestEvent, _ error) {
	m.requests.Add(1)
	m.hits.Add(int64(e.Hits))
	m.misses.Add(int64(e.Misses))
	m.nanos.Add(int64(e.Duration))
}

func (m *countMetrics) ServerError(ServerErrorEvent) { m.serverErrs.Add(1) }

// A ServerList from NewServerList reports its first servers, its sync, each
// change with the lag since Kubernetes saw it, and an error, the relist
// after it and the recovery.
func TestMetricsDiscovery(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	var m recMetrics
	ss := start(t, f, WithMetrics(&m))
	require.Equal(t, []RingEvent{{Service: "default/memcache", Servers: 1, Added: 1}}, m.ringEvents(), "after the first list")
	require.Equal(t, []DiscoveryKind{DiscoverySynced}, m.discoveryKinds(), "after NewServerList")

	w := f.waitWatch(1)
	b := v4("memcache-b", ep("10.0.0.2"))
	b.Metadata.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": time.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339)}
	w.apply("ADDED", b)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
	eventually(t, "the second ring event", func() bool { return len(m.ringEvents()) == 2 })
	r := m.ringEvents()[1]
	assert.Equal(t, RingEvent{Service: "default/memcache", Servers: 2, Added: 1, Lag: r.Lag}, r)
	// RFC 3339 has whole seconds: the change was 1 to 2 s ago, and seen since.
	assert.True(t, r.Lag >= time.Second && r.Lag < 2*time.Second+waitFor, "lag %v, want about 2 s", r.Lag)

	w.apply("DELETED", b)
	waitServers(t, ss, hostports("10.0.0.1")...)
	eventually(t, "the third ring event", func() bool { return len(m.ringEvents()) == 3 })
	assert.Equal(t, RingEvent{Service: "default/memcache", Servers: 1, Removed: 1}, m.ringEvents()[2], "a deletion has no trigger time")

	f.failNext("watch", fault{code: 500, reason: "InternalError", message: "etcd is down"})
	w.close()
	// The watch ended (within a second it is an error too, and backed off),
	// then the 500, then a relist that recovers.
	after500 := func() (ks []DiscoveryKind) {
		m.read(func(m *recMetrics) {
			for i, e := range m.discovery {
				var ae *APIError
				if e.Kind == DiscoveryError && errors.As(e.Err, &ae) && ae.StatusCode == 500 {
					for _, e := range m.discovery[i+1:] {
						ks = append(ks, e.Kind)
					}
				}
			}
		})
		return ks
	}
	eventually(t, "a relist and a recovery after the 500", func() bool { return len(after500()) >= 2 })
	assert.Equal(t, []DiscoveryKind{DiscoveryRelist, DiscoveryRecovered}, after500()[:2])
	assert.Equal(t, DiscoverySynced, m.discoveryKinds()[0])
	assert.Contains(t, m.discoveryKinds(), DiscoveryWatchRestart)
	assert.Equal(t, 1, ss.Stats().Relists)
	// The watch after the relist starts a moment after the recovery.
	eventually(t, "the watch after the relist", func() bool { return ss.Stats().WatchRestarts >= 2 })
}

// HasSynced and Stats().Synced agree: a ServerList without discovery is
// synced for both (Stats said it was not).
func TestSyncedAgrees(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.1:11211"))
	assert.True(t, ss.HasSynced())
	assert.True(t, ss.Stats().Synced, "Stats().Synced, as HasSynced")

	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	d := start(t, f)
	assert.True(t, d.HasSynced())
	assert.True(t, d.Stats().Synced)
}

// A Client from NewClient shows the state of its discovery.
func TestClientDiscoveryStats(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := NewClient(ctx, "memcache:11211", fakeClientOptions(t, f)...)
	require.NoError(t, err)
	defer c.Close()
	st := c.Stats().Discovery
	assert.True(t, st.Synced)
	assert.Equal(t, hostports("10.0.0.1", "10.0.0.2"), addrStrings(st.Servers))
	assert.False(t, st.LastSync.IsZero(), "LastSync")

	f.waitWatch(1).apply("ADDED", v4("memcache-b", ep("10.0.0.3")))
	eventually(t, "the new server in DiscoveryStats", func() bool { return len(c.Stats().Discovery.Servers) == 3 })
}

// A ServerList filled with SetServers reports its servers, and then their
// changes, to the Metrics of the first Client made from it.
func TestMetricsSetServers(t *testing.T) {
	var m, other recMetrics
	ss := new(ServerList)
	require.NoError(t, ss.SetServers("127.0.0.1:1", "127.0.0.1:2"))
	c, err := NewClientFromList(ss, WithMetrics(&m), WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer c.Close()
	c2, err := NewClientFromList(ss, WithMetrics(&other), WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, ss.SetServers("127.0.0.1:2", "127.0.0.1:1"))
	require.NoError(t, ss.SetServers("127.0.0.1:2", "127.0.0.1:3"))
	assert.Equal(t, []RingEvent{{Servers: 2, Added: 2}, {Servers: 2, Added: 1, Removed: 1}}, m.ringEvents())
	assert.Empty(t, other.ringEvents(), "the second Client's Metrics")
}
