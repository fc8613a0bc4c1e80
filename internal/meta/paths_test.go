package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The two ways a reply reaches its caller: a request alone on its
// connection is read by its own caller, who writes it, reads its reply
// and returns, no other goroutine involved; while others wait, one caller
// holds the read role and hands the replies it reads to theirs, and the
// role passes on as callers come and go, or leave as their contexts end.
// These tests force each way and the switches between them, and check
// that every answer is its own request's.

// echoServer is a scripted memcached: mg gets its key as the value (VA,
// with k and the request's opaque), ms gets HD, mn MN.
type echoServer struct {
	hold    chan struct{} // if not nil, each reply waits for a token from it
	batch   int           // replies held while more requests are already in, at most
	pause   time.Duration // before a write, a random pause of up to this
	staleAt int           // if > 0, request staleAt gets the reply of the one before it
}

func (e echoServer) serve(nc net.Conn, br *bufio.Reader) {
	var out []byte
	var prev string
	held := 0
	for n := 1; ; n++ {
		line, err := readRequest(br)
		if err != nil {
			return
		}
		rep := echoReply(line)
		if n == e.staleAt {
			rep = echoReply(prev)
		}
		prev = line
		if e.hold != nil {
			<-e.hold
			nc.Write(rep)
			continue
		}
		out = append(out, rep...)
		if held++; held < e.batch && br.Buffered() > 0 {
			continue // more requests are in: answer them together
		}
		if e.pause > 0 {
			time.Sleep(rand.N(e.pause))
		}
		if _, err := nc.Write(out); err != nil {
			return
		}
		out, held = out[:0], 0
	}
}

func echoReply(line string) []byte {
	f := strings.Fields(line)
	o := opaqueOf(line)
	if o != "" {
		o = " " + o
	}
	switch f[0] {
	case "mg":
		return fmt.Appendf(nil, "VA %d k%s%s\r\n%s\r\n", len(f[1]), f[1], o, f[1])
	case "ms":
		return []byte("HD" + o + "\r\n")
	case "mn":
		return []byte("MN\r\n")
	}
	return []byte("ERROR\r\n")
}

// readersOf returns the stacks of the goroutines reading replies (in
// Conn.readNext), and of those waiting in Conn.do for theirs.
func readersOf(t *testing.T) (reading, waiting []string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case strings.Contains(g, "meta.(*Conn).readNext"):
			reading = append(reading, g)
		case strings.Contains(g, "meta.(*Conn).do("):
			waiting = append(waiting, g)
		}
	}
	return reading, waiting
}

type getResult struct {
	key string
	it  Item
	err error
}

// TestLoneCallerReadsItsReply: a request alone is read by its own
// caller's goroutine (no reader goroutine exists); behind it, later
// callers wait for the replies it hands them, and once it has its own it
// passes the role to the oldest still waiting, past one whose context
// ended; the next request alone reads for itself again.
func TestLoneCallerReadsItsReply(t *testing.T) {
	checkGoroutines(t)
	hold := make(chan struct{})
	s := startFake(t, echoServer{hold: hold}.serve)
	t.Cleanup(func() { close(hold) }) // before the server's: a reply held on failure goes
	c := s.conn(t, Options{Timeout: 10 * time.Second})
	bg := context.Background()
	results := make(chan getResult, 4)
	get := func(ctx context.Context, key string) {
		it, err := c.Get(ctx, key, GetOptions{Value: true, Key: true})
		results <- getResult{key, it, err}
	}
	own := func(want string) {
		t.Helper()
		r := <-results
		require.NoError(t, r.err, r.key)
		require.Equal(t, want, r.key)
		require.Equal(t, want, r.it.Key)
		require.Equal(t, want, string(r.it.Value))
	}

	go get(bg, "lone")
	require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
	require.Eventually(t, func() bool { r, _ := readersOf(t); return len(r) == 1 }, time.Second, time.Millisecond)
	reading, waiting := readersOf(t)
	require.Contains(t, reading[0], "meta.(*Conn).Get(", "the caller reads its own reply")
	require.Empty(t, waiting)
	hold <- struct{}{}
	own("lone")

	// a leads; b and c wait; b leaves.
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	go get(bg, "a")
	require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
	go get(ctx, "b")
	require.Eventually(t, func() bool { return c.Outstanding() == 2 }, time.Second, time.Millisecond)
	go get(bg, "c")
	require.Eventually(t, func() bool { return c.Outstanding() == 3 }, time.Second, time.Millisecond)
	require.Eventually(t, func() bool { r, w := readersOf(t); return len(r) == 1 && len(w) == 2 }, time.Second, time.Millisecond)
	cancel()
	r := <-results
	require.Equal(t, "b", r.key)
	require.ErrorIs(t, r.err, context.Canceled)
	hold <- struct{}{}
	own("a")
	// c leads now, and reads b's reply for nobody before its own.
	require.Eventually(t, func() bool { r, w := readersOf(t); return len(r) == 1 && len(w) == 0 }, time.Second, time.Millisecond)
	hold <- struct{}{}
	hold <- struct{}{}
	own("c")
	require.Zero(t, c.Outstanding())

	go get(bg, "again")
	require.Eventually(t, func() bool { r, _ := readersOf(t); return len(r) == 1 }, time.Second, time.Millisecond)
	reading, waiting = readersOf(t)
	require.Contains(t, reading[0], "meta.(*Conn).Get(")
	require.Empty(t, waiting)
	hold <- struct{}{}
	own("again")
	require.NoError(t, c.Err())
}

