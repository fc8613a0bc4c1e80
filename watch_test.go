package selector

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests drive NewServerList against fakeAPI (fakeapi_test.go). Unless
// a test says otherwise, the store holds EndpointSlices of Service "memcache"
// in namespace "default", and the address is "memcache:11211".

const waitFor = 10 * time.Second

// eventually polls cond until it holds, and fails the test if it does not
// within waitFor.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func withTiming(tm timing) Option { return func(o *options) { o.timing = tm } }

// withEnv replaces the environment seen by NewServerList.
func withEnv(env map[string]string) Option {
	return func(o *options) { o.getenv = func(k string) string { return env[k] } }
}

func withSADir(dir string) Option { return func(o *options) { o.saDir = dir } }

// fastTiming makes backoffs milliseconds; watches last long unless a test
// ends them.
func fastTiming() timing {
	return timing{
		WatchTimeout:  func() time.Duration { return time.Minute },
		WatchGrace:    time.Minute,
		BackoffBase:   2 * time.Millisecond,
		BackoffCap:    20 * time.Millisecond,
		BackoffReset:  time.Minute,
		ShortWatch:    500 * time.Millisecond,
		MaxRetryAfter: 2 * time.Second,
	}
}

// recLogger records log lines, and passes them to t.Log.
type recLogger struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *recLogger) Errorf(format string, args ...any) {
	l.add("ERROR " + fmt.Sprintf(format, args...))
}
func (l *recLogger) Infof(format string, args ...any) { l.add("INFO " + fmt.Sprintf(format, args...)) }

// testLog returns a ServerList log that writes to l.
func testLog(l *recLogger) *slog.Logger {
	return newLog(loggerHandler{l: l}, target{service: "memcache", namespace: "default"})
}

func (l *recLogger) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	l.t.Log(s)
}

// count returns the number of lines that contain sub.
func (l *recLogger) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func (l *recLogger) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, sub) })
}

// writeFile writes a file in a new temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// fakeOptions configures a ServerList for f: its URL, CA, token "token-1",
// fast timing, an empty environment and service account directory. Later
// options override these.
func fakeOptions(t *testing.T, f *fakeAPI, opts ...Option) []Option {
	base := []Option{WithAPIServer(f.URL), WithCAFile(f.caFile), WithTokenFile(writeFile(t, "token", "token-1\n")),
		withTiming(fastTiming()), withEnv(nil), withSADir(t.TempDir()), WithLogger(&recLogger{t: t})}
	return append(base, opts...)
}

// fakeClientOptions is fakeOptions for NewClient, followed by opts.
func fakeClientOptions(t *testing.T, f *fakeAPI, opts ...Option) []Option {
	var all []Option
	for _, o := range fakeOptions(t, f) {
		all = append(all, o)
	}
	return append(all, opts...)
}

// newServerList calls NewServerList for f, and closes the result at the end
// of the test.
func newServerList(t *testing.T, f *fakeAPI, addr string, opts ...Option) (*ServerList, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ss, err := NewServerList(ctx, addr, fakeOptions(t, f, opts...)...)
	if ss != nil {
		t.Cleanup(func() { ss.Close() })
	}
	return ss, err
}

// start is newServerList for tests that need it to succeed.
func start(t *testing.T, f *fakeAPI, opts ...Option) *ServerList {
	t.Helper()
	ss, err := newServerList(t, f, "memcache:11211", opts...)
	require.NoError(t, err, "NewServerList")
	return ss
}

func addrs(ss *ServerList) []string { return addrStrings(ss.Servers()) }

// changeLog records the server sets that WithOnChange reports.
type changeLog struct {
	mu   sync.Mutex
	sets [][]string
}

func (c *changeLog) option() Option {
	return WithOnChange(func(s []net.Addr) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.sets = append(c.sets, addrStrings(s))
	})
}

func (c *changeLog) all() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sets)
}

// last returns the last set reported, or nil.
func (c *changeLog) last() []string {
	all := c.all()
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1]
}

// servers turns "10.0.0.1" into "10.0.0.1:11211".
func hostports(ips ...string) []string {
	var as []string
	for _, ip := range ips {
		as = append(as, net.JoinHostPort(ip, "11211"))
	}
	return as
}

func waitServers(t *testing.T, ss *ServerList, want ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("servers %v (have %v)", want, addrs(ss)), func() bool { return slices.Equal(addrs(ss), want) })
}

func checkServers(t *testing.T, ss *ServerList, want ...string) {
	t.Helper()
	got := addrs(ss)
	require.True(t, slices.Equal(got, want), "servers = %v, want %v", got, want) // nil and empty are equal
}

// barrier returns once the ServerList has applied every event sent on w
// before it: it adds a marker slice and waits for it to come and go.
func barrier(t *testing.T, w *fakeWatch, ss *ServerList) {
	t.Helper()
	m := v4("marker", ep("192.0.2.1"))
	has := func() bool { return slices.Contains(addrs(ss), "192.0.2.1:11211") }
	w.apply("ADDED", m)
	eventually(t, "the marker to arrive", has)
	w.apply("DELETED", m)
	eventually(t, "the marker to leave", func() bool { return !has() })
}

func TestListThenWatch(t *testing.T) {
	f := newFakeAPI(t)
	other := v4("other-xyz", ep("10.9.9.9"))
	other.Metadata.Labels["kubernetes.io/service-name"] = "other"
	f.put(v4("memcache-abc", ep("10.0.0.2"), ep("10.0.0.1")), other)
	listRV := f.version()
	ss := start(t, f)
	checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)

	rs := f.requests()
	require.Len(t, rs, 2, "requests: want a list, then a watch")
	require.Equal(t, "list", rs[0].verb, "requests %+v: want a list, then a watch", rs)
	require.Equal(t, "watch", rs[1].verb, "requests %+v: want a list, then a watch", rs)
	for _, r := range rs {
		assert.Equal(t, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", r.path, "%s path", r.verb)
		assert.Contains(t, r.rawQuery, "labelSelector=kubernetes.io%2Fservice-name%3Dmemcache", "%s query %s: labelSelector not URL-encoded", r.verb, r.rawQuery)
		assert.Equal(t, "Bearer token-1", r.auth, "%s Authorization, want the token", r.verb)
		assert.Equal(t, "application/json", r.accept, "%s Accept, want JSON", r.verb)
		assert.Equal(t, 2, r.proto, "%s HTTP major version, want HTTP/2", r.verb)
		assert.True(t, strings.HasPrefix(r.agent, "k8s-memcache-selector"), "%s User-Agent %q, want ours", r.verb, r.agent)
	}
	assert.Equal(t, "0", rs[0].query.Get("resourceVersion"), "list resourceVersion, want 0 (from the cache)")
	w := rs[1].query
	assert.Equal(t, listRV, w.Get("resourceVersion"), "watch query %v: resourceVersion, want the list's", w)
	assert.Equal(t, "true", w.Get("allowWatchBookmarks"), "watch query %v: allowWatchBookmarks", w)
	assert.Equal(t, "60", w.Get("timeoutSeconds"), "watch query %v: timeoutSeconds", w)
	assert.Equal(t, "1", w.Get("watch"), "watch query %v: watch", w)
}

