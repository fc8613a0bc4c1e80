package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
	"github.com/kubecache/k8s-memcache-selector/internal/dns"
	"github.com/kubecache/k8s-memcache-selector/internal/dns/dnstest"
)

// These tests run discovery by DNS against dnstest's server on 127.0.0.1,
// UDP and TCP: every test points the resolver at it, so no query leaves
// the machine.

const (
	dnsSvc = "memcache.cache.svc.cluster.local"
	dnsSRV = "_memcache._tcp." + dnsSvc
)

// fakeDNS is a test server whose answers a test changes.
type fakeDNS struct {
	*dnstest.Server
	mu     sync.Mutex
	answer func(q dns.Question, tcp bool) dnstest.Reply
}

func newFakeDNS(t *testing.T) *fakeDNS {
	f := &fakeDNS{answer: func(dns.Question, bool) dnstest.Reply { return dnstest.Reply{RCode: dns.RCodeNXDomain} }}
	f.Server = dnstest.New(t, func(q dns.Question, tcp bool) dnstest.Reply {
		f.mu.Lock()
		h := f.answer
		f.mu.Unlock()
		return h(q, tcp)
	})
	return f
}

func (f *fakeDNS) set(h func(q dns.Question, tcp bool) dnstest.Reply) {
	f.mu.Lock()
	f.answer = h
	f.mu.Unlock()
}

// pods makes the server answer the SRV name with one target per pod
// (name -> IP, each a pod of a StatefulSet under dnsSvc), their addresses
// in the additional section, and the Service's name with their A records.
func (f *fakeDNS) pods(pods map[string]string, port uint16) {
	var srvs, as, svc []dns.Record
	for name, ip := range pods {
		target := name + "." + dnsSvc
		srvs = append(srvs, dns.Record{Name: dnsSRV, Type: dns.TypeSRV, TTL: 5, Weight: 100, Port: port, Target: target})
		as = append(as, aRecord(target, ip, 5))
		svc = append(svc, aRecord(dnsSvc, ip, 5))
	}
	f.set(func(q dns.Question, tcp bool) dnstest.Reply {
		switch {
		case q.Name == dnsSRV && q.Type == dns.TypeSRV:
			return dnstest.Reply{Answers: srvs, Additional: as}
		case q.Name == dnsSvc && q.Type == dns.TypeA:
			return dnstest.Reply{Answers: svc}
		case q.Name == dnsSvc || q.Name == dnsSRV:
			return dnstest.Reply{}
		}
		return dnstest.Reply{RCode: dns.RCodeNXDomain}
	})
}

func (f *fakeDNS) reply(r dnstest.Reply) {
	f.set(func(dns.Question, bool) dnstest.Reply { return r })
}

func aRecord(name, ip string, ttl uint32) dns.Record {
	a := netip.MustParseAddr(ip)
	t := dns.TypeA
	if a.Is6() {
		t = dns.TypeAAAA
	}
	return dns.Record{Name: name, Type: t, TTL: ttl, Addr: a}
}

// fastDNS is WithDNS at the test server, polling every 10 ms.
func fastDNS(f *fakeDNS, confirmations int) Option {
	return WithDNS(DNS{Server: f.Addr(), Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Confirmations: confirmations})
}

func startDNSList(t *testing.T, addr string, opts ...Option) (*ServerList, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ss, err := NewServerList(ctx, addr, append([]Option{quietLog, withDNSTTLCap(time.Second)}, opts...)...)
	if ss != nil {
		t.Cleanup(func() { ss.Close() })
	}
	return ss, err
}

var quietLog = WithSlog(slog.New(slog.DiscardHandler))

func withDNSTTLCap(d time.Duration) Option { return func(o *options) { o.dnsMaxTTL = d } }

