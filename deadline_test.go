package selector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// hangProxy forwards to backend, line by line. Once hangOn(prefix, nth)
// is called, it stops forwarding on the connection (it reads on and answers
// nothing) where it sees the nth request line that starts with prefix,
// counted across connections: a server that stops answering halfway
// through a request's steps.
func hangProxy(t *testing.T, backend string) (addr string, hangOn func(prefix string, nth int32)) {
	addr, stallOn := stallProxy(t, backend)
	return addr, func(prefix string, nth int32) { stallOn(prefix, nth, 0) }
}

// stallProxy is hangProxy, whose stallOn(prefix, nth, d) holds the
// connection's requests from the nth line with prefix on for d (for ever
// if d is 0), and then forwards them in order: a connection stuck behind
// a slow request, as memcached runs one connection's requests in order.
func stallProxy(t *testing.T, backend string) (addr string, stallOn func(prefix string, nth int32, d time.Duration)) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var seen, nth atomic.Int32
	var stall atomic.Int64
	var prefix atomic.Pointer[[]byte]
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				in.Close()
				return
			}
			mu.Lock()
			conns = append(conns, in, out)
			if closed {
				in.Close()
				out.Close()
			}
			mu.Unlock()
			wg.Go(func() { io.Copy(in, out) })
			wg.Go(func() {
				defer out.Close()
				br := bufio.NewReader(in)
				hung := false
				for {
					line, err := br.ReadBytes('\n')
					if err != nil {
						return
					}
					if p := prefix.Load(); !hung && p != nil && bytes.HasPrefix(line, *p) && seen.Add(1) == nth.Load() {
						if d := time.Duration(stall.Load()); d > 0 {
							time.Sleep(d)
						} else {
							hung = true
						}
					}
					if hung {
						continue
					}
					if _, err := out.Write(line); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String(), func(p string, n int32, d time.Duration) {
		b := []byte(p)
		seen.Store(0)
		nth.Store(n)
		stall.Store(int64(d))
		prefix.Store(&b)
	}
}

// TestDeadlineOfEveryStep ends a request by its context's deadline when a
// server stops answering at a step after the first: the check of a copy's
// source, the delete where a written key was. Before, those steps ran on
// the Client's context, and the call returned after the Client's timeout
// (2 s here), not the caller's 200 ms. What runs on after the caller left
// keeps the contract: the next read finds the value, never an older one.
func TestDeadlineOfEveryStep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string // the request line, to the key's server before the change, that hangs
		nth    int32
		call   func(ctx context.Context, c *Client, key string) error
		want   string // what a read finds afterwards
	}{
		{"Get: the copy's check at the source", "mg %s ", 2,
			func(ctx context.Context, c *Client, key string) error { _, err := c.GetContext(ctx, key); return err }, "old"},
		{"GetMulti: the copy's check at the source", "mg %s ", 2,
			func(ctx context.Context, c *Client, key string) error {
				_, err := c.GetMultiContext(ctx, []string{key})
				return err
			}, "old"},
		{"Set: the delete where the key was", "md %s ", 1,
			func(ctx context.Context, c *Client, key string) error {
				return c.SetContext(ctx, &memcache.Item{Key: key, Value: []byte("new")})
			}, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 2)
			before, hangOn := hangProxy(t, ms[0].addr)
			key := keysOf(t, listOf(t, before, ms[1].addr), ms[1].addr, 1)[0]
			hangOn(fmtLine(tc.prefix, key), tc.nth)
			ss := listOf(t, before)
			c, err := NewClientFromList(ss, WithTimeout(2*time.Second), WithMoves(Moves{Rate: -1}), fastFailover)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("old"), Expiration: 600}))
			require.NoError(t, ss.SetServers(before, ms[1].addr))
			require.Eventually(t, func() bool { s, _ := c.rt.Load().ownerNow(c.hash(key)); return s != nil && s.addr.str == ms[1].addr },
				5*time.Second, 5*time.Millisecond, "the key moves to the new server")

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = tc.call(ctx, c, key)
			took := time.Since(start)
			require.Less(t, took, time.Second, "the call waited for the Client's timeout, not its own deadline (err %v)", err)
			if err != nil {
				require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
			}
			require.Eventually(t, func() bool {
				it, err := c.Get(key)
				if err == nil {
					require.Equal(t, tc.want, string(it.Value), "an older value was read")
				}
				return err == nil
			}, 15*time.Second, 50*time.Millisecond, "the value is read again once the steps left behind end")
		})
	}
}

