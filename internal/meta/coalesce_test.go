package meta

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countingConn counts the writes made to a net.Conn.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// Concurrent requests that meet are written together: 64 goroutines'
// requests take a quarter of the writes there are requests, or fewer (a
// writer that finds others in flight yields once, so that the callers
// whose replies just came queue theirs first; without that yield, about
// 1 write in 2 requests), and many requests are in flight at once on the
// one connection.
func TestCoalescedWrites(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	nc, err := m.dial(context.Background())
	require.NoError(t, err)
	cc := &countingConn{Conn: nc}
	c := NewConn(cc, Options{})
	defer c.Close()
	ctx := context.Background()

	const goroutines, each = 64, 50
	var wg sync.WaitGroup
	var maxOutstanding atomic.Int64
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				k := fmt.Sprintf("co:%d:%d", g, i)
				if _, err := c.Set(ctx, k, []byte(k), SetOptions{}); err != nil {
					errs <- err
					return
				}
				if n := int64(c.Outstanding()); n > maxOutstanding.Load() {
					maxOutstanding.Store(n)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	writes := cc.writes.Load()
	t.Logf("%d requests in %d writes; at most %d outstanding", goroutines*each, writes, maxOutstanding.Load())
	require.Less(t, writes, int64(goroutines*each/4), "writes carried 4 requests or more on average")
	require.Greater(t, maxOutstanding.Load(), int64(1), "requests were pipelined")
}

// Requests go to the least loaded connection, and connections are dialed
// only when the others are busy.
func TestPoolSpreads(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	var dials atomic.Int64
	p := NewPool(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		return m.dial(ctx)
	}, Options{MaxConns: 3, Timeout: 10 * time.Second})
	defer p.Close()
	ctx := context.Background()
	for range 20 {
		require.NoError(t, p.Noop(ctx))
	}
	require.EqualValues(t, 1, dials.Load(), "one goroutine at a time needs one connection")

	m.stop(t)
	errs := make(chan error, 6)
	for i := range 6 {
		go func() { errs <- p.Noop(ctx) }()
		// One at a time, so that each sees the others' load.
		require.Eventually(t, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			total := 0
			for _, c := range p.conns {
				total += c.Outstanding()
			}
			return total == i+1
		}, 2*time.Second, time.Millisecond)
	}
	p.mu.Lock()
	require.Len(t, p.conns, 3)
	for _, c := range p.conns {
		require.Equal(t, 2, c.Outstanding(), "least outstanding first")
	}
	p.mu.Unlock()
	m.cont(t)
	for range 6 {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 3, dials.Load())
}