func TestWatchEvents(t *testing.T) {
	f := newFakeAPI(t)
	a := v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2"))
	f.put(a)
	ss := start(t, f)
	w := f.waitWatch(1)

	b := v4("memcache-b", ep("10.0.0.3"))
	w.apply("ADDED", b)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2", "10.0.0.3")...)

	a.Endpoints = a.Endpoints[:1]
	w.apply("MODIFIED", a)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.3")...)

	w.apply("DELETED", b)
	waitServers(t, ss, hostports("10.0.0.1")...)

	// A slice that stops matching the selector arrives as DELETED with its
	// last state, endpoints and all.
	w.apply("DELETED", a)
	waitServers(t, ss)

	assert.Len(t, f.requests("list", "watch"), 2, "requests: want the list and the one watch")
}

func TestWatchSkipsBadEvents(t *testing.T) {
	for _, tc := range []struct {
		name  string
		typ   string
		event any
	}{
		{"unknown type", "SURPRISE", v4("memcache-x", ep("10.0.0.9"))},
		{"null object", "ADDED", nil},
		{"object not an object", "ADDED", "10.0.0.9"},
		{"object without a name", "ADDED", v4("", ep("10.0.0.9"))},
		{"deleted without a name", "DELETED", v4("", ep("10.0.0.1"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			ss := start(t, f)
			w := f.waitWatch(1)

			w.send(tc.typ, tc.event)
			barrier(t, w, ss) // and the stream is still open
			checkServers(t, ss, hostports("10.0.0.1")...)
			assert.Len(t, f.requests("list", "watch"), 2, "requests: want the list and the one watch")
		})
	}
}

// A clean close resumes from the last resource version seen, without a list.
func TestRewatchFromLastResourceVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(w *fakeWatch) (rv string)
	}{
		{"after an event", func(w *fakeWatch) string {
			s := v4("memcache-b", ep("10.0.0.2"))
			w.apply("ADDED", s)
			return s.Metadata.ResourceVersion
		}},
		{"after a bookmark", func(w *fakeWatch) string { return w.bookmark() }},
		{"after an event and a bookmark", func(w *fakeWatch) string {
			w.apply("ADDED", v4("memcache-b", ep("10.0.0.2")))
			return w.bookmark()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			start(t, f)
			w := f.waitWatch(1)
			rv := tc.send(w)
			w.close()

			f.waitWatch(2)
			rs := f.requests("list", "watch")
			require.Len(t, rs, 3, "requests: want list, watch, watch")
			require.Equal(t, "watch", rs[2].verb, "requests %+v: want list, watch, watch", rs)
			assert.Equal(t, rv, rs[2].query.Get("resourceVersion"), "second watch's resourceVersion")
		})
	}
}

