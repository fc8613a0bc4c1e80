package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fastFailover probes often, so that tests see servers return quickly.
var fastFailover = WithFailover(Failover{ProbeFirst: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond})

// newTestClient returns a Client over a static ServerList of addrs.
func newTestClient(t *testing.T, addrs []string, opt ...Option) (*Client, *ServerList) {
	t.Helper()
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(addrs...))
	opt = append([]Option{WithSlog(slog.New(slog.DiscardHandler)), fastFailover, WithTimeout(300 * time.Millisecond)}, opt...)
	c, err := NewClientFromList(ss, opt...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, ss
}

// listOf returns a static ServerList of addrs: the ring a change leads to.
func listOf(t *testing.T, addrs ...string) *ServerList {
	t.Helper()
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(addrs...))
	return ss
}

// keysOf returns n keys that ss routes to addr.
func keysOf(t *testing.T, ss *ServerList, addr string, n int) []string {
	t.Helper()
	var ks []string
	for i := 0; len(ks) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		a, err := ss.PickServer(k)
		require.NoError(t, err)
		if a.String() == addr {
			ks = append(ks, k)
		}
		require.Less(t, i, 100000, "no keys for %s", addr)
	}
	return ks
}

// direct returns a gomemcache client of one server, to look behind the
// Client's back: one a server, as each keeps its idle connections open, and
// a client a call ran memcached out of connections (1024).
func direct(addr string) *memcache.Client {
	c, _ := directs.LoadOrStore(addr, memcache.New(addr))
	return c.(*memcache.Client)
}

var directs sync.Map // address -> *memcache.Client

func TestClientMethodSet(t *testing.T) {
	want, got := reflect.TypeOf(&memcache.Client{}), reflect.TypeOf(&Client{})
	for i := range want.NumMethod() {
		m := want.Method(i)
		g, ok := got.MethodByName(m.Name)
		if assert.True(t, ok, "Client has no method %s", m.Name) {
			assert.Equal(t, m.Type.String()[len("func(*memcache.Client"):], g.Type.String()[len("func(*selector.Client"):], m.Name)
		}
	}
}

// TestClientOperations runs every operation through the Client and through
// gomemcache over the same servers: the same results, the same errors.
func TestClientOperations(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	g := memcache.NewFromSelector(ss)
	type cache interface {
		Get(string) (*memcache.Item, error)
		Set(*memcache.Item) error
		Add(*memcache.Item) error
		Replace(*memcache.Item) error
		Append(*memcache.Item) error
		Prepend(*memcache.Item) error
		CompareAndSwap(*memcache.Item) error
		Delete(string) error
		Increment(string, uint64) (uint64, error)
		Decrement(string, uint64) (uint64, error)
		Touch(string, int32) error
		GetAndTouch(string, int32) (*memcache.Item, error)
		GetMulti([]string) (map[string]*memcache.Item, error)
		Ping() error
	}
	run := func(mc cache, p string) []string {
		var out []string
		rec := func(v any, err error) {
			if errors.Is(err, memcache.ErrMalformedKey) { // the Client's names the key too (see checkKey)
				err = memcache.ErrMalformedKey
			}
			out = append(out, fmt.Sprintf("%v %v", v, err))
		}
		val := func(it *memcache.Item, err error) (any, error) {
			if it == nil {
				return nil, err
			}
			return string(it.Value), err
		}
		k := p + "k"
		rec(val(mc.Get(k)))
		rec(nil, mc.Replace(&memcache.Item{Key: k, Value: []byte("r")}))
		rec(nil, mc.Append(&memcache.Item{Key: k, Value: []byte("a")}))
		rec(nil, mc.Add(&memcache.Item{Key: k, Value: []byte("v")}))
		rec(nil, mc.Add(&memcache.Item{Key: k, Value: []byte("w")}))
		rec(nil, mc.Append(&memcache.Item{Key: k, Value: []byte(">")}))
		rec(nil, mc.Prepend(&memcache.Item{Key: k, Value: []byte("<")}))
		rec(val(mc.Get(k)))
		it, err := mc.Get(k)
		require.NoError(t, err)
		it.Value = []byte("cas")
		rec(nil, mc.CompareAndSwap(it))
		rec(nil, mc.CompareAndSwap(it))
		rec(nil, mc.Replace(&memcache.Item{Key: k, Value: []byte("10")}))
		rec(mc.Increment(k, 5))
		rec(mc.Decrement(k, 20))
		rec(mc.Increment(p+"none", 1))
		rec(nil, mc.Touch(k, 100))
		rec(nil, mc.Touch(p+"none", 100))
		rec(val(mc.GetAndTouch(k, 50)))
		rec(val(mc.GetAndTouch(p+"none", 50)))
		rec(nil, mc.Delete(k))
		rec(nil, mc.Delete(k))
		rec(val(mc.Get("bad key")))
		rec(nil, mc.Set(&memcache.Item{Key: "bad\nkey"}))
		var keys []string
		for i := range 50 {
			keys = append(keys, fmt.Sprintf("%sm%d", p, i))
			if i%2 == 0 {
				require.NoError(t, mc.Set(&memcache.Item{Key: keys[i], Value: []byte(keys[i])}))
			}
		}
		m, err := mc.GetMulti(keys)
		rec(len(m), err)
		_, err = mc.GetMulti([]string{"ok", "not ok"})
		rec(nil, err)
		rec(nil, mc.Ping())
		return out
	}
	require.Equal(t, run(g, "g-"), run(c, "c-"))
}

