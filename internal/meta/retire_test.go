package meta

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPoolCloseIdleRetiresBusy: after CloseIdle, a request goes on a
// connection dialed since, not on one that was busy then, which a server
// that died has broken too; the busy one's request still gets its reply,
// and the connection is closed after it. Before, CloseIdle kept the busy
// connection in the pool and the next request went on it (behind the
// request there, here until the timeout).
func TestPoolCloseIdleRetiresBusy(t *testing.T) {
	checkGoroutines(t)
	var mu sync.Mutex
	conns := 0
	connOf := map[string][]int{} // key -> the connections its requests came on
	received := make(chan string, 16)
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	closed := make(chan int, 4)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		mu.Lock()
		conns++
		id := conns
		mu.Unlock()
		defer func() { closed <- id }()
		for {
			line, err := readRequest(br)
			if err != nil {
				return
			}
			if line == "mn" {
				nc.Write([]byte("MN\r\n"))
				continue
			}
			key := strings.Fields(line)[1]
			mu.Lock()
			connOf[key] = append(connOf[key], id)
			mu.Unlock()
			received <- key
			if key == "held" {
				<-release
			}
			nc.Write([]byte("HD\r\n"))
		}
	})
	t.Cleanup(free) // runs before the fake server's, which waits for its handlers
	p := NewPool(s.dial, Options{MaxConns: 1, Timeout: 2 * time.Second})
	defer p.Close()
	held := make(chan error, 1)
	go func() {
		_, err := p.Set(context.Background(), "held", []byte("v"), SetOptions{})
		held <- err
	}()
	require.Equal(t, "held", <-received)

	p.CloseIdle()
	_, err := p.Set(context.Background(), "after", []byte("v"), SetOptions{})
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []int{2}, connOf["after"], "a request after CloseIdle goes on a new connection")
	mu.Unlock()

	free()
	require.NoError(t, <-held, "the retired connection's request is answered")
	require.Equal(t, 1, <-closed, "the retired connection is closed once answered")
}

// TestConnClosedBeforeQueued: a request that finds its connection closed
// was not sent, which the Pool knows (see sendTries), and says that the
// connection was closed.
func TestConnClosedBeforeQueued(t *testing.T) {
	s := startFake(t, replyWith("HD\r\n"))
	c := s.conn(t, Options{})
	require.True(t, c.closeIfIdle())
	_, err := c.Set(context.Background(), "k", []byte("v"), SetOptions{})
	require.ErrorIs(t, err, ErrConnClosed)
	require.True(t, unsent(err))
}
