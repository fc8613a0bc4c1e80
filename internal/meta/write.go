package meta

import (
	"fmt"
	"time"
)

// Writes: up to maxInlineWrite bytes are written by the goroutine that
// queued them, which cannot block for long, since the socket buffers on
// both sides hold more (Linux's defaults: 16 KiB to send, 128 KiB to
// receive, and more as they grow); a larger write goes on in the
// background (see flushLocked). Writes go out in pieces of writePiece,
// each within the timeout.
const (
	maxInlineWrite = 64 << 10
	writePiece     = 64 << 10
)

// flushBehind is flushLocked on a goroutine of its own, which ends when
// the queue is written out or the connection fails (a write is bounded
// by the timeout, and Close ends it).
func (c *Conn) flushBehind() {
	c.mu.Lock()
	c.flushLocked(false)
	c.mu.Unlock()
}

// flushLocked writes c.wbuf out, with c.mu held except during each
// write, until nothing more is queued; then the write role is free. If
// inline, the caller is a request's goroutine, which goes on to read:
// it leaves a write over maxInlineWrite to flushBehind, since such a
// write may block until replies are read (memcached stops reading once
// its replies fill the socket buffers, as a large GetMulti's hits do).
func (c *Conn) flushLocked(inline bool) {
	for len(c.wbuf) > 0 && c.err == nil {
		if inline && len(c.wbuf) > maxInlineWrite {
			go c.flushBehind() // which holds the write role on
			return
		}
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		err := c.write(buf)
		c.mu.Lock()
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		} else {
			c.spare = nil
		}
		if err != nil {
			c.mu.Unlock()
			c.fail(fmt.Errorf("writing to %s: %w", c.nc.RemoteAddr(), err))
			c.mu.Lock()
		}
	}
	c.writing = false
}

// write writes buf in pieces, each due within the timeout: a long write
// is fine as long as the server reads it.
func (c *Conn) write(buf []byte) error {
	for len(buf) > 0 {
		n := min(len(buf), writePiece)
		c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
		if _, err := c.nc.Write(buf[:n]); err != nil {
			return err
		}
		buf = buf[n:]
	}
	return nil
}
