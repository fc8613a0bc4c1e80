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

// fakeServer is a scripted server on loopback: serve runs for each
// connection it accepts, with the connection and a reader of it.
type fakeServer struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startFake(t *testing.T, serve func(nc net.Conn, br *bufio.Reader)) *fakeServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &fakeServer{l: l}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, nc)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer nc.Close()
				serve(nc, bufio.NewReader(nc))
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		for _, nc := range s.conns {
			nc.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *fakeServer) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", s.l.Addr().String())
}

func (s *fakeServer) conn(t *testing.T, o Options) *Conn {
	t.Helper()
	nc, err := s.dial(context.Background())
	require.NoError(t, err)
	c := NewConn(nc, o)
	t.Cleanup(func() { c.Close() })
	return c
}

// readRequest reads one request line (and an ms's data line).
func readRequest(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(line, "ms ") {
		if _, err := br.ReadString('\n'); err != nil {
			return "", err
		}
	}
	return strings.TrimSpace(line), nil
}

// replyWith answers the first request with reply, then hangs until the
// client closes.
func replyWith(reply string) func(net.Conn, *bufio.Reader) {
	return func(nc net.Conn, br *bufio.Reader) {
		if _, err := readRequest(br); err != nil {
			return
		}
		nc.Write([]byte(reply))
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
		}
	}
}

// waitFailed waits for c to be closed by a failure and returns why.
func waitFailed(t *testing.T, c *Conn) error {
	t.Helper()
	require.Eventually(t, func() bool { return c.Err() != nil }, 2*time.Second, time.Millisecond)
	return c.Err()
}