// An expired resource version, in the stream or in the answer to a request,
// makes the watcher list again from the latest state (resourceVersion ""),
// keeping its servers meanwhile.
func TestRelistWhenExpired(t *testing.T) {
	gone := fault{code: 410, reason: "Gone", message: "too old resource version: 3 (40)"}
	tooLargeByMessage := fault{code: 504, reason: "Timeout", message: "Too large resource version: 99, current: 40"}
	atWatchStart := func(ft fault) func(f *fakeAPI, w *fakeWatch) {
		return func(f *fakeAPI, w *fakeWatch) {
			f.failNext("watch", ft)
			w.bookmark()
			w.close()
		}
	}
	for _, tc := range []struct {
		name    string
		trigger func(f *fakeAPI, w *fakeWatch)
	}{
		{"ERROR 410 Expired in the stream", func(f *fakeAPI, w *fakeWatch) { w.send("ERROR", expiredFault.status()) }},
		{"ERROR 410 Gone in the stream", func(f *fakeAPI, w *fakeWatch) { w.send("ERROR", gone.status()) }},
		{"HTTP 410 Expired on watch start", atWatchStart(expiredFault)},
		{"HTTP 410 Gone on watch start", atWatchStart(gone)},
		{"504 ResourceVersionTooLarge on watch start", atWatchStart(tooLargeRV)},
		{"504 too large resource version message on watch start", atWatchStart(tooLargeByMessage)},
		{"ERROR ResourceVersionTooLarge in the stream", func(f *fakeAPI, w *fakeWatch) { w.send("ERROR", tooLargeRV.status()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			b := v4("memcache-b", ep("10.0.0.2"))
			f.put(v4("memcache-a", ep("10.0.0.1")), b)
			ss := start(t, f)
			w := f.waitWatch(1)

			// Changes the watcher misses: the relist must replace its state.
			f.remove(b)
			f.put(v4("memcache-c", ep("10.0.0.3")))
			release := f.hold("list")
			tc.trigger(f, w)

			lists := f.waitRequests("list", 2)
			q := lists[1].query
			assert.True(t, q.Has("resourceVersion") && q.Get("resourceVersion") == "", "relist query %s, want resourceVersion= (the latest)", lists[1].rawQuery)
			checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
			latest := f.version()
			release()
			waitServers(t, ss, hostports("10.0.0.1", "10.0.0.3")...)
			assert.Equal(t, latest, f.waitWatch(2).query.Get("resourceVersion"), "watch after relist: resourceVersion, want the relist's")
		})
	}
}

// The first list may fail as expired too; the watcher relists at once from
// the latest state.
func TestRelistWhenListExpired(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	f.failNext("list", expiredFault)
	ss := start(t, f)
	checkServers(t, ss, hostports("10.0.0.1")...)
	lists := f.requests("list")
	assert.True(t, len(lists) == 2 && lists[0].query.Get("resourceVersion") == "0" && lists[1].query.Has("resourceVersion") && lists[1].query.Get("resourceVersion") == "",
		"lists %+v, want resourceVersion 0, then resourceVersion=", lists)
}

// A watch that ends at once with no events is an error: the watcher backs off
// instead of reconnecting in a hot loop, and resumes without relisting.
func TestShortWatchBacksOff(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	f.set(func(f *fakeAPI) { f.emptyWatches = true })
	listRV := f.version()
	tm := fastTiming()
	tm.BackoffBase, tm.BackoffCap = 10*time.Millisecond, 100*time.Millisecond
	ss := start(t, f, withTiming(tm))

	// Backing off, the sleeps are at least 10, 20, 40, 80, 100, 100 ms: at
	// most 6 watches in 300 ms. A hot loop makes hundreds.
	n0 := len(f.requests("watch"))
	time.Sleep(300 * time.Millisecond)
	n := len(f.requests("watch")) - n0
	assert.GreaterOrEqual(t, n, 1, "watches in 300ms, want 1 to 8")
	assert.LessOrEqual(t, n, 8, "watches in 300ms, want 1 to 8")
	for _, r := range f.requests("watch") {
		assert.Equal(t, listRV, r.query.Get("resourceVersion"), "watch from resourceVersion, want the list's")
	}
	assert.Len(t, f.requests("list"), 1, "lists")
	checkServers(t, ss, hostports("10.0.0.1")...)
}

// A watch on a connection that has silently died ends at the client's
// deadline (timeoutSeconds plus grace), and the watcher resumes.
func TestDeadStreamTimesOut(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	tm := fastTiming()
	tm.WatchTimeout = func() time.Duration { return 100 * time.Millisecond }
	tm.WatchGrace = 100 * time.Millisecond
	tm.ShortWatch = 10 * time.Millisecond
	ss := start(t, f, withTiming(tm))

	w1 := f.waitWatch(1) // the fake never ends it
	f.waitWatch(2)
	select {
	case <-w1.gone:
	default:
		assert.Fail(t, "the client started a new watch without ending the dead one")
	}
	ws := f.requests("watch")
	// The client's 200ms deadline starts a little before the fake sees the
	// request.
	assert.GreaterOrEqual(t, ws[1].at.Sub(ws[0].at), 150*time.Millisecond, "second watch after the first, want about the 200ms deadline")
	assert.Equal(t, "1", ws[0].query.Get("timeoutSeconds"), "watches %v then %v: timeoutSeconds", ws[0].query, ws[1].query)
	assert.Equal(t, ws[0].query.Get("resourceVersion"), ws[1].query.Get("resourceVersion"), "watches %v then %v, want the same resourceVersion", ws[0].query, ws[1].query)
	assert.Len(t, f.requests("list"), 1, "lists")
	checkServers(t, ss, hostports("10.0.0.1")...)
}

// An endpoint moving from slice A to slice B shows up in B before it leaves
// A; it must never leave the ring.
func TestEndpointMovesBetweenSlices(t *testing.T) {
	f := newFakeAPI(t)
	var changes changeLog
	a, b := v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")), v4("memcache-b", ep("10.0.0.3"))
	f.put(a, b)
	ss := start(t, f, changes.option())
	w := f.waitWatch(1)
	all := hostports("10.0.0.1", "10.0.0.2", "10.0.0.3")

	b.Endpoints = append(b.Endpoints, ep("10.0.0.2"))
	w.apply("MODIFIED", b)
	barrier(t, w, ss)
	checkServers(t, ss, all...)

	a.Endpoints = a.Endpoints[:1]
	w.apply("MODIFIED", a)
	barrier(t, w, ss)
	checkServers(t, ss, all...)

	for _, set := range changes.all() {
		assert.Contains(t, set, "10.0.0.2:11211", "10.0.0.2 left the ring: servers %v", set)
	}
}

func TestSliceUnion(t *testing.T) {
	v6 := func(name string, eps ...fakeEndpoint) *fakeSlice { return slice(name, "IPv6", memcachePort, eps...) }
	for _, tc := range []struct {
		name   string
		slices []*fakeSlice
		opts   []Option
		want   []string
	}{
		{"duplicates across slices count once",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1")), v4("memcache-b", ep("10.0.0.1"), ep("10.0.0.2"))},
			nil, hostports("10.0.0.1", "10.0.0.2")},
		{"dual-stack takes IPv4 by default",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("m-0", ""), ep("10.0.0.2").pod("m-1", "")),
				v6("memcache-b", ep("fd00::1").pod("m-0", ""), ep("fd00::2").pod("m-1", ""))},
			nil, hostports("10.0.0.1", "10.0.0.2")},
		{"dual-stack with WithIPFamily IPv6",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("m-0", ""), ep("10.0.0.2").pod("m-1", "")),
				v6("memcache-b", ep("fd00::1").pod("m-0", ""), ep("fd00::2").pod("m-1", ""))},
			[]Option{WithIPFamily("IPv6")}, hostports("fd00::1", "fd00::2")},
		{"IPv6-only Service",
			[]*fakeSlice{v6("memcache-b", ep("fd00::1"), ep("fd00::2"))},
			nil, hostports("fd00::1", "fd00::2")},
		{"same address under two identities counts once", // a mirrored slice without targetRef
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1")), v4("memcache-b", fakeEndpoint{Addresses: []string{"10.0.0.1"}})},
			nil, hostports("10.0.0.1")},
		{"FQDN slices are ignored",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1")), slice("memcache-f", "FQDN", memcachePort, ep("memcache-0.example.com"), ep("10.0.0.9"))},
			nil, hostports("10.0.0.1")},
		{"addresses that are not IPs are skipped",
			[]*fakeSlice{v4("memcache-a", ep(""), ep("not-an-ip"), ep("10.0.0.300")), slice("memcache-b", "IPv6", memcachePort, ep("fd00::zz"))},
			nil, nil},
		{"only the first address of an endpoint",
			[]*fakeSlice{v4("memcache-a", fakeEndpoint{Addresses: []string{"10.0.0.1", "10.0.0.7"}})},
			nil, hostports("10.0.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			for _, s := range tc.slices {
				f.put(s)
			}
			ss := start(t, f, tc.opts...)
			checkServers(t, ss, tc.want...)
		})
	}
}

// An address listed twice under two identities (one slice with the pod, a
// mirrored one without) is one server with one server's share of the keys.
func TestDuplicateAddressWeighsOnce(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")), v4("memcache-b", fakeEndpoint{Addresses: []string{"10.0.0.1"}}, ep("10.0.0.2")))
	ss := start(t, f)
	checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
	n := 0
	for i := range 10000 {
		if a, _ := ss.PickServer(fmt.Sprint("key-", i)); a.String() == "10.0.0.1:11211" {
			n++
		}
	}
	assert.InDelta(t, 5000, n, 1000, "keys of 10000 that 10.0.0.1 owns, want about half")
}