func TestDeleteAllClearsEveryServer(t *testing.T) {
	ms := startMemcached(t, 3)
	c, _ := newTestClient(t, addrsOf(ms))
	for i := range 100 {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("k", i), Value: []byte("v")}))
	}
	require.NoError(t, c.DeleteAll())
	for _, m := range ms {
		for i := range 100 {
			_, err := direct(m.addr).Get(fmt.Sprint("k", i))
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s still has k%d", m, i)
		}
	}
}

// TestFailoverKilled SIGKILLs one of three servers under Get, Set and
// Delete: the application sees no error, the dead server's keys go to the
// next server, and no key of the others moves.
func TestFailoverKilled(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	dead := keysOf(t, ss, ms[0].addr, 50)
	alive := keysOf(t, ss, ms[1].addr, 50)
	for _, k := range append(dead, alive...) {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v1")}))
	}
	ms[0].kill()
	for i, k := range dead {
		_, err := c.Get(k)
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "Get of a key of the dead server, %d", i)
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v2")}))
		require.NoError(t, c.Delete(k))
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v3")}))
	}
	for _, k := range alive {
		it, err := c.Get(k)
		require.NoError(t, err, "a key of a live server moved")
		require.Equal(t, "v1", string(it.Value))
	}
	st := stateOf(c, ms[0].addr)
	require.Equal(t, ServerOut, st.State)
	require.Equal(t, len(dead), st.Invalidations)
}

func serverOf(c *Client, addr string) *server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[addr]
}

func stateOf(c *Client, addr string) ServerStats {
	for _, s := range c.Stats().Servers {
		if s.Addr == addr {
			return s
		}
	}
	return ServerStats{}
}

// TestNoStaleReadAfterReturn stops a server (SIGSTOP: it accepts but never
// answers), overwrites and deletes its keys while it is out, and lets it
// return with its old values: none is ever read back.
func TestNoStaleReadAfterReturn(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms), WithTimeout(100*time.Millisecond))
	keys := keysOf(t, ss, ms[0].addr, 40)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("old")}))
	}
	ms[0].signal(syscall.SIGSTOP)
	timeouts := 0
	for stateOf(c, ms[0].addr).State == "up" {
		_, err := c.Get(keys[0])
		var ne net.Error
		require.True(t, err == nil || errors.Is(err, memcache.ErrCacheMiss) || errors.As(err, &ne) && ne.Timeout(), "%v", err)
		if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			timeouts++
		}
		require.Less(t, timeouts, 10)
	}
	require.Equal(t, 3, timeouts, "timeouts before the server was taken out")
	for i, k := range keys {
		if i%2 == 0 {
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
		} else {
			require.NoError(t, c.Delete(k))
		}
	}
	ms[0].signal(syscall.SIGCONT)
	eventually(t, "the server to be back", func() bool { return stateOf(c, ms[0].addr).State == "up" })
	for i, k := range keys {
		// A read that passes the 100 ms timeout (a loaded machine under
		// -race, the server just resumed) is read again: a timeout is no
		// stale read, and what the test checks is what a read returns.
		it, err := c.Get(k)
		for try := 0; try < 5 && isTimeout(err); try++ {
			it, err = c.Get(k)
		}
		if i%2 == 0 {
			require.NoError(t, err, k)
			require.Equal(t, "new", string(it.Value), k)
		} else {
			require.ErrorIs(t, err, memcache.ErrCacheMiss, k)
		}
		// The key is at its server again, and nowhere else: a copy left
		// where it was written meanwhile would be read if the server went
		// out again.
		a, _ := ss.PickServer(k)
		require.Equal(t, ms[0].addr, a.String())
		for _, m := range ms[1:] {
			_, err := direct(m.addr).Get(k)
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s (%d) left at %s", k, i, m)
		}
	}
}