func TestParseDNSTarget(t *testing.T) {
	tests := []struct {
		name, in string
		want     dnsTarget
		wantErr  string
	}{
		{name: "dns+ with a short name", in: "dns+memcache:11211", want: dnsTarget{name: "memcache", port: 11211}},
		{name: "dns+ with a full name", in: "dns+" + dnsSvc + ".:11211", want: dnsTarget{name: dnsSvc + ".", port: 11211}},
		{name: "dnssrv+", in: "dnssrv+" + dnsSRV, want: dnsTarget{name: dnsSRV, srv: true}},
		{name: "gRPC's dns:///", in: "dns:///memcache:11211", want: dnsTarget{name: "memcache", port: 11211}},
		{name: "gRPC's dns://server/", in: "dns://10.96.0.10/memcache:11211", want: dnsTarget{name: "memcache", port: 11211, server: "10.96.0.10:53"}},
		{name: "a named port", in: "dns+memcache:memcache", wantErr: "dnssrv+_memcache._tcp.memcache"},
		{name: "no port", in: "dns+memcache", wantErr: "missing port"},
		{name: "port 0", in: "dns+memcache:0", wantErr: "out of range"},
		{name: "an IP address", in: "dns+10.0.0.1:11211", wantErr: "use SetServers"},
		{name: "an SRV name with a port", in: "dnssrv+_memcache._tcp.memcache:11211", wantErr: "has no port"},
		{name: "an SRV name without _port._proto", in: "dnssrv+memcache.cache", wantErr: "an SRV name is _port._proto.host"},
		{name: "a label with a space", in: "dns+mem cache:11211", wantErr: "is not a DNS label"},
		{name: "dns: with two slashes", in: "dns://memcache:11211", wantErr: "three slashes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDNSTarget(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.want.addr = tt.in
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestDNSOptionsRefused shows the options that cannot apply with DNS
// refused, and WithDNS refused without a DNS address.
func TestDNSOptionsRefused(t *testing.T) {
	f := newFakeDNS(t)
	tests := []struct {
		name, addr string
		opts       []Option
		wantErr    string
	}{
		{"WithAPIServer", "dns+memcache:11211", []Option{WithAPIServer("https://127.0.0.1:1")}, "WithAPIServer is for discovery through the Kubernetes API"},
		{"WithLegacyEndpoints", "dnssrv+" + dnsSRV, []Option{WithLegacyEndpoints()}, "WithLegacyEndpoints is for"},
		{"ByZone", "dns+memcache:11211", []Option{WithPool(ByZone("a"))}, "ByZone needs the zones"},
		{"WithDNS without a DNS address", "memcache:11211", nil, "WithDNS is for discovery by DNS"},
		{"a server without a port", "dns+memcache:11211", []Option{WithDNS(DNS{Server: "127.0.0.1"})}, "want host:port"},
		{"a negative interval", "dns+memcache:11211", []Option{WithDNS(DNS{Server: f.Addr(), Interval: -1})}, "cannot be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]Option{WithDNS(DNS{Server: f.Addr()})}, tt.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			c, err := NewClient(ctx, tt.addr, opts...)
			if c != nil {
				c.Close()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.True(t, strings.HasPrefix(err.Error(), "selector: "), "%q has the package's prefix", err)
		})
	}
	assert.Zero(t, f.UDP.Load(), "no option error may send a query")
}

// TestDNSFollowsARecords shows a dns+ ServerList following the A records
// of a name: pods added, removed, and returning at a new IP, each change
// one publish.
func TestDNSFollowsARecords(t *testing.T) {
	f := newFakeDNS(t)
	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-1": "10.0.0.2"}, 11211)
	var changes changeLog
	ss, err := startDNSList(t, "dns+"+dnsSvc+":11211", fastDNS(f, 0), changes.option())
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:11211", "10.0.0.2:11211"}, addrs(ss))
	assert.True(t, ss.HasSynced())

	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-1": "10.0.0.2", "memcache-2": "10.0.0.3"}, 11211)
	eventually(t, "the third server", func() bool { return len(ss.Servers()) == 3 })
	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-2": "10.0.0.3"}, 11211)
	eventually(t, "the second server gone", func() bool { return len(ss.Servers()) == 2 })
	assert.Equal(t, []string{"10.0.0.1:11211", "10.0.0.3:11211"}, addrs(ss))
	eventually(t, "three changes reported", func() bool { return len(changes.all()) == 3 })
	time.Sleep(50 * time.Millisecond) // polls that change nothing report nothing
	assert.Len(t, changes.all(), 3)

	st := ss.Stats()
	assert.True(t, st.Synced)
	assert.NoError(t, st.LastError)
	assert.WithinDuration(t, time.Now(), st.LastSync, time.Second)
}

// TestDNSSRVIdentity shows that with SRV records a StatefulSet pod is
// identified by its hostname: returning at a new IP it keeps its keys, and
// no other key moves.
func TestDNSSRVIdentity(t *testing.T) {
	f := newFakeDNS(t)
	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-1": "10.0.0.2", "memcache-2": "10.0.0.3"}, 11211)
	ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 0))
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}, addrs(ss))
	before := owners(t, ss)

	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-1": "10.0.0.9", "memcache-2": "10.0.0.3"}, 11211)
	eventually(t, "memcache-1 at its new IP", func() bool { return addrs(ss)[2] == "10.0.0.9:11211" })
	after := owners(t, ss)
	for k, was := range before {
		want := was
		if was == "10.0.0.2:11211" {
			want = "10.0.0.9:11211"
		}
		require.Equal(t, want, after[k], "key %q", k)
	}
}