// Only ready endpoints are servers: ready, serving and not terminating, a
// missing condition counting as ready, serving, not terminating. Those that
// are terminating and say they still serve drain: no servers, but the
// Client reads them for a handoff.
func TestEndpointConditions(t *testing.T) {
	yes, no := ptr(true), ptr(false)
	cases := []struct {
		name        string
		ep          func(ip string) fakeEndpoint
		want, drain bool
	}{
		{"ready", ep, true, false},
		{"no conditions", func(ip string) fakeEndpoint { return ep(ip).cond(nil, nil, nil) }, true, false},
		{"ready, others missing", func(ip string) fakeEndpoint { return ep(ip).cond(yes, nil, nil) }, true, false},
		{"ready missing, serving", func(ip string) fakeEndpoint { return ep(ip).cond(nil, yes, no) }, true, false},
		{"not ready", func(ip string) fakeEndpoint { return ep(ip).cond(no, no, no) }, false, false},
		{"not ready, others missing", func(ip string) fakeEndpoint { return ep(ip).cond(no, nil, nil) }, false, false},
		{"ready missing, not serving", func(ip string) fakeEndpoint { return ep(ip).cond(nil, no, nil) }, false, false},
		{"terminating, still serving", func(ip string) fakeEndpoint { return ep(ip).cond(no, yes, yes) }, false, true},
		{"terminating, no longer serving", func(ip string) fakeEndpoint { return ep(ip).cond(no, no, yes) }, false, false},
		{"terminating, others missing", func(ip string) fakeEndpoint { return ep(ip).cond(nil, nil, yes) }, false, false},
		// publishNotReadyAddresses makes ready always true.
		{"publishNotReadyAddresses, pod not ready", func(ip string) fakeEndpoint { return ep(ip).cond(yes, no, no) }, false, false},
		{"publishNotReadyAddresses, pod terminating", func(ip string) fakeEndpoint { return ep(ip).cond(yes, yes, yes) }, false, true},
	}
	f := newFakeAPI(t)
	var eps []fakeEndpoint
	for i, tc := range cases {
		eps = append(eps, tc.ep(fmt.Sprintf("10.0.0.%d", i+1)))
	}
	// Addresses that are not IPs never become servers, whatever the conditions.
	eps = append(eps, ep(""), ep("not-an-ip"), ep("10.0.0.300"), fakeEndpoint{})
	f.put(v4("memcache-a", eps...))
	ss := start(t, f)
	got := addrs(ss)
	drain := ss.drainingSet()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := fmt.Sprintf("10.0.0.%d:11211", i+1)
			assert.Equal(t, tc.want, slices.Contains(got, addr), "%s in servers %v", addr, got)
			assert.Equal(t, tc.drain, slices.Contains(drain, addr), "%s in draining %v", addr, drain)
		})
	}
	for _, a := range got {
		assert.True(t, strings.HasPrefix(a, "10.0.0.") && !strings.HasPrefix(a, ":"), "server %q from an invalid address", a)
	}
}

func TestPorts(t *testing.T) {
	named := func(name string, n int32, eps ...fakeEndpoint) *fakeSlice {
		return slice("memcache-"+name, "IPv4", []fakePort{tcp(name, n)}, eps...)
	}
	for _, tc := range []struct {
		name    string
		addr    string
		slices  []*fakeSlice
		want    []string
		wantErr []string // in NewServerList's error
	}{
		{"numeric target port", "memcache:11211",
			[]*fakeSlice{named("memcache", 11211, ep("10.0.0.1"))}, []string{"10.0.0.1:11211"}, nil},
		{"named port", "memcache:memcache",
			[]*fakeSlice{named("memcache", 11211, ep("10.0.0.1"))}, []string{"10.0.0.1:11211"}, nil},
		{"named port resolved per slice", "memcache:memcache",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{tcp("memcache", 11211)}, ep("10.0.0.1")),
				slice("memcache-b", "IPv4", []fakePort{tcp("memcache", 11311)}, ep("10.0.0.2"))},
			[]string{"10.0.0.1:11211", "10.0.0.2:11311"}, nil},
		{"numeric port among several", "memcache:11211",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{tcp("metrics", 9150), tcp("memcache", 11211)}, ep("10.0.0.1"))},
			[]string{"10.0.0.1:11211"}, nil},
		{"unnamed port of a one-port Service", "memcache:11211",
			[]*fakeSlice{named("", 11211, ep("10.0.0.1"))}, []string{"10.0.0.1:11211"}, nil},
		{"protocol missing means TCP", "memcache:11211",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{{Name: ptr("memcache"), Port: ptr(int32(11211))}}, ep("10.0.0.1"))},
			[]string{"10.0.0.1:11211"}, nil},
		{"port-less slice takes a numeric port", "memcache:11211",
			[]*fakeSlice{slice("memcache-a", "IPv4", nil, ep("10.0.0.1"))}, []string{"10.0.0.1:11211"}, nil},
		{"port-less slice with a named port", "memcache:memcache",
			[]*fakeSlice{slice("memcache-a", "IPv4", nil, ep("10.0.0.1"))}, nil,
			[]string{`no TCP port "memcache"`, "has ports none"}},
		{"mismatch names the ports there are", "memcache:11212",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{tcp("memcache", 11211), tcp("", 9150)}, ep("10.0.0.1"))}, nil,
			[]string{"service default/memcache has no TCP port 11212", "memcache-a has ports memcache=11211/TCP, \"\"=9150/TCP", "targetPort"}},
		{"UDP port does not match", "memcache:11211",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{{Name: ptr("memcache"), Port: ptr(int32(11211)), Protocol: ptr("UDP")}}, ep("10.0.0.1"))}, nil,
			[]string{"no TCP port 11211", "memcache=11211/UDP"}},
		{"port without a number does not match", "memcache:memcache",
			[]*fakeSlice{slice("memcache-a", "IPv4", []fakePort{{Name: ptr("memcache")}}, ep("10.0.0.1"))}, nil,
			[]string{`no TCP port "memcache"`}},
		{"a slice without the port is skipped, others count", "memcache:11211",
			[]*fakeSlice{named("memcache", 11211, ep("10.0.0.1")), named("old", 11311, ep("10.0.0.2"))},
			[]string{"10.0.0.1:11211"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			for _, s := range tc.slices {
				f.put(s)
			}
			ss, err := newServerList(t, f, tc.addr)
			if tc.wantErr != nil {
				if err == nil { // guarded: on an error ss is nil, and addrs(ss) would panic
					require.Fail(t, "NewServerList succeeded, want an error", "servers %v", addrs(ss))
				}
				assert.ErrorIs(t, err, errNoPort)
				for _, s := range tc.wantErr {
					assert.ErrorContains(t, err, s)
				}
				return
			}
			require.NoError(t, err)
			checkServers(t, ss, tc.want...)
		})
	}
}

