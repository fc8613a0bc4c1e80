package selector

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestGetMultiLarge gets 200,000 keys of 400-byte values from one server
// in one GetMulti: 80 MB of replies, far more than the socket buffers
// hold, so memcached stops reading the batch until its replies are read.
// The Client reads them while it writes. It logs its time against
// gomemcache's GetMulti of the same keys.
//
// Both clients have a timeout of 5 s. Each reply is due within the timeout
// of the one before (as in gomemcache), not the whole batch (see
// internal/meta's TestBatchTimeoutPerReply), but on a loaded machine a
// goroutine can wait longer than the test client's 300 ms for a CPU, and
// the timeout is not what this test is about.
//
// Under -race it gets 50,000 keys: with 200,000 the test took over 6 s
// under -race on a two-core machine (the load, both GetMultis, and 160 MB
// of values through the race detector's allocator), 2 s with 50,000,
// whose 20 MB of replies are still far past the socket buffers.
func TestGetMultiLarge(t *testing.T) {
	n := 200_000
	if raceEnabled {
		n = 50_000
	}
	const size = 400
	ms := startMemcached(t, 1)
	ms[0].restartWith("-m", "256")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("getmulti-large-%06d", i)
	}
	loadQuietly(t, ms[0].addr, keys, size)
	c, _ := newTestClient(t, addrsOf(ms), WithTimeout(5*time.Second))
	require.NoError(t, c.Ping()) // the first contact, not timed

	runtime.GC() // each client starts from the same heap
	start := time.Now()
	got, err := c.GetMulti(keys)
	took := time.Since(start)
	require.NoError(t, err)
	require.Len(t, got, n)
	for _, i := range []int{0, 1, n / 2, n - 1} {
		require.Equal(t, valueOf(keys[i], size), got[keys[i]].Value, keys[i])
	}

	gm := memcache.New(ms[0].addr)
	gm.Timeout = 5 * time.Second
	got = nil
	runtime.GC()
	start = time.Now()
	want, err := gm.GetMulti(keys)
	gmTook := time.Since(start)
	require.NoError(t, err)
	require.Len(t, want, n)
	t.Logf("GetMulti of %d keys of %d bytes from one server: the Client %v, gomemcache %v (%.2fx)",
		n, size, took.Round(time.Millisecond), gmTook.Round(time.Millisecond), took.Seconds()/gmTook.Seconds())
}

// valueOf is key's value of size bytes in loadQuietly.
func valueOf(key string, size int) []byte {
	v := make([]byte, size)
	for i := range v {
		v[i] = key[i%len(key)]
	}
	return v
}

// loadQuietly stores keys at addr, each with its valueOf, in one pipeline
// of quiet sets (no reply but errors) ended by mn.
func loadQuietly(t *testing.T, addr string, keys []string, size int) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Minute))
	w := bufio.NewWriterSize(nc, 64<<10)
	for _, k := range keys {
		fmt.Fprintf(w, "ms %s %d q\r\n%s\r\n", k, size, valueOf(k, size))
	}
	w.WriteString("mn\r\n")
	require.NoError(t, w.Flush())
	line, err := bufio.NewReader(nc).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "MN\r\n", line, "an error storing the keys")
}
