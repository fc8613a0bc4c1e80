package meta

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// A request whose reply does not come within the timeout may still run:
// its bytes are at the server, which is hung (SIGSTOP, a stalled worker
// thread) or only slow, and runs it when it can. A later request of its key
// on another connection may run first (memcached orders one connection's
// requests, not two), so that a write that timed out would land after a
// later write or delete of its key, and be served.
//
// So a connection whose reply timed out is not closed at once: it is
// half-closed, so that the server reads what was sent, runs it and closes
// its side, and it is read to its end in the background, the replies
// dropped. Until then the keys of its requests are pinned to it (see Pool),
// and their next requests wait for the end, within the timeout. The
// server's EOF (or a reset: the process died, and what it had not run with
// it) ends the wait; so do maxDrainWait and maxDrainBytes, after which a
// server that resumes may still run what it was sent, as with a connection
// that cannot be half-closed, which is closed at once.
const (
	maxDrainWait  = 10 * time.Minute
	maxDrainBytes = 64 << 20
)

// drainOut half-closes c, reads it to its end, closes it, and then closes
// c.drained. Its caller is c's leader, which read last and will not read
// again: c failed.
func (c *Conn) drainOut() {
	defer close(c.drained)
	defer c.nc.Close()
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(maxDrainWait))
	io.Copy(io.Discard, io.LimitReader(c.br, maxDrainBytes))
}

// draining reports whether c failed and is still read to its end (see
// drainOut): a request sent on it may still run.
func (c *Conn) draining() bool {
	if !c.failed.Load() {
		return false
	}
	select {
	case <-c.drained:
		return false
	default:
		return true
	}
}

// awaitDrained waits, within the timeout and ctx, for c, which failed, to
// be read to its end: the server has then run (or dropped) every request
// sent on it.
func (c *Conn) awaitDrained(ctx context.Context, key string) error {
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case <-c.drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("meta: waiting for the server to run an earlier request of %q: %w", trunc([]byte(key)), ctx.Err())
	case <-t.C:
		return fmt.Errorf("meta: the server did not run an earlier request of %q, on a connection that timed out, within %v: %w", trunc([]byte(key)), c.timeout, os.ErrDeadlineExceeded)
	}
}
