package meta

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heldConn keeps what is written to it from the server while holding, as
// a memcached worker thread busy elsewhere leaves a request unread in its
// socket; on release the server gets it, then the close or half-close the
// client made meanwhile: the bytes were on their way before it.
type heldConn struct {
	*net.TCPConn
	mu                    sync.Mutex
	holding               bool
	held                  []byte
	closeWrite, closeConn bool
}

func (h *heldConn) Write(b []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding {
		h.held = append(h.held, b...)
		return len(b), nil
	}
	return h.TCPConn.Write(b)
}

func (h *heldConn) CloseWrite() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding {
		h.closeWrite = true
		return nil
	}
	return h.TCPConn.CloseWrite()
}

func (h *heldConn) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding {
		h.closeConn = true
		return nil
	}
	return h.TCPConn.Close()
}

func (h *heldConn) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding = true
}

func (h *heldConn) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding = false
	h.TCPConn.SetWriteDeadline(time.Time{}) // the client's passed while the bytes were held
	h.TCPConn.Write(h.held)
	if h.closeWrite {
		h.TCPConn.CloseWrite()
	}
	if h.closeConn {
		h.TCPConn.Close()
	}
}

// TestTimedOutWriteRunsFirst: a write whose reply times out may still run
// (its bytes are at the server); the next request of its key waits until
// the server has read everything sent on that connection, so that the
// timed-out write never lands after a later one.
func TestTimedOutWriteRunsFirst(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	var mu sync.Mutex
	var conns []*heldConn
	p := NewPool(func(ctx context.Context) (net.Conn, error) {
		nc, err := m.dial(ctx)
		if err != nil {
			return nil, err
		}
		h := &heldConn{TCPConn: nc.(*net.TCPConn)}
		mu.Lock()
		conns = append(conns, h)
		mu.Unlock()
		return h, nil
	}, Options{Timeout: 100 * time.Millisecond})
	defer p.Close()
	ctx := context.Background()

	_, err := p.Set(ctx, "k", []byte("v1"), SetOptions{})
	require.NoError(t, err)
	mu.Lock()
	first := conns[0]
	mu.Unlock()
	first.hold()
	_, err = p.Set(ctx, "k", []byte("v2"), SetOptions{})
	require.ErrorIs(t, err, ErrConnClosed, "the write times out")

	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(50 * time.Millisecond)
		first.release()
	}()
	// It waits for the held write to run (within the timeout: on a loaded
	// machine, the next try), and is not acknowledged before.
	for try := 0; ; try++ {
		_, err = p.Set(ctx, "k", []byte("v3"), SetOptions{})
		if err == nil || try == 50 {
			break
		}
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	}
	require.NoError(t, err)
	<-released
	time.Sleep(100 * time.Millisecond) // for the held write to run, if it had not
	it, err := p.Get(ctx, "k", GetOptions{Value: true})
	require.NoError(t, err)
	require.Equal(t, "v3", string(it.Value), "the write that timed out landed after the next one")

	t.Run("the server hangs on", func(t *testing.T) {
		// The next request of the key waits within its own context.
		_, err := p.Set(ctx, "h", []byte("v1"), SetOptions{})
		require.NoError(t, err)
		mu.Lock()
		last := conns[len(conns)-1]
		mu.Unlock()
		last.hold()
		_, err = p.Set(ctx, "h", []byte("v2"), SetOptions{})
		require.ErrorIs(t, err, ErrConnClosed)
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err = p.Set(short, "h", []byte("v3"), SetOptions{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_, err = p.Set(ctx, "other", []byte("x"), SetOptions{})
		require.NoError(t, err, "another key does not wait")
		last.release()
		_, err = p.Set(ctx, "h", []byte("v4"), SetOptions{})
		require.NoError(t, err)
		it, err := p.Get(ctx, "h", GetOptions{Value: true})
		require.NoError(t, err)
		require.Equal(t, "v4", string(it.Value))
	})
}
