package selector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// TestContextDeadlineOnAHungServer: a request whose context ends before a
// hung server answers returns at once with the context's error, and does
// not count against the server: a caller's short deadline is not a
// timeout of the server's.
func TestContextDeadlineOnAHungServer(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms), WithTimeout(10*time.Second)) // no request times out here
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
	ms[0].signal(syscall.SIGSTOP)
	defer ms[0].signal(syscall.SIGCONT)
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{"GetContext", func(ctx context.Context) error { _, err := c.GetContext(ctx, "k"); return err }},
		{"SetContext", func(ctx context.Context) error {
			return c.SetContext(ctx, &memcache.Item{Key: "k", Value: []byte("w")})
		}},
		{"GetMultiContext", func(ctx context.Context) error { _, err := c.GetMultiContext(ctx, []string{"k", "j"}); return err }},
		{"IncrementContext", func(ctx context.Context) error { _, err := c.IncrementContext(ctx, "n", 1); return err }},
		{"DeleteContext", func(ctx context.Context) error { return c.DeleteContext(ctx, "k") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 4 { // more than the timeouts that take a server out
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				start := time.Now()
				err := tc.op(ctx)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Less(t, time.Since(start), time.Second, "the deadline did not bound the request")
			}
			require.Equal(t, ServerUp, stateOf(c, ms[0].addr).State, "a caller's deadline took the server out")
		})
	}
	ms[0].signal(syscall.SIGCONT)
	eventually(t, "the server to answer", func() bool {
		_, err := c.Get("k")
		return err == nil || errors.Is(err, memcache.ErrCacheMiss)
	})
	// The Set whose deadline passed may have landed or not; the Client
	// deleted the key after it, so a read returns a miss or "w", never
	// what it replaced.
	if it, err := c.Get("k"); err == nil {
		require.Equal(t, "w", string(it.Value))
	}
}

// TestContextCancelled: a request with a context already done is not sent,
// and returns the context's error.
func TestContextCancelled(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.GetContext(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, c.SetContext(ctx, &memcache.Item{Key: "k", Value: []byte("w")}), context.Canceled)
	require.ErrorIs(t, c.PingContext(ctx), context.Canceled)
	it, err := c.Get("k")
	if err == nil {
		require.Equal(t, "v", string(it.Value), "a Set that was never sent")
	}
	require.Equal(t, ServerUp, stateOf(c, ms[0].addr).State)
}

// TestHandoffKeepsTheExpiration: a key that moves is copied to its new
// server with the expiration it has left, read with the value (the meta
// protocol's t), not the handoff's fixed one; one that never expires stays
// so.
func TestHandoffKeepsTheExpiration(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms[:1]), WithHandoff(Handoff{Expiration: 300 * time.Second}))
	for i := range 100 {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("ttl-", i), Value: []byte("ttl"), Expiration: 100, Flags: 7}))
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("forever-", i), Value: []byte("forever")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see two servers", func() bool { return c.rt.Load().base == ss.ring.Load() })
	var moved []string
	for _, prefix := range []string{"ttl-", "forever-"} {
		for i := range 100 {
			if a, _ := ss.PickServer(fmt.Sprint(prefix, i)); a.String() == ms[1].addr {
				moved = append(moved, fmt.Sprint(prefix, i))
				break
			}
		}
	}
	require.Len(t, moved, 2)

	it, err := c.Get(moved[0])
	require.NoError(t, err)
	require.Equal(t, "ttl", string(it.Value))
	require.Equal(t, uint32(7), it.Flags)
	require.Zero(t, it.Expiration, "Get returns no expiration, as gomemcache's")
	ttl := metaTTL(t, ms[1].addr, moved[0])
	require.InDelta(t, 100, ttl, 3, "the copy's TTL")
	_, err = c.Get(moved[1])
	require.NoError(t, err)
	require.Equal(t, -1, metaTTL(t, ms[1].addr, moved[1]), "a value that never expires is copied so")

	items, err := c.GetMulti(moved)
	require.NoError(t, err)
	require.Len(t, items, 2)
	for _, it := range items {
		require.Zero(t, it.Expiration)
	}
}