// A StatefulSet pod's identity is its hostname: when it comes back with a new
// IP, its keys go to the new IP and no other key moves.
func TestStatefulSetPodKeepsKeys(t *testing.T) {
	f := newFakeAPI(t)
	s := v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0"),
		ep("10.0.0.2").pod("memcache-1", "memcache-1"), ep("10.0.0.3").pod("memcache-2", "memcache-2"))
	f.put(s)
	ss := start(t, f)
	before := map[string]string{}
	for i := range 1000 {
		k := fmt.Sprint("key-", i)
		a, err := ss.PickServer(k)
		require.NoError(t, err)
		before[k] = a.String()
	}

	s.Endpoints[1] = ep("10.0.0.9").pod("memcache-1", "memcache-1")
	f.waitWatch(1).apply("MODIFIED", s)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.3", "10.0.0.9")...)
	for k, old := range before {
		want := old
		if old == "10.0.0.2:11211" {
			want = "10.0.0.9:11211"
		}
		a, _ := ss.PickServer(k)
		require.Equal(t, want, a.String(), "key %s moved from %s", k, old)
	}
}

// No error empties the ring: a failing or unreachable API server leaves the
// servers as they were.
func TestErrorsKeepServers(t *testing.T) {
	t.Run("server errors", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
		ss := start(t, f)
		w := f.waitWatch(1)

		f.failAll(&serverError)
		w.bookmark()
		w.close()
		eventually(t, "three failed requests", func() bool {
			n := 0
			for _, r := range f.requests() {
				if r.code == 500 {
					n++
				}
			}
			return n >= 3
		})
		checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)

		f.failAll(nil)
		f.waitWatch(2)
		checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
	})
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
		log := &recLogger{t: t}
		ss := start(t, f, WithLogger(log))
		barrier(t, f.waitWatch(1), ss) // events, so that the watch does not end as a short one

		addr := f.Listener.Addr().String()
		f.Listener.Close()
		f.CloseClientConnections()
		eventually(t, "a connection refused error", func() bool { return log.has("connection refused") })
		checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)

		// Back on the same address, the watch resumes where it was.
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("cannot listen on %s again: %v", addr, err)
		}
		f.Listener = tls.NewListener(l, f.TLS)
		go f.Config.Serve(f.Listener)
		rs := f.waitRequests("watch", 2)
		assert.Equal(t, f.version(), rs[1].query.Get("resourceVersion"), "watch after the outage: resourceVersion, want the last seen")
		assert.Len(t, f.requests("list"), 1, "lists: after connection refused the watch resumes")
		checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
	})
}

// A malformed event ends the watch as an error; the watcher lists again from
// the last resource version seen.
func TestMalformedEventRelists(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	listRV := f.version()
	ss := start(t, f)
	f.put(v4("memcache-b", ep("10.0.0.2"))) // missed by the watch

	f.waitWatch(1).sendRaw(`{"type": ADDED}`)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
	lists := f.requests("list")
	assert.True(t, len(lists) == 2 && lists[1].query.Get("resourceVersion") == listRV, "lists %+v, want a second one from resourceVersion %s", lists, listRV)
}

// The watch does not wait for a slow change hook.
func TestSlowOnChange(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	release := make(chan struct{})
	defer close(release) // before the cleanup's Close, which waits for the hook
	ss := start(t, f, WithOnChange(func([]net.Addr) { <-release }))
	w := f.waitWatch(1)
	for i := 2; i <= 5; i++ {
		w.apply("ADDED", v4(fmt.Sprint("memcache-", i), ep(fmt.Sprint("10.0.0.", i))))
	}
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")...)
}

// An empty answer is the truth, unlike an error: the ring empties.
func TestEmptyStateEmptiesRing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trigger func(f *fakeAPI, w *fakeWatch, s *fakeSlice)
	}{
		{"empty relist", func(f *fakeAPI, w *fakeWatch, s *fakeSlice) {
			f.remove(s)
			w.send("ERROR", expiredFault.status())
		}},
		{"last slice deleted", func(f *fakeAPI, w *fakeWatch, s *fakeSlice) { w.apply("DELETED", s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			s := v4("memcache-a", ep("10.0.0.1"))
			f.put(s)
			ss := start(t, f)
			tc.trigger(f, f.waitWatch(1), s)
			waitServers(t, ss)
			_, err := ss.PickServer("k")
			assert.ErrorIs(t, err, ErrNoServers, "PickServer")
			assert.ErrorIs(t, err, memcache.ErrNoServers, "PickServer")
		})
	}
}

// A Service without endpoints yet is not an error.
func TestStartsEmpty(t *testing.T) {
	f := newFakeAPI(t)
	ss := start(t, f)
	_, err := ss.PickServer("k")
	assert.ErrorIs(t, err, ErrNoServers, "PickServer")
	f.waitWatch(1).apply("ADDED", v4("memcache-a", ep("10.0.0.1")))
	waitServers(t, ss, hostports("10.0.0.1")...)
}

// A Role without list or watch fails NewServerList at once with an *APIError
// that says what is missing.
func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		name, verb, resource string
		opts                 []Option
	}{
		{"list", "list", "endpointslices.discovery.k8s.io", nil},
		{"watch", "watch", "endpointslices.discovery.k8s.io", nil},
		{"list legacy endpoints", "list", "endpoints", []Option{WithLegacyEndpoints()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			f.failNext(tc.verb, forbidden(tc.verb))
			_, err := newServerList(t, f, "memcache:11211", tc.opts...)
			var e *APIError
			require.ErrorAs(t, err, &e)
			assert.Equal(t, 403, e.StatusCode, "APIError %+v: status code", e)
			assert.Equal(t, tc.verb, e.Verb, "APIError %+v: verb", e)
			assert.Equal(t, tc.resource, e.Resource, "APIError %+v: resource", e)
			assert.Equal(t, "default", e.Namespace, "APIError %+v: namespace", e)
			for _, s := range []string{fmt.Sprintf("verb %q", tc.verb), tc.resource, `namespace "default"`, "forbidden", "RBAC"} {
				assert.ErrorContains(t, err, s)
			}
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "NewServerList waited for its context")
			assert.Len(t, f.requests(tc.verb), 1, "%s requests: a 403 is not retried", tc.verb)
		})
	}
}

func TestUnauthorized(t *testing.T) {
	t.Run("token read again and request retried", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(v4("memcache-a", ep("10.0.0.1")))
		token := writeFile(t, "token", "token-1")
		ss := start(t, f, WithTokenFile(token))
		w := f.waitWatch(1)

		// The token is rotated, and the server stops taking the old one
		// well before the client's next periodic read.
		require.NoError(t, os.WriteFile(token+".new", []byte("token-2\n"), 0o600))
		require.NoError(t, os.Rename(token+".new", token))
		f.set(func(f *fakeAPI) { f.token = "token-2" })
		w.bookmark()
		w.close()

		f.waitWatch(2)
		ws := f.requests("watch")
		assert.True(t, len(ws) == 3 && ws[1].auth == "Bearer token-1" && ws[1].code == 401 && ws[2].auth == "Bearer token-2" && ws[2].code == 200,
			"watches %+v, want the old token refused, then the new one", ws)
		checkServers(t, ss, hostports("10.0.0.1")...)
	})
	t.Run("revoked token fails NewServerList", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.set(func(f *fakeAPI) { f.token = "other" })
		_, err := newServerList(t, f, "memcache:11211")
		var e *APIError
		require.ErrorAs(t, err, &e, "want an *APIError 401 saying unauthorized")
		require.Equal(t, 401, e.StatusCode, "error %v, want an *APIError 401 saying unauthorized", err)
		require.ErrorContains(t, err, "unauthorized", "want an *APIError 401 saying unauthorized")
		assert.Len(t, f.requests("list"), 2, "lists: want one retry with the token read again")
	})
}