// fmtLine is format with key in place of its %s.
func fmtLine(format, key string) string { return fmt.Sprintf(format, key) }

// TestOutWhileFloorsAreTaken fails a server over while the Client takes
// the CAS floors of a change at a server that hangs: the request that takes
// the server out goes on to its stand-in. Before, taking it out waited for
// the Client's lock, which the change held for the floors' round trips
// (twice the timeout, 6 s here), and then took the floors again.
func TestOutWhileFloorsAreTaken(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]), WithTimeout(3*time.Second), WithMoves(Moves{Rate: -1}))
	key := keysOf(t, ss, ms[0].addr, 1)[0]
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v")}))

	ms[2].signal(syscall.SIGSTOP) // its floor takes twice the timeout
	defer ms[2].signal(syscall.SIGCONT)
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	time.Sleep(200 * time.Millisecond) // the change is taking its floors
	ms[0].kill()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // under load, -race: room to spare
	defer cancel()
	start := time.Now()
	_, err := c.GetContext(ctx, key)
	took := time.Since(start)
	require.Less(t, took, 2500*time.Millisecond, "the request waited for the change's floors, 6 s (err %v)", err)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the stand-in has no value of the key yet")
	for _, st := range c.Stats().Servers {
		if st.Addr == ms[0].addr {
			require.Equal(t, ServerOut, st.State)
		}
	}
}

// TestDeadlineOfPoolRepair ends a pool's read by its deadline when the
// group it read from stops answering during the repair of the group that
// missed (the repair's check). Before, the check ran with no deadline but
// the Client's timeout (2 s here).
func TestDeadlineOfPoolRepair(t *testing.T) {
	ms := startMemcached(t, 2)
	b, hangOn := hangProxy(t, ms[1].addr)
	c, _ := newPoolClient(t, []*memcached{ms[0], {addr: b}}, []string{"a", "b"}, ByZone("a").WithMissFailover(), WithTimeout(2*time.Second))
	const key = "repaired"
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v")}))
	require.NoError(t, direct(ms[0].addr).Delete(key)) // zone a lost it
	hangOn("mg "+key+" ", 2)                           // the read, then the repair's check

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.GetContext(ctx, key)
	took := time.Since(start)
	require.Less(t, took, time.Second, "the read waited for the Client's timeout, not its own deadline (err %v)", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, func() bool {
		it, err := c.Get(key)
		return err == nil && string(it.Value) == "v"
	}, 15*time.Second, 50*time.Millisecond, "the value is read again")
}

// TestAbandonedWriteNeverLandsLate leaves a write whose connection is
// stuck (its caller's deadline ends first), then writes or deletes the key
// and is told it did: the abandoned write must not land after it. Before,
// the next request went to the Pool's other connection, ran first, and the
// abandoned value landed after it and was served (issue 27, 5 runs of 5).
// Now the key is pinned to the abandoned request's connection until its
// reply is read (see meta.Pool), and memcached runs them in order.
func TestAbandonedWriteNeverLandsLate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(c *Client, key string) error
		want  string // "" for a miss
	}{
		{"Set", func(c *Client, key string) error {
			return c.Set(&memcache.Item{Key: key, Value: []byte("v3")})
		}, "v3"},
		{"Delete", func(c *Client, key string) error {
			if err := c.Delete(key); !errors.Is(err, memcache.ErrCacheMiss) { // the cleanup of v2 may have deleted it
				return err
			}
			return nil
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 1)
			addr, stallOn := stallProxy(t, ms[0].addr)
			c, _ := newTestClient(t, []string{addr}, WithTimeout(3*time.Second))
			const key, stall = "abandoned", 600 * time.Millisecond
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}))

			stallOn("ms "+key+" ", 1, stall)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := c.SetContext(ctx, &memcache.Item{Key: key, Value: []byte("v2")})
			require.ErrorIs(t, err, context.DeadlineExceeded)
			time.Sleep(100 * time.Millisecond) // the cleanup's delete is done: the other connection is idle
			require.NoError(t, tc.after(c, key))

			time.Sleep(time.Until(start.Add(stall + 300*time.Millisecond))) // the abandoned write ran by now
			it, err := c.Get(key)
			if tc.want == "" {
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "the abandoned write landed after the Delete")
				return
			}
			if err == nil { // a miss is allowed, an older value is not
				require.Equal(t, tc.want, string(it.Value), "the abandoned write landed after the Set")
			} else {
				require.ErrorIs(t, err, memcache.ErrCacheMiss)
			}
		})
	}
}