// TestRestartedServerNeedsNoReplay restarts a server empty: its uptime,
// shorter than its outage, proves that it holds nothing old, so its log is
// not replayed.
func TestRestartedServerNeedsNoReplay(t *testing.T) {
	ms := startMemcached(t, 3)
	logs := &recLogger{t: t}
	c, ss := newTestClient(t, addrsOf(ms), WithLogger(logs))
	keys := keysOf(t, ss, ms[0].addr, 20)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v")}))
		_, err := c.Get(k) // learns the server's CAS ids
		require.NoError(t, err)
	}
	// Enough writes that the restarted server's ids start below them.
	for i := range 200 {
		require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: fmt.Sprint("x", i), Value: []byte("v")}))
	}
	_, err := c.Get(keys[0])
	require.NoError(t, err)
	ms[0].kill()
	require.NoError(t, c.Set(&memcache.Item{Key: keys[1], Value: []byte("w")}))
	time.Sleep(5 * time.Second) // memcached's uptime starts at 2-4 s
	ms[0].restart()
	eventually(t, "the server to be back", func() bool { return stateOf(c, ms[0].addr).State == "up" })
	// The line is logged once the server is up again, a moment after.
	eventually(t, "the return logged as a restart", func() bool {
		return logs.has("server back for this client: server=" + ms[0].addr + " restarted=true")
	})
}

// scaledUp writes 300 keys, each its own value, through a Client of two
// servers, and adds a third.
func scaledUp(t *testing.T) ([]*memcached, *Client, *ServerList, []string) {
	t.Helper()
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]))
	var keys []string
	for i := range 300 {
		k := fmt.Sprint("h", i)
		keys = append(keys, k)
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	return ms, c, ss, keys
}

// TestHandoff adds a server: the keys that move to it are still found,
// copied there once, and gone from where they were; a write of a moved key
// deletes it where it was.
func TestHandoff(t *testing.T) {
	ms, c, ss, keys := scaledUp(t)
	moved := 0
	for i, k := range keys {
		a, _ := ss.PickServer(k)
		if a.String() != ms[2].addr {
			continue
		}
		moved++
		if i%3 == 0 { // a write of a moved key
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
			it, err := c.Get(k)
			require.NoError(t, err)
			require.Equal(t, "new", string(it.Value))
		} else {
			it, err := c.Get(k)
			require.NoError(t, err, "moved key %s not handed off", k)
			require.Equal(t, k, string(it.Value))
		}
		_, err := direct(ms[2].addr).Get(k)
		require.NoError(t, err, "%s not copied to its new server", k)
		for _, m := range ms[:2] {
			_, err := direct(m.addr).Get(k)
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s still at %s", k, m)
		}
	}
	require.Greater(t, moved, 50)
}

// TestHandoffMulti is TestHandoff through GetMulti.
func TestHandoffMulti(t *testing.T) {
	_, c, _, keys := scaledUp(t)
	got, err := c.GetMulti(keys)
	require.NoError(t, err)
	require.Len(t, got, len(keys))
	for _, k := range keys {
		require.Equal(t, k, string(got[k].Value))
	}
}

