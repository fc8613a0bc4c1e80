package selector

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestCleanOnce: a key logged at a server (see invalLog) is deleted there
// once, by the first request that uses it; the others wait for that delete.
// Each request used to send its own: a read's delete, held up (a busy
// worker thread, a slow connection), landed after a write that had sent its
// own delete and then its value, and deleted an acknowledged write. Where an
// older value of the key was left at a stand-in or a past owner, the read's
// handoff then copied that back and served it (the history checker's
// two-out on memcached 1.6.45 under load: one key's older value served for
// 300 ms after an acknowledged write, 1 run in 15).
func TestCleanOnce(t *testing.T) {
	ms := startMemcached(t, 1)
	const key = "k"
	h := &holdDelete{cmd: []byte("md " + key + " "), held: make(chan struct{}), release: make(chan struct{})}
	c, _ := newTestClient(t, addrsOf(ms), WithDialContext(h.dial), WithTimeout(5*time.Second))
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}))
	c.inval.add(serverOf(c, ms[0].addr), key, nil) // as a delete there that failed: it goes before the key is used

	var wg sync.WaitGroup
	wg.Go(func() { c.Get(key) }) // its delete is held
	<-h.held
	setDone := make(chan error, 1)
	go func() { setDone <- c.Set(&memcache.Item{Key: key, Value: []byte("v2")}) }()
	select {
	case err := <-setDone:
		// The Set did not wait for the delete in flight: released now, it
		// lands after the value.
		close(h.release)
		require.NoError(t, err)
	case <-time.After(300 * time.Millisecond):
		close(h.release)
		require.NoError(t, <-setDone)
	}
	wg.Wait()
	it, err := c.Get(key)
	require.NoError(t, err, "the acknowledged write is kept")
	require.Equal(t, "v2", string(it.Value))
}

// holdDelete dials connections whose first write of cmd is held until
// release is closed; held is closed when it is.
type holdDelete struct {
	cmd           []byte
	once          sync.Once
	held, release chan struct{}
}

func (h *holdDelete) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: nc, h: h}, nil
}

type holdConn struct {
	net.Conn
	h *holdDelete
}

func (c *holdConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.h.cmd) {
		first := false
		c.h.once.Do(func() { first = true })
		if first {
			close(c.h.held)
			<-c.h.release
		}
	}
	return c.Conn.Write(b)
}

// TestInvalLogClaim: the log's part of cleaning once.
func TestInvalLogClaim(t *testing.T) {
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	s, standIn := &server{}, &server{}
	for _, tc := range []struct {
		name       string
		end        func(l *invalLog) // ends the first claim
		stillThere bool              // the key is logged after it
	}{
		{"done", func(l *invalLog) { l.done(s, "k") }, false},
		{"failed", func(l *invalLog) { l.release(s, "k") }, true},
		{"logged again meanwhile", func(l *invalLog) { l.add(s, "k", nil); l.done(s, "k") }, true},
		{"taken", func(l *invalLog) { require.Equal(t, map[string][]*server{"k": {standIn}}, l.take(s)) }, false},
		{"overflowed", func(l *invalLog) { l.overflow(s) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newInvalLog(10, 10)
			l.add(s, "k", standIn)
			logged, in, wait := l.claim(s, "k")
			require.True(t, logged)
			require.Equal(t, []*server{standIn}, in)
			require.Nil(t, wait, "the first claims the clean")
			logged, _, wait = l.claim(s, "k")
			require.True(t, logged)
			require.NotNil(t, wait, "the second waits")
			require.False(t, closed(wait))
			tc.end(l)
			require.True(t, closed(wait), "the waiter is woken")
			logged, in, wait = l.claim(s, "k")
			require.Equal(t, tc.stillThere, logged)
			if logged {
				require.Equal(t, []*server{standIn}, in, "its stand-in is kept")
				require.Nil(t, wait, "and the next claims it")
			}
		})
	}
	t.Run("each stand-in", func(t *testing.T) {
		l := newInvalLog(10, 10)
		other := &server{}
		for _, in := range []*server{standIn, other, standIn, nil} {
			l.add(s, "k", in)
		}
		_, in, _ := l.claim(s, "k")
		require.Equal(t, []*server{standIn, other}, in, "every stand-in that took a write, once")
	})
}
