package selector

import (
	"bytes"
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// A request sent again after its connection broke goes on a connection
// dialed since, not on another one that was open when the server died:
// with WithMaxIdleConns(n), n connections to a killed server can be
// broken, more than a request is sent again. Here four connections to a
// server each carry a request whose caller left (so nobody reads them,
// and none has noticed the kill), and the server is SIGKILLed. Before,
// the request after the kill was sent on three of them in turn, and
// returned their EOF or reset (the history checker's kill schedules:
// "set: EOF", "getmulti: connection reset by peer"); now the first
// breakage retires the others, the retry's dial is refused, the server
// goes out, and the request goes to the stand-in, where it misses.
func TestRetryAfterKillDialsAgain(t *testing.T) {
	for _, op := range []string{"get", "set", "delete", "getmulti"} {
		t.Run(op, func(t *testing.T) {
			ms := startMemcached(t, 2)
			sent := make(chan []byte, 64)
			var d net.Dialer
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				nc, err := d.DialContext(ctx, network, addr)
				if err != nil || addr != ms[0].addr {
					return nc, err
				}
				return &sentConn{Conn: nc, sent: sent}, nil
			}
			// The timeout only bounds replies nobody waits for here.
			c, ss := newTestClient(t, addrsOf(ms), WithMaxIdleConns(4), WithTimeout(5*time.Second), WithDialContext(dial))
			keys := keysOf(t, ss, ms[0].addr, 5)
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v")}))
			}

			ms[0].signal(syscall.SIGSTOP) // it answers nothing: each request below stays outstanding
			for _, k := range keys[:4] {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { _, err := c.GetContext(ctx, k); done <- err }()
				waitSent(t, sent, "mg "+k+" ")
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
			}
			// Killed while stopped: no reply ever comes, the
			// connections are reset, and dials are refused.
			require.NoError(t, ms[0].cmd.Process.Kill())
			ms[0].cmd.Wait()
			ms[0].cmd = nil

			var err error
			switch op {
			case "get":
				_, err = c.Get(keys[4])
			case "set":
				err = c.Set(&memcache.Item{Key: keys[4], Value: []byte("w")})
			case "delete":
				err = c.Delete(keys[4])
			case "getmulti":
				_, err = c.GetMulti(keys[4:])
			}
			if !errors.Is(err, memcache.ErrCacheMiss) {
				require.NoError(t, err, "a %s after a kill", op)
			}
		})
	}
}

// sentConn reports what is written on it.
type sentConn struct {
	net.Conn
	sent chan<- []byte
}

func (c *sentConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	select {
	case c.sent <- bytes.Clone(p[:n]):
	default:
	}
	return n, err
}

// waitSent waits until a write holding what is seen.
func waitSent(t *testing.T, sent <-chan []byte, what string) {
	t.Helper()
	for {
		select {
		case b := <-sent:
			if bytes.Contains(b, []byte(what)) {
				return
			}
		case <-time.After(10 * time.Second): // a guard, not an assertion on time
			t.Fatalf("%q never sent", what)
		}
	}
}

// An Increment in a replicated pool whose primary group's server was just
// killed goes to the next group: nothing was sent, as the dial was
// refused. Before, the group answered ErrNoServers once its only server
// went out under the request, and the pool returned it (the history
// checker's kill schedules: "incr: no servers").
func TestReplicatedIncrementAfterKill(t *testing.T) {
	ms := startMemcached(t, 2)
	for _, m := range ms {
		require.NoError(t, direct(m.addr).Set(&memcache.Item{Key: "n", Value: []byte("5")}))
	}
	c, _ := newPoolClient(t, ms, []string{"", ""}, Replicated())
	p := c.pool.primaryFor("n")
	s := p.c.rt.Load().owner(p.c.hash("n"))
	primary := s.addr.str
	for _, m := range ms {
		if m.addr == primary {
			m.kill()
		}
	}
	// Its connections closed, as after another request's broke there:
	// the Increment dials, and is refused.
	s.closeIdle()
	n, err := c.Increment("n", 1)
	require.NoError(t, err)
	require.Equal(t, uint64(6), n)
	require.Equal(t, ServerOut, stateOf(p.c, primary).State)
}