// TestConnectionsClosed rolls servers through the Client: the connections
// to each server that left are closed, however many rollouts.
func TestConnectionsClosed(t *testing.T) {
	ms := startMemcached(t, 6)
	var open atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countedConn{Conn: c, open: &open}, nil
	}
	c, ss := newTestClient(t, addrsOf(ms[:3]), WithDialContext(dial), WithHandoff(Handoff{Window: -1}))
	load := func() {
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 50 {
					c.Get(fmt.Sprint("k", g, "-", i))
				}
			})
		}
		wg.Wait()
	}
	for step := range 10 {
		set := addrsOf(ms)[step%4 : step%4+3]
		require.NoError(t, ss.SetServers(set...))
		eventually(t, "the client to see the new servers", func() bool { return len(c.rt.Load().baseSrv) == 3 && c.rt.Load().base == ss.ring.Load() })
		load()
		eventually(t, "the connections of the servers that left to close", func() bool { return open.Load() <= 3*2 })
	}
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// TestMaxDown hangs every server (SIGSTOP): only half of them are taken out
// after timeouts, so that a fault of the client's own network cannot move
// every key; the others say they are failing. Servers that refuse
// connections are out whatever the count, as mcrouter's hard TKOs.
func TestMaxDown(t *testing.T) {
	for _, tc := range []struct {
		name               string
		fault              func(m *memcached)
		wantOut, wantFails int
	}{
		{"hung: soft, capped", func(m *memcached) { m.signal(syscall.SIGSTOP) }, 2, 2},
		{"refusing: hard, not capped", func(m *memcached) { m.kill() }, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 4)
			c, _ := newTestClient(t, addrsOf(ms), WithTimeout(50*time.Millisecond))
			for _, m := range ms {
				tc.fault(m)
			}
			t.Cleanup(func() {
				for _, m := range ms {
					if m.cmd != nil {
						m.signal(syscall.SIGCONT)
					}
				}
			})
			for i := range 40 {
				c.Get(fmt.Sprint("k", i))
			}
			out, fails := 0, 0
			for _, s := range c.Stats().Servers {
				switch s.State {
				case ServerOut:
					out++
				case "failing":
					fails++
				}
			}
			require.Equal(t, tc.wantOut, out)
			require.Equal(t, tc.wantFails, fails)
		})
	}
}

// TestInvalidationsOverflow writes more keys of a server that is out than
// its invalidation log holds, or than all logs hold: when it returns, none
// of its values from before is served, and it is not flushed.
func TestInvalidationsOverflow(t *testing.T) {
	for _, tc := range []struct {
		name             string
		perServer, total int
	}{
		{"past the server's bound", 5, 1000},
		{"past the bound of all servers", 1000, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 2)
			c, ss := newTestClient(t, addrsOf(ms))
			c.inval.mu.Lock()
			c.inval.maxKeys, c.inval.maxTotal = tc.perServer, tc.total
			c.inval.mu.Unlock()
			keys := keysOf(t, ss, ms[0].addr, 10)
			require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: "other", Value: []byte("stale?")}))
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("old")}))
			}
			ms[0].signal(syscall.SIGSTOP)
			for stateOf(c, ms[0].addr).State == "up" {
				c.Get(keys[0])
			}
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
			}
			require.True(t, stateOf(c, ms[0].addr).Overflowed)
			ms[0].signal(syscall.SIGCONT)
			eventually(t, "the server to be back", func() bool { return stateOf(c, ms[0].addr).State == "up" })
			require.True(t, stateOf(c, ms[0].addr).Floor)
			// The server is not flushed: other clients' values stay. But none
			// of its values from before its return is served by this client.
			_, err := direct(ms[0].addr).Get("other")
			require.NoError(t, err, "flushed")
			if a, _ := ss.PickServer("other"); a.String() == ms[0].addr {
				_, err := c.Get("other")
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "a value from before the return")
			}
			for _, k := range keys {
				it, err := c.Get(k)
				require.NoError(t, err)
				require.Equal(t, "new", string(it.Value))
			}
		})
	}
}

// drainThird sets n keys of the third of ms through c, then removes that
// server from ss while it still serves, as discovery does for a pod in its
// grace period, and waits for c to see it drain. It returns the keys.
func drainThird(t *testing.T, c *Client, ss *ServerList, ms []*memcached, n int) []string {
	t.Helper()
	ss.drains = true // as with discovery
	keys := keysOf(t, ss, ms[2].addr, n)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms[:2])...))
	ss.setDraining([]string{ms[2].addr})
	eventually(t, "the client to see the server drain", func() bool {
		return stateOf(c, ms[2].addr).State == "gone" && !serverOf(c, ms[2].addr).lost.Load()
	})
	return keys
}