// classicOnly serves memcached's classic protocol in front of backend, as
// memcached before 1.6 does: a meta command is answered ERROR, and the
// connection closed.
func classicOnly(t *testing.T, backend string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := net.Dial("tcp", backend)
				if err != nil {
					return
				}
				defer out.Close()
				go io.Copy(in, out)
				br := bufio.NewReader(in)
				for {
					line, err := br.ReadBytes('\n')
					if err != nil {
						return
					}
					if f := bytes.Fields(line); len(f) > 0 && len(f[0]) == 2 && f[0][0] == 'm' && bytes.IndexByte([]byte("gsdane"), f[0][1]) >= 0 {
						in.Write([]byte("ERROR\r\n"))
						return
					}
					if _, err := out.Write(line); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String()
}

// TestClassicFallback: a server without the meta protocol is spoken to in
// the classic one, found at the first contact and logged once; every
// operation works there, and a handoff copy gets the fixed expiration.
func TestClassicFallback(t *testing.T) {
	ms := startMemcached(t, 1)
	addr := classicOnly(t, ms[0].addr)
	var logs strings.Builder
	var mu sync.Mutex
	h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil)
	c, _ := newTestClient(t, []string{addr}, WithSlog(slog.New(h)))
	for i := range 3 {
		k := fmt.Sprint("c", i)
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v"), Flags: 3}))
		it, err := c.Get(k)
		require.NoError(t, err)
		require.Equal(t, "v", string(it.Value))
		require.Equal(t, uint32(3), it.Flags)
	}
	require.ErrorIs(t, c.Add(&memcache.Item{Key: "c0", Value: []byte("x")}), memcache.ErrNotStored)
	require.NoError(t, c.Set(&memcache.Item{Key: "n", Value: []byte("5")}))
	n, err := c.Increment("n", 2)
	require.NoError(t, err)
	require.Equal(t, uint64(7), n)
	items, err := c.GetMulti([]string{"c0", "c1", "nope"})
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.NoError(t, c.Delete("c0"))
	_, err = c.Get("c0")
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
	require.NoError(t, c.Ping())
	require.NoError(t, c.FlushAll())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, strings.Count(logs.String(), "meta protocol"), "logged once: %s", logs.String())
	require.Equal(t, ServerUp, stateOf(c, addr).State)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// isGetRequest reports whether b, written to a server, starts with a get:
// the meta protocol's mg (a Get, a handoff's read or check) or the classic
// protocol's gets.
func isGetRequest(b []byte) bool {
	return bytes.HasPrefix(b, []byte("mg ")) || bytes.HasPrefix(b, []byte("gets "))
}

// isAddRequest reports whether b starts a handoff's copy at its new
// server: the meta protocol's placeholder (mg with N; see wire.Reserve) or
// add (ms in mode E), or the classic add.
func isAddRequest(b []byte) bool {
	line, _, _ := bytes.Cut(b, []byte("\r\n"))
	return bytes.HasPrefix(b, []byte("add ")) ||
		bytes.HasPrefix(line, []byte("ms ")) && bytes.Contains(line, []byte(" ME")) ||
		bytes.HasPrefix(line, []byte("mg ")) && bytes.Contains(line, []byte(" N"))
}

