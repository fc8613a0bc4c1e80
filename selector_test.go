package selector

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestZeroServerList(t *testing.T) {
	var ss ServerList
	_, err := ss.PickServer("k")
	require.ErrorIs(t, err, ErrNoServers)
	require.ErrorIs(t, err, memcache.ErrNoServers)
	require.NoError(t, ss.Each(func(net.Addr) error { require.Fail(t, "Each called f on an empty list"); return nil }))
	require.Empty(t, ss.Servers())
	require.NoError(t, ss.Close())
	require.NoError(t, ss.Close())
}

func TestSetServers(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.3:11211", "127.0.0.1:11211", "/tmp/memcached.sock", "127.0.0.1:11211"))
	require.Equal(t, []string{"/tmp/memcached.sock", "127.0.0.1:11211", "127.0.0.3:11211"}, addrStrings(ss.Servers()))
	require.Equal(t, "unix", ss.Servers()[0].Network())
	require.Equal(t, "tcp", ss.Servers()[1].Network())

	// Resolve all or change nothing.
	for _, bad := range []string{"127.0.0.1", "127.0.0.1:notaport", "256.0.0.1:11211x"} {
		require.Error(t, ss.SetServers("127.0.0.9:11211", bad), bad)
		require.Len(t, ss.Servers(), 3, "a failed SetServers(%q) changed the list", bad)
	}

	require.NoError(t, ss.SetServers())
	_, err := ss.PickServer("k")
	require.ErrorIs(t, err, ErrNoServers)
}

// TestSetServersOrder: unlike memcache.ServerList, the mapping is a function
// of the set, so clients configured in a different order agree.
func TestSetServersOrder(t *testing.T) {
	var a, b ServerList
	require.NoError(t, a.SetServers("127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"))
	require.NoError(t, b.SetServers("127.0.0.3:1", "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"))
	for i := range 1000 {
		k := fmt.Sprint("key", i)
		x, _ := a.PickServer(k)
		y, _ := b.PickServer(k)
		require.Equal(t, x.String(), y.String(), k)
	}
}

// TestStableAddrs: PickServer returns one net.Addr value per server, across
// calls and across changes, as gomemcache's GetMulti groups keys by it.
func TestStableAddrs(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.1:1", "127.0.0.2:1"))
	first := map[string]net.Addr{}
	for i := range 200 {
		a, err := ss.PickServer(fmt.Sprint(i))
		require.NoError(t, err)
		if prev, ok := first[a.String()]; ok {
			require.Same(t, prev, a)
		}
		first[a.String()] = a
	}
	require.Len(t, first, 2)

	require.NoError(t, ss.SetServers("127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"))
	for _, a := range ss.Servers() {
		if prev, ok := first[a.String()]; ok {
			require.Same(t, prev, a, "%s got a new net.Addr after a change", a)
		}
	}
}

func TestPickServerAllocs(t *testing.T) {
	for _, n := range []int{1, 3, 100} {
		var ss ServerList
		servers := make([]string, n)
		for i := range servers {
			servers[i] = fmt.Sprintf("127.0.%d.%d:11211", i/250, i%250+1)
		}
		require.NoError(t, ss.SetServers(servers...))
		allocs := testing.AllocsPerRun(1000, func() {
			a, _ := ss.PickServer("user:1234:profile")
			_ = a.String()
		})
		require.Zero(t, allocs, "PickServer allocates at %d servers", n)
	}
}

// TestUpdateKeepsRing: a change of address under the same identities (a
// StatefulSet pod with a new IP) reuses the points, and moves no key.
func TestUpdateKeepsRing(t *testing.T) {
	var ss ServerList
	ss.update(members("memcache-0:11211", "memcache-1:11211"))
	before := ss.ring.Load()

	ms := members("memcache-0:11211", "memcache-1:11211")
	ms[1].addr = &staticAddr{network: "tcp", str: "10.0.0.9:11211"}
	added, removed, err := ss.update(ms)
	require.NoError(t, err)
	require.Equal(t, []string{"10.0.0.9:11211"}, added)
	require.Equal(t, []string{"memcache-1:11211"}, removed)
	after := ss.ring.Load()
	require.NotSame(t, before, after)
	require.True(t, after.keys.Shares(&before.keys), "the table was rebuilt")

	added, removed, err = ss.update(ms)
	require.NoError(t, err)
	require.Nil(t, added)
	require.Nil(t, removed)
	require.Same(t, after, ss.ring.Load(), "an unchanged set published a new ring")
}