// TestHandoffFromDraining removes a server that still serves (a pod in its
// grace period, terminating but serving): its keys are handed off from it
// while discovery says it drains, and not read once it stops.
func TestHandoffFromDraining(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	keys := drainThird(t, c, ss, ms, 40)
	rt := c.rt.Load()
	require.Len(t, rt.past, 1)
	require.Len(t, rt.baseSrv, 2)
	for _, k := range keys[:20] {
		it, err := c.Get(k)
		require.NoError(t, err, "%s not handed off from the draining server", k)
		require.Equal(t, k, string(it.Value))
	}
	ss.setDraining(nil)
	eventually(t, "the client to see the server stop", func() bool { return serverOf(c, ms[2].addr).lost.Load() })
	for _, k := range keys[20:] {
		_, err := c.Get(k)
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s read from a server that no longer serves", k)
	}
}

// TestDrainingKeepsConnections: the Client's requests to a server that
// left but still serves (handoffs, moves) reuse its pooled connections. A
// connection dialed per request left 14,000-27,000 sockets in TIME-WAIT to
// one draining pod in an e2e run, and ran the machine out of local ports.
func TestDrainingKeepsConnections(t *testing.T) {
	ms := startMemcached(t, 3)
	var dials sync.Map // address -> *atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		n, _ := dials.LoadOrStore(addr, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	// A timeout breaks a connection, which is dialed again: long enough
	// that none comes under load (-race, a busy CI machine).
	c, ss := newTestClient(t, addrsOf(ms), WithDialContext(dial), WithTimeout(5*time.Second))
	keys := drainThird(t, c, ss, ms, 300)
	before, _ := dials.Load(ms[2].addr)
	from := before.(*atomic.Int64).Load()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < len(keys); i += 4 {
				c.Get(keys[i])
			}
		})
	}
	wg.Wait()
	movesDone(t, c, 1)
	n, _ := dials.Load(ms[2].addr)
	// A pool of each protocol, a key listing or two, and a reconnect: a
	// handful, not one a request.
	require.LessOrEqual(t, n.(*atomic.Int64).Load()-from, int64(10), "connections dialed to the draining server for %d reads and their moves", len(keys))
	ss.setDraining(nil)
	eventually(t, "the connections of the server that stopped to close", func() bool { return serverOf(c, ms[2].addr).retired.Load() })
}

// TestHandoffFromDrainingSlowOnce: a draining server that is slow once (a
// reply past the timeout, under the load of its moves) still serves its
// keys; as many failures in a row as take a member out stop its reads for
// a moment, and it is read again while Kubernetes says it drains.
func TestHandoffFromDrainingSlowOnce(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms), WithMoves(Moves{Rate: -1}))
	keys := drainThird(t, c, ss, ms, 10)
	ms[2].signal(syscall.SIGSTOP)
	_, err := c.Get(keys[0])
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the draining server did not answer in time")
	ms[2].signal(syscall.SIGCONT)
	require.False(t, serverOf(c, ms[2].addr).lost.Load(), "one timeout ended the draining server's grace period")
	for _, k := range keys[1:] {
		it, err := c.Get(k)
		require.NoError(t, err, "%s not handed off from the draining server", k)
		require.Equal(t, k, string(it.Value))
	}
	ms[2].signal(syscall.SIGSTOP)
	for range 3 { // keys[0] is still there: its copy was not read
		c.Get(keys[0])
	}
	ms[2].signal(syscall.SIGCONT)
	// Slow 3 times in a row, it is not read for a moment, then again while
	// it drains: keys[0] is handed off.
	eventually(t, "keys[0] handed off from the draining server once it answers again", func() bool {
		it, err := c.Get(keys[0])
		return err == nil && string(it.Value) == keys[0]
	})
}