// TestDNSMapsAsTheWatch shows that the SRV records of a StatefulSet map
// every key as the watch of its EndpointSlices does: clients discovering
// one cache by either way share it.
func TestDNSMapsAsTheWatch(t *testing.T) {
	api := newFakeAPI(t)
	api.put(v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0"), ep("10.0.0.2").pod("memcache-1", "memcache-1"),
		ep("10.0.0.3").pod("memcache-2", "memcache-2")))
	watched := start(t, api)
	f := newFakeDNS(t)
	f.pods(map[string]string{"memcache-0": "10.0.0.1", "memcache-1": "10.0.0.2", "memcache-2": "10.0.0.3"}, 11211)
	polled, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 0))
	require.NoError(t, err)
	assert.Equal(t, owners(t, watched), owners(t, polled))
}

// owners maps 2000 keys to their servers.
func owners(t *testing.T, ss *ServerList) map[string]string {
	t.Helper()
	m := make(map[string]string, 2000)
	for i := range 2000 {
		k := fmt.Sprintf("key-%d", i)
		a, err := ss.PickServer(k)
		require.NoError(t, err)
		m[k] = a.String()
	}
	return m
}

// TestDNSConfirmations shows that answers without servers (empty, or
// NXDOMAIN) empty the servers only after the confirmations, in a row.
func TestDNSConfirmations(t *testing.T) {
	tests := []struct {
		name          string
		confirmations int
		none          dnstest.Reply
		wantEmpty     bool
	}{
		{"three empty answers", 3, dnstest.Reply{}, true},
		{"three NXDOMAINs", 3, dnstest.Reply{RCode: dns.RCodeNXDomain}, true},
		{"never, with a negative number", -1, dnstest.Reply{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDNS(t)
			f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
			ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, tt.confirmations))
			require.NoError(t, err)
			require.Len(t, ss.Servers(), 1)

			asked := f.UDP.Load()
			f.reply(tt.none)
			eventually(t, "two answers without servers", func() bool { return f.UDP.Load() >= asked+2 })
			require.Len(t, ss.Servers(), 1, "two answers without servers must not empty the servers")
			if !tt.wantEmpty {
				eventually(t, "ten answers", func() bool { return f.UDP.Load() >= asked+10 })
				assert.Len(t, ss.Servers(), 1)
				return
			}
			eventually(t, "the servers emptied", func() bool { return len(ss.Servers()) == 0 })
			assert.GreaterOrEqual(t, f.UDP.Load(), asked+3)
		})
	}
}

// TestDNSConfirmationsInARow shows an answer with servers starting the
// count over.
func TestDNSConfirmationsInARow(t *testing.T) {
	f := newFakeDNS(t)
	f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
	good := f.answer
	var n atomic.Int64
	f.set(func(q dns.Question, tcp bool) dnstest.Reply {
		if n.Add(1)%3 == 0 {
			return good(q, tcp)
		}
		return dnstest.Reply{}
	})
	ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 3))
	require.NoError(t, err)
	eventually(t, "twenty answers", func() bool { return f.UDP.Load() >= 20 })
	assert.Len(t, ss.Servers(), 1)
}

// TestDNSFailureKeepsServers shows a failing DNS server (no answer,
// SERVFAIL) keeping the servers however long it fails, in Stats and
// Metrics as the watch's errors are, and the recovery.
func TestDNSFailureKeepsServers(t *testing.T) {
	tests := []struct {
		name    string
		fail    dnstest.Reply
		wantErr []string
	}{
		{"no answer", dnstest.Reply{Drop: true}, []string{"did not answer in time", "give another with WithDNS"}},
		{"SERVFAIL", dnstest.Reply{RCode: dns.RCodeServFail}, []string{"SERVFAIL", "check that it serves this name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDNS(t)
			f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
			good := f.answer
			m := &recMetrics{}
			ss, err := startDNSList(t, "dnssrv+"+dnsSRV, WithDNS(DNS{Server: f.Addr(), Interval: 10 * time.Millisecond, Timeout: 20 * time.Millisecond}), WithMetrics(m))
			require.NoError(t, err)

			f.reply(tt.fail)
			eventually(t, "the error in Stats", func() bool { return ss.Stats().LastError != nil })
			asked := f.UDP.Load()
			eventually(t, "five more queries", func() bool { return f.UDP.Load() >= asked+5 })
			assert.Len(t, ss.Servers(), 1, "a failing DNS server must not empty the servers")
			for _, w := range tt.wantErr {
				assert.ErrorContains(t, ss.Stats().LastError, w)
			}

			f.set(good)
			eventually(t, "the recovery", func() bool {
				var ok bool
				m.read(func(m *recMetrics) {
					for _, e := range m.discovery {
						ok = ok || e.Kind == DiscoveryRecovered
					}
				})
				return ok
			})
			m.read(func(m *recMetrics) {
				kinds := map[DiscoveryKind]bool{}
				for _, e := range m.discovery {
					kinds[e.Kind] = true
					assert.Equal(t, "dnssrv+"+dnsSRV, e.Service)
				}
				assert.True(t, kinds[DiscoverySynced] && kinds[DiscoveryError], "the events: %v", kinds)
			})
			assert.True(t, ss.Stats().LastSync.After(ss.Stats().LastErrorTime))
		})
	}
}