// switchPhases runs rounds of a lone phase, one request at a time, each
// read by its own caller, and a burst, goroutines callers at once, a
// quarter of them with contexts that end within 100 µs, among whom the
// read role passes. Each key names its goroutine and its place, and is
// its own value. Every answer must be its own request's: a set, then a
// get of the key that returns it (or, if either was cut short, a miss);
// an error other than a context's fails the test, unless failed allows
// it, and then it must be the connection's.
func switchPhases(t *testing.T, c *Conn, rounds, goroutines, each int, failed bool) (maxOut int) {
	t.Helper()
	var peak atomic.Int64
	one := func(ctx context.Context, key string) error {
		_, err := c.Set(ctx, key, []byte(key), SetOptions{})
		if err == nil {
			var it Item
			it, err = c.Get(ctx, key, GetOptions{Value: true, Key: true})
			if err == nil && (it.Key != key || string(it.Value) != key) {
				return fmt.Errorf("get %q returned key %q, value %q", key, it.Key, it.Value)
			}
		}
		if n := int64(c.Outstanding()); n > peak.Load() {
			peak.Store(n)
		}
		switch {
		case err == nil, errors.Is(err, ErrMiss), errors.Is(err, context.DeadlineExceeded):
			return nil
		case failed && errors.Is(err, ErrConnClosed):
			return nil
		}
		return fmt.Errorf("%q: %w", key, err)
	}
	for round := range rounds {
		for i := range each {
			key := fmt.Sprintf("sw:%d:lone:%d", round, i)
			require.NoError(t, one(context.Background(), key))
			if c.Err() == nil {
				c.mu.Lock()
				leading := c.leading
				c.mu.Unlock()
				require.False(t, leading, "the read role is given up once nobody waits")
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Go(func() {
				for i := range each {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if rand.N(4) == 0 {
						ctx, cancel = context.WithTimeout(ctx, rand.N(100*time.Microsecond))
					}
					err := one(ctx, fmt.Sprintf("sw:%d:%d:%d", round, g, i))
					cancel()
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		if !failed {
			require.NoError(t, c.Err())
		}
	}
	return int(peak.Load())
}

// TestPathsSwitch runs switchPhases against real memcached, and against a
// scripted server that answers in bursts after pauses (the callers of a
// burst get their replies from its reader).
func TestPathsSwitch(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		conn                   func(t *testing.T) *Conn
		goroutines, perRequest int
	}{
		{"real", func(t *testing.T) *Conn { return startMemcached(t).conn(t, Options{Timeout: 5 * time.Second}) }, 32, 40},
		{"scripted", func(t *testing.T) *Conn {
			s := startFake(t, echoServer{batch: 8, pause: 200 * time.Microsecond}.serve)
			return s.conn(t, Options{Timeout: 5 * time.Second})
		}, 16, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			c := tc.conn(t)
			peak := switchPhases(t, c, 4, tc.goroutines, tc.perRequest, false)
			require.Greater(t, peak, 1, "requests were pipelined")
			require.NoError(t, c.Noop(context.Background()))
			require.Zero(t, c.Outstanding(), "every request answered once")
		})
	}
}

// A stale reply (the previous request's again), in a lone phase or in a
// burst: its opaque or key shows it, the connection fails, and no caller
// gets another's answer, whichever way its reply was read.
func TestPathsSwitchStaleReply(t *testing.T) {
	for _, at := range []int{7, 150, 900} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			checkGoroutines(t)
			s := startFake(t, echoServer{batch: 8, pause: 100 * time.Microsecond, staleAt: at}.serve)
			c := s.conn(t, Options{Timeout: 5 * time.Second})
			switchPhases(t, c, 3, 16, 20, true)
			require.ErrorIs(t, c.Err(), ErrProtocol)
		})
	}
}