// TestEachNoLock: Each's callback may change the list (it would deadlock if
// Each held a lock) and sees the snapshot it started with.
func TestEachNoLock(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.1:1", "127.0.0.2:1"))
	var seen []string
	err := ss.Each(func(a net.Addr) error {
		seen = append(seen, a.String())
		return ss.SetServers("127.0.0.3:1")
	})
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.1:1", "127.0.0.2:1"}, seen)
	require.Equal(t, []string{"127.0.0.3:1"}, addrStrings(ss.Servers()))

	stop := errors.New("stop")
	n := 0
	require.ErrorIs(t, ss.Each(func(net.Addr) error { n++; return stop }), stop)
	require.Equal(t, 1, n)
}

// TestConcurrentUse runs readers against a writer; -race checks it.
func TestConcurrentUse(t *testing.T) {
	var ss ServerList
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if a, err := ss.PickServer(fmt.Sprint(i)); err == nil {
					_ = a.String()
				}
				_ = ss.Each(func(net.Addr) error { return nil })
			}
		})
	}
	for i := range 10 { // each change builds a table of 2^20 slots
		require.NoError(t, ss.SetServers(fmt.Sprintf("127.0.0.%d:1", i%5+1), "127.0.0.100:1"))
	}
	close(done)
	wg.Wait()
}

// TestWithGomemcache drives gomemcache's client through the ServerList
// against three fake memcached servers and checks that each key was stored
// on the server PickServer names.
func TestWithGomemcache(t *testing.T) {
	var servers []*fakeMemcached
	var addrs []string
	for range 3 {
		s := newFakeMemcached(t)
		servers = append(servers, s)
		addrs = append(addrs, s.addr)
	}
	var ss ServerList
	require.NoError(t, ss.SetServers(addrs...))
	mc := memcache.NewFromSelector(&ss)

	for i := range 60 {
		key := fmt.Sprint("key:", i)
		require.NoError(t, mc.Set(&memcache.Item{Key: key, Value: []byte(key)}))
	}
	for i := range 60 {
		key := fmt.Sprint("key:", i)
		a, err := ss.PickServer(key)
		require.NoError(t, err)
		for _, s := range servers {
			assert.Equal(t, s.addr == a.String(), s.has(key), "key %q on %s, picked %s", key, s.addr, a)
		}
	}
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprint("key:", i)
	}
	got, err := mc.GetMulti(keys)
	require.NoError(t, err)
	require.Len(t, got, 60)
}

// fakeMemcached speaks just enough of the memcached text protocol for set
// and get, on loopback.
type fakeMemcached struct {
	addr string
	mu   sync.Mutex
	data map[string][]byte
}

func newFakeMemcached(t *testing.T) *fakeMemcached {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	s := &fakeMemcached{addr: l.Addr().String(), data: map[string][]byte{}}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *fakeMemcached) has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.data[key]
	return ok
}

func (s *fakeMemcached) serve(c net.Conn) {
	defer c.Close()
	r, w := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 5 && f[0] == "set":
			var n int
			fmt.Sscan(f[4], &n)
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return
			}
			s.mu.Lock()
			s.data[f[1]] = buf[:n]
			s.mu.Unlock()
			w.WriteString("STORED\r\n")
		case len(f) >= 2 && (f[0] == "get" || f[0] == "gets"):
			for _, k := range f[1:] {
				s.mu.Lock()
				v, ok := s.data[k]
				s.mu.Unlock()
				if ok {
					fmt.Fprintf(w, "VALUE %s 0 %d 1\r\n%s\r\n", k, len(v), v)
				}
			}
			w.WriteString("END\r\n")
		default:
			w.WriteString("ERROR\r\n")
		}
		w.Flush()
	}
}

func addrStrings(as []net.Addr) []string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return s
}