// The watcher waits as long as the server asks with Retry-After.
func TestRetryWaits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fault    fault
		wait     time.Duration
		nextVerb string // the request after the failed watch
	}{
		{"429 Retry-After header", fault{code: 429, reason: "TooManyRequests", message: "slow down", retryAfter: "1"}, time.Second, "watch"},
		{"429 details.retryAfterSeconds", fault{code: 429, reason: "TooManyRequests", message: "slow down", retryAfterSeconds: 1}, time.Second, "watch"},
		{"503 Retry-After header", fault{code: 503, reason: "ServiceUnavailable", message: "try later", retryAfter: "1"}, time.Second, "list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			tm := fastTiming()
			tm.BackoffBase, tm.BackoffCap = time.Millisecond, 300*time.Millisecond
			ss := start(t, f, withTiming(tm))
			w := f.waitWatch(1)

			f.failNext("watch", tc.fault)
			w.bookmark()
			w.close()
			rs := f.waitRequests(tc.nextVerb, map[string]int{"watch": 3, "list": 2}[tc.nextVerb])
			failed := f.requests("watch")[1]
			next := rs[len(rs)-1]
			require.Equal(t, tc.fault.code, failed.code, "second watch's status code")
			assert.GreaterOrEqual(t, next.at.Sub(failed.at), tc.wait, "next request after the %d", tc.fault.code)
			checkServers(t, ss, hostports("10.0.0.1")...)
		})
	}
}

// Server errors are retried with exponential backoff.
func TestServerErrorsBackOff(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	for range 3 {
		f.failNext("list", serverError)
	}
	tm := fastTiming()
	tm.BackoffBase, tm.BackoffCap = 20*time.Millisecond, time.Second
	ss := start(t, f, withTiming(tm))
	checkServers(t, ss, hostports("10.0.0.1")...)

	lists := f.requests("list")
	require.Len(t, lists, 4, "lists")
	for i, min := range []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond} {
		assert.GreaterOrEqual(t, lists[i+1].at.Sub(lists[i].at), min, "retry %d", i+1)
	}
}

// An API server that cannot be reached is retried until the context ends;
// the error names the last failure.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "https://" + l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name  string
		setup func(f *fakeAPI)
		opts  []Option
		want  string
	}{
		{"connection refused", nil, []Option{WithAPIServer(closed)}, "connection refused"},
		// The request the context's end cancels is not the last error.
		{"failing, then silent", func(f *fakeAPI) {
			f.failNext("list", serverError)
			f.hold("list")
		}, nil, "etcdserver: request timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			before := goroutines()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			begin := time.Now()
			_, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, tc.opts...)...)
			assert.GreaterOrEqual(t, time.Since(begin), 300*time.Millisecond, "NewServerList returned before its context ended")
			assert.ErrorIs(t, err, context.DeadlineExceeded, "want the context's error")
			assert.ErrorContains(t, err, tc.want, "want the error naming the last failure")
			checkNoLeaks(t, before)
		})
	}
}

// An API server certificate that the CA does not verify fails NewServerList
// at once, naming WithCAFile: waiting will not fix it.
func TestUntrustedCertificate(t *testing.T) {
	f := newFakeAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, WithCAFile(""))...)
	require.ErrorContains(t, err, "x509: certificate signed by unknown authority")
	require.ErrorContains(t, err, "WithCAFile")
	require.NoError(t, ctx.Err(), "NewServerList waited for its context")
}

// Where discovery.k8s.io/v1 is not served, the watcher uses core/v1
// Endpoints; WithLegacyEndpoints makes it do so anyway.
func TestLegacyEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noSlices  bool
		opts      []Option
		wantFirst []string // the paths before the Endpoints list
	}{
		{"discovery.k8s.io/v1 not served", true, nil,
			slices.Repeat([]string{"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", "/apis/discovery.k8s.io/v1"}, 3)}, // internal/discovery's fallbackChecks,
		{"WithLegacyEndpoints", false, []Option{WithLegacyEndpoints()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.set(func(f *fakeAPI) { f.noSlices = tc.noSlices })
			f.put(v4("memcache-a", ep("10.0.0.8"))) // served only when slices are
			e := legacyEndpoints(
				fakeSubset{
					Addresses:         []fakeAddress{{IP: "10.0.0.1", Hostname: "memcache-0"}, {IP: "10.0.0.2", TargetRef: &fakeRef{Kind: "Pod", Name: "memcache-x"}}},
					NotReadyAddresses: []fakeAddress{{IP: "10.0.0.3"}},
					Ports:             memcachePort},
				fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.4"}}, Ports: []fakePort{tcp("metrics", 9150)}},
				fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.5"}}}, // port-less: the numeric port
			)
			f.put(e)
			ss := start(t, f, tc.opts...)
			checkServers(t, ss, hostports("10.0.0.1", "10.0.0.2", "10.0.0.5")...)

			e.Subsets = e.Subsets[:1]
			f.waitWatch(1).apply("MODIFIED", e)
			waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)

			rs := f.requests()
			var paths []string
			for _, r := range rs[:len(tc.wantFirst)] {
				paths = append(paths, r.path)
			}
			assert.True(t, slices.Equal(paths, tc.wantFirst), "first requests %v, want %v", paths, tc.wantFirst) // nil and empty are equal
			rs = rs[len(tc.wantFirst):]
			for i, verb := range []string{"list", "watch"} {
				r := rs[i]
				assert.Equal(t, verb, r.verb, "request %d: verb", i)
				assert.Equal(t, "/api/v1/namespaces/default/endpoints", r.path, "request %d: want Endpoints", i)
				assert.Contains(t, r.rawQuery, "fieldSelector=metadata.name%3Dmemcache", "request %d: want fieldSelector metadata.name=memcache", i)
			}
		})
	}
}

func TestNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, addr, podNamespace, file, want string
	}{
		{"from the address", "memcache.team-a:11211", "team-b", "team-c", "team-a"},
		{"from the full DNS name", "memcache.team-a.svc.cluster.local:11211", "", "", "team-a"},
		{"from POD_NAMESPACE", "memcache:11211", "team-b", "team-c", "team-b"},
		{"from the namespace file, trimmed", "memcache:11211", "", " team-c\n", "team-c"},
		{"default", "memcache:11211", "", "", "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			s := v4("memcache-a", ep("10.0.0.1"))
			s.Metadata.Namespace = tc.want
			f.put(s)
			sa := t.TempDir()
			if tc.file != "" {
				require.NoError(t, os.WriteFile(filepath.Join(sa, "namespace"), []byte(tc.file), 0o600))
			}
			ss, err := newServerList(t, f, tc.addr, withEnv(map[string]string{"POD_NAMESPACE": tc.podNamespace}), withSADir(sa))
			require.NoError(t, err)
			checkServers(t, ss, hostports("10.0.0.1")...)
			assert.Equal(t, "/apis/discovery.k8s.io/v1/namespaces/"+tc.want+"/endpointslices", f.requests()[0].path, "path, want namespace %s", tc.want)
		})
	}
}

// In a pod, the API server, token, CA and namespace come from the
// environment and the service account directory.
func TestInCluster(t *testing.T) {
	f := newFakeAPI(t)
	s := v4("memcache-a", ep("10.0.0.1"))
	s.Metadata.Namespace = "team-a"
	f.put(s)
	sa := t.TempDir()
	ca, err := os.ReadFile(f.caFile)
	require.NoError(t, err)
	for name, content := range map[string]string{"token": "in-cluster-token\n", "ca.crt": string(ca), "namespace": "team-a"} {
		require.NoError(t, os.WriteFile(filepath.Join(sa, name), []byte(content), 0o600))
	}
	host, port, _ := net.SplitHostPort(f.Listener.Addr().String())
	ss, err := newServerList(t, f, "memcache:11211", WithAPIServer(""), WithCAFile(""), WithTokenFile(""), withSADir(sa),
		withEnv(map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}))
	require.NoError(t, err)
	checkServers(t, ss, hostports("10.0.0.1")...)
	r := f.requests()[0]
	assert.Contains(t, r.path, "/namespaces/team-a/", "request path, want namespace team-a")
	assert.Equal(t, "Bearer in-cluster-token", r.auth, "request %s: Authorization, want the service account token", r.path)

	_, err = newServerList(t, f, "memcache:11211", WithAPIServer(""), withEnv(map[string]string{"KUBERNETES_SERVICE_HOST": host}))
	assert.ErrorIs(t, err, ErrNotInCluster, "without KUBERNETES_SERVICE_PORT")
}

// kubectl proxy serves plain HTTP and adds credentials itself.
func TestKubectlProxy(t *testing.T) {
	f := newPlainFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	ss := start(t, f, WithCAFile(""), WithTokenFile(""))
	checkServers(t, ss, hostports("10.0.0.1")...)
	for _, r := range f.requests() {
		assert.Empty(t, r.auth, "%s sent Authorization", r.verb)
	}
}

// The watch outlives NewServerList's context.
func TestWatchOutlivesContext(t *testing.T) {
	f := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	ss, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f)...)
	require.NoError(t, err)
	defer ss.Close()
	cancel()
	f.waitWatch(1).apply("ADDED", v4("memcache-a", ep("10.0.0.1")))
	waitServers(t, ss, hostports("10.0.0.1")...)
}

func TestOnChange(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.3"), ep("10.0.0.10"), ep("10.0.0.2")))
	var changes changeLog
	ss := start(t, f, changes.option())
	last := changes.last
	// Sorted as strings, as Servers sorts them.
	want := []string{"10.0.0.10:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	eventually(t, "the first set", func() bool { return slices.Equal(last(), want) })

	f.waitWatch(1).apply("ADDED", v4("memcache-b", ep("10.0.0.1")))
	want = []string{"10.0.0.10:11211", "10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	eventually(t, fmt.Sprintf("the set %v (have %v)", want, last()), func() bool { return slices.Equal(last(), want) })
	checkServers(t, ss, want...)
	for _, c := range changes.all() {
		assert.IsNonDecreasing(t, c, "OnChange got unsorted servers %v", c)
	}
}

// goroutines returns the stacks of the running goroutines, by their header
// ("goroutine 7 [running]:" without the state).
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	gs := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		id, _, _ := strings.Cut(g, " [")
		gs[id] = g
	}
	return gs
}

