package selector

import (
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unansweredAddr returns a loopback address whose TCP handshakes never
// complete: its listener has a backlog of 0 that one connection fills, so
// Linux drops the SYNs that follow.
func unansweredAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	c, err := net.DialTimeout("tcp", addr, time.Second) // fills the backlog
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	if c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond); err == nil {
		c.Close()
		t.Skip("the kernel completes handshakes past a full backlog")
	}
	return addr
}

// NewServerList whose ctx ends while it dials an API server that does not
// answer leaves no dial behind: net/http dials on a context detached from
// the request, which Close cancels, so without the client ending it the
// dial would hold a goroutine and a socket for dialTimeout (30s).
func TestNewServerListEndsDials(t *testing.T) {
	f := newFakeAPI(t)
	addr := unansweredAddr(t)
	before := goroutines()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, WithAPIServer("https://"+addr))...)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	dialing := func() bool {
		for id, g := range goroutines() {
			if _, ok := before[id]; !ok && strings.Contains(g, "dialConnFor") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(2 * time.Second)
	for dialing() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	assert.False(t, dialing(), "a dial is still in progress after NewServerList returned")
	checkNoLeaks(t, before)
}