func TestNewServerListBadInput(t *testing.T) {
	o := func(o *options) { o.getenv = func(string) string { return "" } }
	_, err := NewServerList(t.Context(), "memcache", o)
	require.ErrorContains(t, err, `bad address "memcache"`)

	_, err = NewServerList(t.Context(), "memcache:11211", o)
	require.ErrorIs(t, err, ErrNotInCluster)
	require.ErrorContains(t, err, "WithAPIServer")
	require.ErrorContains(t, err, "without Kubernetes, use a fixed list of servers: ServerList.SetServers, then NewClientFromList", "the way without Kubernetes")

	_, err = NewServerList(t.Context(), "memcache:11211", o, WithPointsPerServer(200000))
	require.ErrorContains(t, err, "WithPointsPerServer(200000): want 1 to 100000")

	_, err = NewServerList(t.Context(), "memcache:11211", WithAPIServer("ftp://example.invalid"))
	require.ErrorContains(t, err, "bad API server URL")

	_, err = NewServerList(t.Context(), "memcache:11211", WithAPIServer("https://127.0.0.1:1"), WithCAFile(t.TempDir()+"/missing.crt"))
	require.ErrorContains(t, err, "read API server CA")
}

// Every error the package returns says "selector: " once, at its start,
// however many layers it went through.
func TestErrorPrefixOnce(t *testing.T) {
	notInPod := Option(func(o *options) { o.getenv = func(string) string { return "" } })
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	var full ServerList
	require.NoError(t, full.SetServers("127.0.0.1:11211"))
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"NewServerList, not in a pod", func() error { _, err := NewServerList(t.Context(), "memcache:11211", notInPod); return err }},
		{"NewClient, not in a pod", func() error { _, err := NewClient(t.Context(), "memcache:11211", notInPod); return err }},
		{"NewServerList, bad address", func() error { _, err := NewServerList(t.Context(), "memcache", notInPod); return err }},
		{"NewServerList, bad option", func() error {
			_, err := NewServerList(t.Context(), "memcache:11211", WithPointsPerServer(-1))
			return err
		}},
		{"NewClient, bad option", func() error { _, err := NewClient(t.Context(), "memcache:11211", WithTimeout(-1)); return err }},
		{"NewClient, AcrossServices of a bad address", func() error {
			_, err := NewClient(t.Context(), "memcache:11211", fakeClientOptions(t, f, WithPool(AcrossServices("memcache-b")))...)
			return err
		}},
		{"NewClient, ByZone without a zone", func() error {
			_, err := NewClient(t.Context(), "memcache:11211", fakeClientOptions(t, f, WithPool(ByZone("")))...)
			return err
		}},
		{"NewClientFromList, nil", func() error { _, err := NewClientFromList(nil); return err }},
		{"NewClientFromList, discovery option", func() error { _, err := NewClientFromList(&full, WithLegacyEndpoints()); return err }},
		{"SetServers", func() error { return new(ServerList).SetServers("memcache") }},
		{"SetHashing, bad", func() error { return new(ServerList).SetHashing(Ch3().WithWeights(map[string]int{"a": 1})) }},
		{"SetHashing, late", func() error { return full.SetHashing(Ketama()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(zoneEnv, "")
			err := tc.call()
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), "selector: "), "%q does not start with the prefix", err)
			require.Equal(t, 1, strings.Count(err.Error(), "selector:"), "%q", err)
		})
	}
}

// TestREADMEProgram keeps the README's program the same as
// examples/readme/main.go, which `go vet ./...` compiles.
func TestREADMEProgram(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	program, err := os.ReadFile("examples/readme/main.go")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```go\n"+string(program)+"```", "the README's program differs from examples/readme/main.go")
}

// Stats and HasSynced say what discovery has done, without a metrics
// dependency.
func TestStats(t *testing.T) {
	var zero ServerList
	require.True(t, zero.HasSynced())
	require.NoError(t, zero.SetServers("10.0.0.1:11211"))
	require.Equal(t, Stats{Servers: zero.Servers(), Synced: true}, zero.Stats(), "synced, as HasSynced says")

	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	began := time.Now()
	ss := start(t, f)
	require.True(t, ss.HasSynced())
	s := ss.Stats()
	require.True(t, s.Synced)
	require.Equal(t, hostports("10.0.0.1"), addrStrings(s.Servers))
	require.WithinRange(t, s.LastSync, began, time.Now())
	require.NoError(t, s.LastError)
	require.Zero(t, s.Relists)
	require.Zero(t, s.WatchRestarts)

	w := f.waitWatch(1)
	barrier(t, w, ss)
	w.close() // a clean close: the watch restarts
	f.failNext("list", serverError)
	expire(f.waitWatch(2)) // then a failed list and a relist
	f.waitWatch(3)
	s = ss.Stats()
	require.Equal(t, 2, s.WatchRestarts)
	require.Equal(t, 1, s.Relists)
	require.ErrorContains(t, s.LastError, "etcdserver: request timed out")
	require.WithinDuration(t, time.Now(), s.LastErrorTime, waitFor)
}