// TestCopyNeverLandsAfterADelete: client A hands a moved key off; client B
// deletes the key after A read it where it was, before A's copy reaches
// the key's new server. B's Delete returns; then A's copy arrives, and A is
// slow to check the source. B reads the key meanwhile: it must miss. With
// add, check and undo (the classic protocol's copy), the copy is readable
// from its add to its undo; with a placeholder (see wire.Reserve), the
// copy never lands.
func TestCopyNeverLandsAfterADelete(t *testing.T) {
	ms := startMemcached(t, 2)
	from, to := ms[0].addr, ms[1].addr
	var on atomic.Bool
	var fromGets atomic.Int32
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(from))
	a, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithTimeout(2*time.Second),
		WithMoves(Moves{Rate: -1}), // no mover: its reads of the source would count as the copy's
		WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return delayedWrites{conn, func(b []byte) time.Duration {
				switch {
				case !on.Load():
				case addr == to && isAddRequest(b):
					return 300 * time.Millisecond // the copy reaches the new server after B's Delete
				case addr == from && isGetRequest(b) && fromGets.Add(1) == 2:
					return 400 * time.Millisecond // the copy's check of its source
				}
				return 0
			}}, nil
		}))
	require.NoError(t, err)
	defer a.Close()
	b, sb := newTestClient(t, []string{from})
	var both ServerList
	require.NoError(t, both.SetServers(from, to))
	key := keysOf(t, &both, to, 1)[0]
	require.NoError(t, a.Set(&memcache.Item{Key: key, Value: []byte("v0")}))
	require.NoError(t, ss.SetServers(from, to))
	require.NoError(t, sb.SetServers(from, to))
	for _, c := range []*Client{a, b} {
		eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	}
	on.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); a.Get(key) }()
	time.Sleep(100 * time.Millisecond) // A has read the source; its copy is on its way
	require.NoError(t, b.Delete(key))
	time.Sleep(300 * time.Millisecond) // A's copy has reached the new server; A checks the source
	_, err = b.Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "another client read a copy that landed after its Delete")
	<-done
	on.Store(false)
	_, err = b.Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "a deleted value came back")
	_, err = a.Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "a deleted value came back")
}

// TestPoolRepairKeepsTheExpiration: a replicated pool with miss failover
// copies a hit back to the replica that missed it with the value's flags
// and remaining expiration.
func TestPoolRepairKeepsTheExpiration(t *testing.T) {
	ms := startMemcached(t, 2)
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithPool(Replicated().WithMissFailover()))
	require.NoError(t, err)
	defer c.Close()
	first := c.pool.view.Load().reads[0].name // the replica this client reads first
	for i := range 2 {
		if ms[i].addr == first {
			key := "r"
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v"), Flags: 9, Expiration: 100}))
			require.NoError(t, direct(ms[i].addr).Delete(key)) // it lost the key (evicted, or restarted empty)
			it, err := c.Get(key)
			require.NoError(t, err)
			require.Equal(t, uint32(9), it.Flags)
			require.Zero(t, it.Expiration, "Get returns no expiration, as gomemcache's")
			require.InDelta(t, 100, metaTTL(t, ms[i].addr, key), 3, "the repaired copy's TTL")
			got, err := direct(ms[i].addr).Get(key)
			require.NoError(t, err)
			require.Equal(t, uint32(9), got.Flags)
			return
		}
	}
	t.Fatalf("no replica is %s", first)
}

// TestRepairNeverLandsAfterADelete: TestCopyNeverLandsAfterADelete for a
// replicated pool's repair. Client A misses at the replica it reads first
// and hits at the other; client B deletes the key (in both) after A's hit,
// before A's copy reaches the first replica, and reads it while A checks
// the other: B must miss.
func TestRepairNeverLandsAfterADelete(t *testing.T) {
	ms := startMemcached(t, 2)
	var on atomic.Bool
	var gets atomic.Int32
	var first, second string // A's replicas, in its order of reads
	ss := new(ServerList)
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	a, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithTimeout(2*time.Second),
		WithPool(Replicated().WithMissFailover()),
		WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return delayedWrites{conn, func(b []byte) time.Duration {
				switch {
				case !on.Load():
				case addr == first && isAddRequest(b):
					return 300 * time.Millisecond // the copy reaches the replica after B's Delete
				case addr == second && isGetRequest(b) && gets.Add(1) == 2:
					return 400 * time.Millisecond // the repair's check of the replica it read
				}
				return 0
			}}, nil
		}))
	require.NoError(t, err)
	defer a.Close()
	first = a.pool.view.Load().reads[0].name
	second = ms[0].addr
	if second == first {
		second = ms[1].addr
	}
	sb := new(ServerList)
	require.NoError(t, sb.SetServers(addrsOf(ms)...))
	b, err := NewClientFromList(sb, WithSlog(slog.New(slog.DiscardHandler)), WithPool(Replicated().WithMissFailover()))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, a.Set(&memcache.Item{Key: "k", Value: []byte("v0")}))
	require.NoError(t, direct(first).Delete("k")) // A's first replica lost it (evicted, or restarted empty)
	on.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); a.Get("k") }()
	time.Sleep(100 * time.Millisecond) // A has its hit; its copy is on its way
	require.NoError(t, b.Delete("k"))
	time.Sleep(300 * time.Millisecond) // A's copy has reached the replica; A checks the other
	_, err = b.Get("k")
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "another client read a repair that landed after its Delete")
	<-done
	on.Store(false)
	for _, m := range ms {
		_, err := direct(m.addr).Get("k")
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "a deleted value came back at %s", m.addr)
	}
}