// TestDNSResolvConf shows the default server: resolv.conf's first, with
// its search list, so that a short name is the pod's own namespace's.
func TestDNSResolvConf(t *testing.T) {
	f := newFakeDNS(t)
	f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
	_, port, _ := strings.Cut(f.Addr(), ":")
	p := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(p, []byte("search default.svc.cluster.local cache.svc.cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n"), 0o600))
	withConf := func(o *options) { o.resolvConf = p }

	// resolv.conf's port is 53, so the server's is given by a dns:// address.
	ss, err := startDNSList(t, "dns://127.0.0.1:"+port+"/memcache:11211", withConf)
	require.NoError(t, err, "an explicit server")
	assert.Empty(t, ss.Servers(), "a server given is asked the name as given, without the search list")

	c := must(dnsClient(dnsTarget{}, DNS{}, p))
	assert.Equal(t, dns.Client{Server: "127.0.0.1:53", Search: []string{"default.svc.cluster.local", "cache.svc.cluster.local"}, Ndots: 5}, c)
	c.Server = f.Addr()
	tg := must(parseDNSTarget("dnssrv+_memcache._tcp.memcache"))
	found := make(chan []discovery.Member, 1)
	src := discovery.NewDNS(discovery.DNSConfig{Target: discovery.DNSTarget{Addr: tg.addr, Name: tg.name, SRV: tg.srv}, Client: c,
		Interval: time.Hour, Log: slog.New(slog.DiscardHandler), Publish: func(ms []discovery.Member) error { found <- ms; return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); src.Run(ctx, make(chan struct{})) }()
	ms := <-found
	cancel()
	<-done
	require.Len(t, ms, 1)
	assert.Equal(t, "memcache-0:11211", ms[0].ID, "the search list found the Service in namespace cache")

	_, err = dnsClient(dnsTarget{}, DNS{}, filepath.Join(t.TempDir(), "none"))
	assert.ErrorContains(t, err, "give one with WithDNS")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestDNSClientFollows shows a Client on dnssrv+ over real memcached
// processes: it follows a server added by DNS, and keeps serving when DNS
// fails.
func TestDNSClientFollows(t *testing.T) {
	mcs := startMemcached(t, 2)
	f := newFakeDNS(t)
	srvOf := func(n int) dnstest.Reply {
		var r dnstest.Reply
		for i, m := range mcs[:n] {
			host, port, _ := strings.Cut(m.addr, ":")
			target := fmt.Sprintf("memcache-%d.%s", i, dnsSvc)
			var p uint16
			fmt.Sscan(port, &p)
			r.Answers = append(r.Answers, dns.Record{Name: dnsSRV, Type: dns.TypeSRV, TTL: 1, Port: p, Target: target})
			r.Additional = append(r.Additional, aRecord(target, host, 1))
		}
		return r
	}
	f.reply(srvOf(1))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := NewClient(ctx, "dnssrv+"+dnsSRV, fastDNS(f, 0), withDNSTTLCap(10*time.Millisecond), quietLog)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
	assert.Len(t, c.Stats().Discovery.Servers, 1)

	f.reply(srvOf(2))
	eventually(t, "the Client on two servers", func() bool { return len(c.Stats().Servers) == 2 })
	f.reply(dnstest.Reply{RCode: dns.RCodeServFail})
	eventually(t, "the failure seen", func() bool { return c.Stats().Discovery.LastError != nil })
	for i := range 50 {
		k := fmt.Sprintf("key-%d", i)
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
		it, err := c.Get(k)
		require.NoError(t, err)
		assert.Equal(t, k, string(it.Value))
	}
	assert.Len(t, c.Stats().Discovery.Servers, 2)
	assert.False(t, errors.Is(c.Stats().Discovery.LastError, dns.ErrNotFound))
}