// Close may be called from the change hook and from a Logger: it returns, and
// the goroutines exit once the callback does.
func TestCloseFromCallback(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  func(close func()) Option
	}{
		{"WithOnChange", func(close func()) Option { return WithOnChange(func([]net.Addr) { close() }) }},
		{"Logger", func(close func()) Option { return WithLogger(closingLogger(close)) }},
		{"slog", func(close func()) Option { return WithSlog(slog.New(closingHandler{close})) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")))
			before := goroutines()
			var ss atomic.Pointer[ServerList] // set once NewServerList has returned
			closed := make(chan struct{})
			closeOnce := sync.OnceFunc(func() {
				ss.Load().Close()
				close(closed)
			})
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			s, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, tc.opt(func() {
				if ss.Load() != nil {
					closeOnce()
				}
			}))...)
			require.NoError(t, err)
			ss.Store(s)
			f.waitWatch(1).apply("ADDED", v4("memcache-b", ep("10.0.0.2"))) // a change, and a log line
			select {
			case <-closed:
			case <-time.After(waitFor):
				require.Fail(t, "Close called from the callback did not return")
			}
			checkNoLeaks(t, before)
			require.NoError(t, s.Close(), "a second Close")
		})
	}
}

type closingLogger func()

func (c closingLogger) Errorf(string, ...any) { c() }
func (c closingLogger) Infof(string, ...any)  { c() }

type closingHandler struct{ close func() }

func (h closingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h closingHandler) Handle(context.Context, slog.Record) error { h.close(); return nil }
func (h closingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h closingHandler) WithGroup(string) slog.Handler             { return h }

// A ring takes at most maxMembers members, and maxRingPoints points in all:
// more are an error, and the servers stay.
func TestTooManyServers(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("10.0.0.1:11211"))
	ms := make([]member, maxMembers+1)
	for i := range ms {
		ms[i] = member{id: strconv.Itoa(i), addr: &staticAddr{network: "tcp", str: strconv.Itoa(i)}}
	}
	_, _, err := ss.update(ms)
	require.ErrorContains(t, err, "10001 servers, more than a ring of 3000 points a server takes (10000)")
	require.Equal(t, []string{"10.0.0.1:11211"}, addrStrings(ss.Servers()))

	big := ServerList{points: maxPoints}
	_, _, err = big.update(ms[:maxRingPoints/maxPoints+1])
	require.ErrorContains(t, err, "336 servers, more than a ring of 100000 points a server takes (335)")
}

// TestDrainingBeforeTheRing: a server that leaves the ring terminating but
// still serving is in the draining set by the time the ring without it is
// published, so that a Client that refreshes on the change does not take it
// for one that no longer serves, and skip its keys' handoff (an e2e rolling
// step kept 84-87% of its keys when it did).
func TestDrainingBeforeTheRing(t *testing.T) {
	ss := &ServerList{drains: true, changed: make(chan struct{}, 1), nonEmpty: make(chan struct{})}
	log := slog.New(slog.DiscardHandler)
	all := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	leaving := all[2]
	sig := make(chan struct{}, 1)
	ss.subscribe(sig)
	done, stop := make(chan struct{}), make(chan struct{})
	var bad, seen atomic.Int64
	go func() { // as Client.refresh reads them, on each change
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-sig:
			}
			if r := ss.ring.Load(); r != nil && len(r.members) < len(all) {
				seen.Add(1)
				if !slices.Contains(ss.drainingSet(), leaving) {
					bad.Add(1)
				}
			}
		}
	}()
	for i := 0; i < 300 && bad.Load() == 0; i++ {
		require.NoError(t, ss.publish(members(all...), nil, 0, log))
		require.NoError(t, ss.publish(members(all[:2]...), []string{leaving}, 0, log))
		time.Sleep(time.Millisecond) // the reader catches up
	}
	close(stop)
	<-done
	require.NotZero(t, seen.Load(), "the reader saw no ring without the leaving server")
	require.Zero(t, bad.Load(), "a ring without the leaving server was read before the draining set had it")
}