// TestArithAgainstPlaceholders: memcached answers an increment of a copy's
// placeholder "non-numeric". Arith then reads the key: a placeholder or a
// miss is a miss; a number that filled it meanwhile is incremented again,
// twice at most, since a new copy's placeholder may have replaced it in
// between (the history checker's unseen-change schedule met that once); a
// value that is not a number keeps the server's answer. The server here is
// scripted, one reply per request, so that each interleaving is exact.
func TestArithAgainstPlaceholders(t *testing.T) {
	const refused = "CLIENT_ERROR cannot increment or decrement non-numeric value"
	for _, tc := range []struct {
		name    string
		replies []string // to ma and mg in turn; "%s" is the request's opaque
		want    uint64
		wantErr error // nil, memcache.ErrCacheMiss, or errAny
	}{
		{"a number", []string{"VA 2 %s", "11"}, 11, nil},
		{"a placeholder is a miss", []string{refused, "VA 0 W %s", ""}, 0, memcache.ErrCacheMiss},
		{"gone since is a miss", []string{refused, "EN"}, 0, memcache.ErrCacheMiss},
		{"filled since", []string{refused, "VA 2 %s", "10", "VA 2 %s", "11"}, 11, nil},
		{"filled, then reserved again", []string{refused, "VA 2 %s", "10", refused, "VA 0 W %s", ""}, 0, memcache.ErrCacheMiss},
		{"filled and reserved twice", []string{refused, "VA 2 %s", "10", refused, "VA 2 %s", "10", "VA 2 %s", "11"}, 11, nil},
		{"text stays the server's refusal", []string{refused, "VA 3 %s", "abc"}, 0, errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := metaWire{meta.NewPool(func(context.Context) (net.Conn, error) {
				client, server := net.Pipe()
				go scriptedMeta(server, tc.replies)
				return client, nil
			}, meta.Options{})}
			defer w.p.Close()
			n, err := w.Arith(context.Background(), "k", 1, false)
			switch tc.wantErr {
			case nil:
				require.NoError(t, err)
				require.Equal(t, tc.want, n)
			case errAny:
				require.Error(t, err)
				require.NotErrorIs(t, err, memcache.ErrCacheMiss)
				require.Contains(t, err.Error(), "non-numeric")
			default:
				require.ErrorIs(t, err, tc.wantErr)
			}
		})
	}
}

var errAny = errors.New("any error but a miss")

// scriptedMeta answers each request line on c with the next reply of
// script: a reply that starts with VA takes the data line after it, and
// "%s" stands for the request's opaque token.
func scriptedMeta(c net.Conn, script []string) {
	defer c.Close()
	br := bufio.NewReader(c)
	for len(script) > 0 {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		opaque := ""
		for _, f := range strings.Fields(line)[1:] {
			if f[0] == 'O' {
				opaque = f
			}
		}
		reply := script[0]
		script = script[1:]
		out := strings.TrimSpace(strings.ReplaceAll(reply, "%s", opaque)) + "\r\n"
		if strings.HasPrefix(reply, "VA") {
			out += script[0] + "\r\n"
			script = script[1:]
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
	io.Copy(io.Discard, br) // until the client closes
}
