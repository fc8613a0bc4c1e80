package meta

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A large GetMulti batch: memcached stops reading a batch while its
// replies fill the socket buffers, so a batch is read while it is
// written.

// TestRealBatchPastTheBuffers gets, in one batch, far more than the socket
// buffers hold: 40,000 keys of 400 bytes (16 MB of replies) on a
// connection whose buffers are 16 KiB, as a pod's may be small.
func TestRealBatchPastTheBuffers(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t, "-m", "64")
	const n, size = 40_000, 400
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("batch-%05d", i)
	}
	storeQuietly(t, m, keys, size)
	nc, err := dialSmallBuffers(m.addr, 16<<10)
	require.NoError(t, err)
	c := NewConn(nc, Options{Timeout: 2 * time.Second})
	defer c.Close()
	got, err := c.GetMulti(context.Background(), keys, GetOptions{Value: true})
	require.NoError(t, err)
	require.Len(t, got, n)
	for _, k := range []string{keys[0], keys[n/2], keys[n-1]} {
		require.Equal(t, strings.Repeat(k[len(k)-1:], size), string(got[k].Value))
	}
	require.NoError(t, c.Noop(context.Background()), "in step after the batch")
}

// storeQuietly stores keys at m in one pipeline of quiet sets, each value
// size bytes of its key's last byte.
func storeQuietly(t *testing.T, m *memcached, keys []string, size int) {
	t.Helper()
	nc, err := m.dial(context.Background())
	require.NoError(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	w := bufio.NewWriterSize(nc, 64<<10)
	for _, k := range keys {
		fmt.Fprintf(w, "ms %s %d q\r\n%s\r\n", k, size, strings.Repeat(k[len(k)-1:], size))
	}
	w.WriteString("mn\r\n")
	require.NoError(t, w.Flush())
	line, err := bufio.NewReader(nc).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "MN\r\n", line)
}

// dialSmallBuffers dials addr with socket buffers of size bytes, set
// before the connection is made: set after, a smaller receive buffer than
// the window offered stalls the stream.
func dialSmallBuffers(addr string, size int) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size)
			if err == nil {
				err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, size)
			}
		})
		if cerr != nil {
			return cerr
		}
		return err
	}}
	return d.DialContext(context.Background(), "tcp", addr)
}
