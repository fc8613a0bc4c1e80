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

// TestPoolPinsAbandonedKey: a request of a key whose caller left while its
// connection was stuck pins the key there; the next request of the key goes
// to that connection, behind it, and another key to the idle one. Before,
// the next request of the key took the idle connection and ran first.
func TestPoolPinsAbandonedKey(t *testing.T) {
	checkGoroutines(t)
	var mu sync.Mutex
	conns := 0
	connOf := map[string][]int{} // key -> the connections its requests came on
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		mu.Lock()
		conns++
		id := conns
		mu.Unlock()
		stalled := false
		for {
			line, err := readRequest(br)
			if err != nil {
				return
			}
			key := strings.Fields(line)[1]
			mu.Lock()
			connOf[key] = append(connOf[key], id)
			mu.Unlock()
			if id == 1 && key == "k" && !stalled {
				stalled = true
				time.Sleep(300 * time.Millisecond)
			}
			nc.Write([]byte("HD\r\n"))
		}
	})
	p := NewPool(s.dial, Options{MaxConns: 2, Timeout: 2 * time.Second})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.Set(ctx, "k", []byte("v2"), SetOptions{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = p.Set(context.Background(), "other", []byte("x"), SetOptions{})
	require.NoError(t, err)
	_, err = p.Set(context.Background(), "k", []byte("v3"), SetOptions{})
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, []int{2}, connOf["other"], "another key takes the idle connection")
	require.Equal(t, []int{1, 1}, connOf["k"], "the key's next request goes behind its abandoned one")
	mu.Unlock()
	require.NoError(t, p.Delete(context.Background(), "k", DeleteOptions{}))
	require.Zero(t, p.npins.Load(), "the abandoned request's reply was read: the key is no longer pinned")
}
