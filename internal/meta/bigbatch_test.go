package meta

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Large GetMulti batches: the timeout bounds each reply, not the whole
// batch (and see bigbatch_linux_test.go).

// TestBatchTimeoutPerReply: a server that takes its time over a large
// batch whose keys all miss (quiet: no reply but MN) answers an mn every
// batchMark keys, each well within the timeout; the batch takes far longer
// than the timeout, and succeeds.
func TestBatchTimeoutPerReply(t *testing.T) {
	checkGoroutines(t)
	const n = 12 * batchMark
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		for i := 1; ; i++ {
			line, err := readRequest(br)
			if err != nil {
				return
			}
			if i%(batchMark/2) == 0 {
				time.Sleep(25 * time.Millisecond) // 50 ms a mark, 600 ms in all
			}
			if line == "mn" {
				nc.Write([]byte("MN\r\n"))
			}
		}
	})
	c := s.conn(t, Options{Timeout: 250 * time.Millisecond})
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	start := time.Now()
	got, err := c.GetMulti(context.Background(), keys, GetOptions{Value: true})
	require.NoError(t, err)
	require.Empty(t, got)
	require.Greater(t, time.Since(start), 250*time.Millisecond, "the batch took less than the timeout: the test shows nothing")
	require.NoError(t, c.Noop(context.Background()), "in step after the batch")
}