// TestHandoffMemory measures what the handoff costs at 1000 servers: the
// past rings a Client keeps after a run of changes (no connection is made:
// the servers are never asked). Its bound is maxPast rings of the size of
// the members' own.
func TestHandoffMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 1000-server rings")
	}
	const n = 1000
	addrs := benchAddrs(n + 8)
	var c *Client
	var ss ServerList
	require.NoError(t, ss.SetServers(addrs[:n]...))
	one := retainedBytes(func() any {
		var s ServerList
		require.NoError(t, s.SetServers(addrs[:n]...))
		return &s
	})
	build := func() uint64 {
		return retainedBytes(func() any {
			var err error
			require.NoError(t, ss.SetServers(addrs[:n]...))
			// The servers are made up: nothing is dialed.
			refuse := WithDialContext(func(context.Context, string, string) (net.Conn, error) { return nil, syscall.ECONNREFUSED })
			// Moves off: a round of the mover in flight holds a routing of
			// its own, which is not what this measures.
			c, err = NewClientFromList(&ss, WithSlog(slog.New(slog.DiscardHandler)), refuse, WithMoves(Moves{Rate: -1}))
			require.NoError(t, err)
			for i := 1; i <= 6; i++ { // one pod replaced a step
				require.NoError(t, ss.SetServers(addrs[i:n+i]...))
				eventually(t, "the client to see the change", func() bool { return c.rt.Load().base == ss.ring.Load() })
			}
			return c
		})
	}
	// What other goroutines of the test binary retain meanwhile (a busy
	// -race run) only adds to a measurement: the least of three is the
	// Client's.
	all := build()
	for range 2 {
		if float64(all) < float64(c.cfg.maxPast+1)*float64(one)*1.25 {
			break
		}
		c.Close()
		c = nil
		all = min(all, build())
	}
	defer c.Close()
	past := len(c.rt.Load().past)
	require.Equal(t, c.cfg.maxPast, past)
	t.Logf("handoff at %d servers: %d past rings, %.1f MB over the ring's own %.1f MB (%.1f MB a past ring)",
		n, past, float64(all)/1e6, float64(one)/1e6, float64(all)/1e6/float64(past))
	require.Less(t, float64(all), float64(past+1)*float64(one)*1.25, "the Client holds more than its past rings")
}

// TestPastRingsKept: a small ring's past rings are kept up to the budget
// (a rolling restart of a few pods makes more changes than maxPast, and
// each change's keys must still be found where they were until they move);
// a large ring's, maxPast (TestHandoffMemory).
func TestPastRingsKept(t *testing.T) {
	addrs := benchAddrs(20)
	var ss ServerList
	require.NoError(t, ss.SetServers(addrs[:3]...))
	refuse := WithDialContext(func(context.Context, string, string) (net.Conn, error) { return nil, syscall.ECONNREFUSED })
	c, err := NewClientFromList(&ss, WithSlog(slog.New(slog.DiscardHandler)), refuse, WithMoves(Moves{Rate: -1}))
	require.NoError(t, err)
	defer c.Close()
	for i := 1; i <= 14; i++ { // a pod added, then one removed: 7 steps of a rolling restart
		require.NoError(t, ss.SetServers(addrs[i/2:3+(i+1)/2]...))
		eventually(t, "the client to see the change", func() bool { return c.rt.Load().base == ss.ring.Load() })
	}
	require.Equal(t, 10, len(c.rt.Load().past), "1.5 MB rings within the 16 MB budget")
}