// checkNoLeaks fails the test unless the goroutines of ServerLists (the
// watch, the change hook, the HTTP client's connections) not in before have
// exited.
func checkNoLeaks(t *testing.T, before map[string]string) {
	t.Helper()
	ours := []string{"(*Watch).Run", "(*ServerList).notify", "net/http.(*persistConn)", "net/http.(*http2ClientConn)", "net/http.(*http2clientConnReadLoop)"}
	var leaked []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked = nil
		for id, g := range goroutines() {
			if _, ok := before[id]; !ok && slices.ContainsFunc(ours, func(s string) bool { return strings.Contains(g, s) }) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(leaked) > 0 {
		t.Errorf("%d goroutines left:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	}
}

// Close stops the watch, ends its request and waits for its goroutines, and
// may be called again.
func TestClose(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	before := goroutines()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ss, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, WithOnChange(func([]net.Addr) {}))...)
	require.NoError(t, err)
	w := f.waitWatch(1)
	require.NoError(t, ss.Close())
	// Close has waited for the watch and change-hook goroutines.
	for _, g := range goroutines() {
		assert.NotContains(t, g, "(*Watch).Run", "goroutine running after Close")
		assert.NotContains(t, g, "(*ServerList).notify", "goroutine running after Close")
	}
	require.NoError(t, ss.Close(), "a second Close")
	select {
	case <-w.gone:
	case <-time.After(waitFor):
		assert.Fail(t, "the watch request is still open after Close")
	}
	checkNoLeaks(t, before)
	checkServers(t, ss, hostports("10.0.0.1")...) // the servers stay as they were
	assert.Len(t, f.requests(), 2, "requests: none after Close")
}

// expire sends an in-stream 410, as the API server does for a compacted
// resource version: the watcher lists again.
func expire(w *fakeWatch) {
	w.send("ERROR", map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version"})
}

// A Service without EndpointSlices (a misspelt name, or a Service without a
// selector) is said once, at warning level, naming what to check, and
// WithOnChange gets the empty set.
func TestServiceWithoutSlices(t *testing.T) {
	f := newFakeAPI(t)
	log := &recLogger{t: t}
	var changes changeLog
	ss := start(t, f, WithLogger(log), changes.option())
	require.Empty(t, addrs(ss))
	eventually(t, "the empty set", func() bool { return len(changes.all()) == 1 })
	require.Equal(t, []string{}, changes.all()[0])

	expire(f.waitWatch(1))
	f.waitWatch(2)
	require.Len(t, f.requests("list"), 2)
	warning := "ERROR selector: the Service has no EndpointSlices: check the Service's name and namespace, and that it has a selector: service=memcache namespace=default"
	require.Equal(t, 1, log.count(warning), "the warning, once in two lists")
}

// A port that the Service does not have fails NewServerList with errNoPort,
// and is not also logged.
func TestNoPortNotLogged(t *testing.T) {
	f := newFakeAPI(t)
	f.put(slice("memcache-a", "IPv4", []fakePort{tcp("metrics", 9150)}, ep("10.0.0.1")))
	log := &recLogger{t: t}
	_, err := newServerList(t, f, "memcache:11211", WithLogger(log))
	require.ErrorIs(t, err, errNoPort)
	require.ErrorContains(t, err, "has no TCP port 11211")
	require.Zero(t, log.count("has no TCP port"), "the error was logged too")
}

// Events that arrive together are applied together: one publish for a
// burst, with no intermediate state.
func TestBurstIsOneChange(t *testing.T) {
	f := newFakeAPI(t)
	log := &recLogger{t: t}
	ss := start(t, f, WithLogger(log))
	w := f.waitWatch(1)
	var burst []string
	var want []string
	for i := range 40 {
		ip := fmt.Sprintf("10.0.1.%d", i+1)
		b := f.store(v4(fmt.Sprint("memcache-", i), ep(ip)), false)
		line, err := json.Marshal(map[string]any{"type": "ADDED", "object": json.RawMessage(b)})
		require.NoError(t, err)
		burst = append(burst, string(line))
		want = append(want, ip+":11211")
	}
	w.sendRaw(strings.Join(burst, "\n")) // one write
	slices.Sort(want)
	waitServers(t, ss, want...)
	// The change is logged just after it is published.
	eventually(t, "the change's log line", func() bool { return log.count("servers changed") > 0 })
	require.Equal(t, 1, log.count("servers changed"), "publishes for a burst of 40 events")
}

// Any watch that the server ends within shortWatch backs off, with events
// or without: a server that closes each watch after one BOOKMARK is not
// hammered.
func TestShortWatchWithEventsBacksOff(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	tm := fastTiming()
	tm.BackoffBase, tm.BackoffCap = 10*time.Millisecond, 100*time.Millisecond
	start(t, f, withTiming(tm))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // end each watch after one bookmark
		defer close(done)
		for i := 1; ; i++ {
			w := f.waitWatch(i)
			select {
			case <-stop:
				return
			default:
			}
			w.bookmark()
			w.close()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	n := len(f.requests("watch"))
	close(stop)
	f.put(v4("memcache-b", ep("10.0.0.2"))) // so that the goroutine's last waitWatch ends
	<-done
	require.LessOrEqual(t, n, 10, "watches in 300 ms; with backoff at most about 6")
}

// Retry-After is a floor on the backoff, but capped: one answer of a day
// does not stop discovery for a day.
func TestRetryAfterCapped(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	tm := fastTiming()
	tm.MaxRetryAfter = 100 * time.Millisecond
	ss := start(t, f, withTiming(tm))
	w := f.waitWatch(1)
	f.failNext("watch", fault{code: 429, reason: "TooManyRequests", message: "slow down", retryAfter: "86400"})
	barrier(t, w, ss)
	w.close()
	rs := f.waitRequests("watch", 3)
	require.Less(t, rs[2].at.Sub(rs[1].at), 5*time.Second)
	require.GreaterOrEqual(t, rs[2].at.Sub(rs[1].at), 100*time.Millisecond)
}

// A LIST item that does not decode is skipped and logged; the others count
// and the first sync completes.
func TestBadListItemSkipped(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	f.putRaw("memcache-bad", `{"kind":"EndpointSlice","metadata":{"name":"memcache-bad"},"addressType":"IPv4","endpoints":"not a list"}`)
	log := &recLogger{t: t}
	ss := start(t, f, WithLogger(log))
	checkServers(t, ss, hostports("10.0.0.1")...)
	require.Equal(t, 1, log.count("skipping a listed object that does not decode"))
}

// A 200 answer to a LIST that is not the expected list (an empty object, a
// Status, a list of another kind) is an error: the servers stay.
func TestListOfWrongKind(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"empty object", `{}`, `kind "" and resource version ""`},
		{"a Status", `{"kind":"Status","apiVersion":"v1","status":"Success","code":200}`, `kind "Status"`},
		{"Endpoints on the slices path", `{"kind":"EndpointsList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}`, `kind "EndpointsList"`},
		{"no resource version", `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{},"items":[]}`, `resource version ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			log := &recLogger{t: t}
			ss := start(t, f, WithLogger(log))
			f.answerList(tc.body)
			expire(f.waitWatch(1))
			f.waitWatch(2) // after the bad list and a good one
			require.Len(t, f.requests("list"), 3)
			require.Equal(t, 1, log.count(tc.want))
			require.Zero(t, log.count("removed=[10.0.0.1:11211]"), "the servers were emptied")
			checkServers(t, ss, hostports("10.0.0.1")...)
			require.True(t, log.has("is WithAPIServer's URL a Kubernetes API server?"))
		})
	}
}

// One 404 from the slices collection and from discovery, as from an API
// server that is still starting, does not switch to Endpoints.
func TestTransientNotFound(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	notFound := fault{code: 404, reason: "NotFound", message: "the server could not find the requested resource"}
	f.failNext("list", notFound)
	f.failNext("get", notFound)
	ss := start(t, f)
	checkServers(t, ss, hostports("10.0.0.1")...)
	for _, r := range f.requests("list", "watch") {
		require.Equal(t, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", r.path)
	}
}

// More ready endpoints than a ring takes are refused: the servers stay, and
// the refusal is logged.
func TestTooManyEndpoints(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	log := &recLogger{t: t}
	ss := start(t, f, WithLogger(log))
	w := f.waitWatch(1)
	var burst []string // 11 slices of 1000, the most a slice holds, in one write
	for sl := range 11 {
		var eps []fakeEndpoint
		for i := sl * 1000; i < (sl+1)*1000; i++ {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", 1+i>>16, i>>8&255, i&255)))
		}
		b := f.store(v4(fmt.Sprint("memcache-big-", sl), eps...), false)
		line, err := json.Marshal(map[string]any{"type": "ADDED", "object": json.RawMessage(b)})
		require.NoError(t, err)
		burst = append(burst, string(line))
	}
	w.sendRaw(strings.Join(burst, "\n"))
	eventually(t, "the refusal", func() bool { return log.has("refusing the Service's endpoints; keeping the servers") })
	checkServers(t, ss, hostports("10.0.0.1")...)
}