// TestDeleteDuringHandoff deletes moved keys while Gets hand them off: a
// Get's copy must never bring a deleted value back.
func TestDeleteDuringHandoff(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]))
	var keys []string
	for i := range 600 {
		keys = append(keys, fmt.Sprint("d", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("v")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	back := 0
	for _, k := range keys {
		if a, _ := ss.PickServer(k); a.String() != ms[2].addr {
			continue
		}
		var wg sync.WaitGroup
		wg.Go(func() { c.Get(k) })
		wg.Go(func() { require.NoError(t, c.Delete(k)) })
		wg.Wait()
		if _, err := c.Get(k); err == nil {
			back++
		}
	}
	require.Zero(t, back, "deleted keys read back")
}

// delayedWrites delays the requests that delay picks, before they are sent.
type delayedWrites struct {
	net.Conn
	delay func(req []byte) time.Duration
}

func (c delayedWrites) Write(b []byte) (int, error) {
	time.Sleep(c.delay(b))
	return c.Conn.Write(b)
}

// TestConcurrentHandoffs: two clients hand one moved key off at once. B
// reads it where it was, then A does; A's add lands first and B's finds
// the key there. B must leave the source alone: if it deleted it, A's
// check of the source would take that for a racing Delete and undo its
// copy, and the key would be gone from both (as it was, about once in 3000
// moved keys, in the e2e rolling restart).
func TestConcurrentHandoffs(t *testing.T) {
	ms := startMemcached(t, 2)
	from, to := ms[0].addr, ms[1].addr
	client := func(delay func(addr string, req []byte) time.Duration) (*Client, *ServerList) {
		ss := new(ServerList)
		require.NoError(t, ss.SetServers(from))
		// No mover: its reads of the source would take the delays meant
		// for the handoffs' (under load, CI read the key gone from both).
		c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithMoves(Moves{Rate: -1}), WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return delayedWrites{conn, func(b []byte) time.Duration { return delay(addr, b) }}, nil
		}))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c, ss
	}
	var on atomic.Bool
	var aGets atomic.Int32
	a, sa := client(func(addr string, b []byte) time.Duration {
		if on.Load() && addr == from && isGetRequest(b) {
			return []time.Duration{250 * time.Millisecond, 600 * time.Millisecond}[min(aGets.Add(1)-1, 1)] // its read, then its check
		}
		return 0
	})
	b, sb := client(func(addr string, req []byte) time.Duration {
		if on.Load() && addr == to && isAddRequest(req) {
			return 400 * time.Millisecond
		}
		return 0
	})
	var both ServerList
	require.NoError(t, both.SetServers(from, to))
	key := keysOf(t, &both, to, 1)[0] // a key that moves when to joins
	require.NoError(t, a.Set(&memcache.Item{Key: key, Value: []byte("v")}))
	for _, ss := range []*ServerList{sa, sb} {
		require.NoError(t, ss.SetServers(from, to))
	}
	for _, c := range []*Client{a, b} {
		eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	}
	on.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { a.Get(key) })
	time.Sleep(100 * time.Millisecond)
	wg.Go(func() { b.Get(key) })
	wg.Wait()
	on.Store(false)
	_, errFrom := direct(from).Get(key)
	_, errTo := direct(to).Get(key)
	require.True(t, errFrom == nil || errTo == nil, "the key handed off twice at once is gone from both servers (%v, %v)", errFrom, errTo)
}

// TestHandoffUndoKeepsANewerWrite: a copy whose source changed is undone,
// but a Set that landed at the key's server after the copy's add (a Set
// writes there before it deletes at the source) is newer, and must stay.
func TestHandoffUndoKeepsANewerWrite(t *testing.T) {
	ms := startMemcached(t, 2)
	from, to := ms[0].addr, ms[1].addr
	var on atomic.Bool
	var gets atomic.Int32
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(from))
	// No mover: its reads of the source would count as the copy's.
	a, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithMoves(Moves{Rate: -1}), WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return delayedWrites{conn, func(b []byte) time.Duration {
			if on.Load() && addr == from && isGetRequest(b) && gets.Add(1) == 2 {
				return 300 * time.Millisecond // the copy's check of its source
			}
			return 0
		}}, nil
	}))
	require.NoError(t, err)
	defer a.Close()
	b, sb := newTestClient(t, []string{from}, WithMoves(Moves{Rate: -1}))
	var both ServerList
	require.NoError(t, both.SetServers(from, to))
	key := keysOf(t, &both, to, 1)[0]
	require.NoError(t, a.Set(&memcache.Item{Key: key, Value: []byte("v1")}))
	require.NoError(t, ss.SetServers(from, to))
	require.NoError(t, sb.SetServers(from, to))
	for _, c := range []*Client{a, b} {
		eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	}
	on.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { a.Get(key) }) // reads v1 at from, adds it at to, then waits to check from
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, b.Set(&memcache.Item{Key: key, Value: []byte("v2")})) // at to, then deletes at from
	wg.Wait()
	it, err := direct(to).Get(key)
	require.NoError(t, err, "the Set after the copy's add was undone with it")
	require.Equal(t, "v2", string(it.Value))
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
