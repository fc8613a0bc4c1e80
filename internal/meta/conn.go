package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds how long the oldest outstanding reply on a
// connection may take, as gomemcache's DefaultTimeout.
const DefaultTimeout = 500 * time.Millisecond

// Options configure a [Conn] or a [Pool]. The zero value means the
// defaults.
type Options struct {
	// Timeout bounds how long the oldest pending request may wait for its
	// reply once queued, how long a write may block, and a Pool's dial; 0
	// means DefaultTimeout. When a reply or a write is late, the
	// connection is closed and every pending request fails with an error
	// wrapping os.ErrDeadlineExceeded (and ErrConnClosed).
	Timeout time.Duration
	// MaxValueSize bounds a value read; 0 means DefaultMaxValueSize. A
	// larger value is a protocol error that closes the connection.
	MaxValueSize int
	// MaxConns is the most connections a Pool keeps; 0 means
	// DefaultMaxConns. A Conn ignores it.
	MaxConns int
}

func (o Options) timeout() time.Duration {
	if o.Timeout <= 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// Conn is a pipelined meta-protocol connection, safe for concurrent use.
//
// Requests from all goroutines are written in the order they are queued
// and their replies are matched in that order (memcached answers in
// order). Writes are coalesced: a goroutine that finds no write in
// progress becomes the writer and writes everything queued, its own
// request and those that arrived meanwhile, in as few writes as it takes;
// goroutines that find a writer at work queue their bytes and only wait.
//
// One reader goroutine per connection reads the replies and hands each
// to the oldest pending request. It is always reading, so a reply that
// arrives when nothing is pending is noticed at once as an error. Its
// read deadline is the oldest pending request's queueing time plus the
// timeout (none when idle).
//
// Why a reader goroutine rather than a reader under a lock (the waiting
// goroutine reading replies itself): a goroutine blocked in a read cannot
// give up when its own context ends without leaving the stream mid-reply
// or making someone else read for it, so a reader under a lock either
// ignores cancellation until the reply or needs a watcher per request.
// The cost is one goroutine hand-off per reply, which shows in the
// latency of one request at a time (see the benchmarks), not in
// throughput, where pipelining wins.
//
// Each request but mn is sent with an opaque of its own (O<n>, replacing
// the caller's), which memcached copies into its reply; a reply whose
// opaque (or key, when returned) is not its request's means the stream is
// out of step, and fails the connection.
//
// A request whose context ends first returns at once with an error
// wrapping ctx.Err(); its reply is still read, and discarded, so the
// connection stays in step and usable. (One exception: a goroutine that
// is writing the queued requests out returns once its write is done,
// which Timeout bounds; a write blocks only if the server stops reading.) A Conn that failed (timeout,
// transport error, malformed reply) is closed and fails every request
// pending on it; it is not reopened: [Pool] dials a new one.
type Conn struct {
	nc       net.Conn
	br       *bufio.Reader
	timeout  time.Duration
	maxValue int
	done     chan struct{} // closed when the reader goroutine has returned

	outstanding atomic.Int32 // requests queued and not yet answered
	failed      atomic.Bool

	mu      sync.Mutex
	wbuf    []byte  // encoded requests waiting for the writer
	spare   []byte  // the writer's previous buffer, reused
	writing bool    // a goroutine is writing wbuf out
	queue   []*call // pending requests, oldest first, from head
	head    int
	reading *call  // the request whose reply the reader is reading
	err     error  // why the connection is closed; nil while open
	seq     uint32 // the last opaque sent

	scratch Reply // the reader's, for batch replies
}

// NewConn starts a Conn over nc, which it owns: Close closes nc.
func NewConn(nc net.Conn, o Options) *Conn {
	c := &Conn{
		nc:       nc,
		br:       bufio.NewReaderSize(nc, MaxLineLen),
		timeout:  o.timeout(),
		maxValue: o.MaxValueSize,
		done:     make(chan struct{}),
	}
	if c.maxValue <= 0 {
		c.maxValue = DefaultMaxValueSize
	}
	go c.readLoop()
	return c
}

// Close closes the connection, fails every pending request with an error
// wrapping ErrConnClosed, and waits for the reader goroutine to return.
// It is idempotent and always returns nil.
func (c *Conn) Close() error {
	c.fail(errors.New("closed by Close"))
	<-c.done
	return nil
}

// Err returns nil while the connection is usable, and why it was closed
// once it is not.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Outstanding is the number of requests sent or queued and not answered.
func (c *Conn) Outstanding() int { return int(c.outstanding.Load()) }

// fail closes the connection for cause, once, and fails every pending
// request.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	first := c.err == nil
	if first {
		c.err = fmt.Errorf("%w: %w", ErrConnClosed, cause)
		c.failed.Store(true)
	}
	q := c.queue[c.head:]
	c.queue, c.head = nil, 0
	reading := c.reading
	err := c.err
	c.mu.Unlock()
	if first {
		// Not under c.mu: a tls.Conn's Close may wait for a blocked write.
		c.nc.Close()
	}
	for _, cl := range q {
		if cl == reading {
			continue // the reader delivers it when its read fails
		}
		cl.err = err
		c.deliver(cl)
	}
}

// do queues cl, writes it (and whatever else is queued) unless another
// goroutine is writing, and waits for its reply or the end of ctx.
//
// If do returns an error, cl is no longer the caller's: do recycled it, or
// the reader will once the reply is in. Otherwise the caller reads cl's
// outcome and recycles it.
func (c *Conn) do(ctx context.Context, cl *call) error {
	o, key := cl.op, cl.key
	if err := ctx.Err(); err != nil {
		putCall(cl)
		return ctxError(o, key, err)
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		putCall(cl)
		return err
	}
	c.seq++
	if c.seq == 0 {
		c.seq = 1
	}
	cl.setOpaque(c.seq)
	c.wbuf = cl.encode(c.wbuf)
	now := time.Now()
	if c.head == len(c.queue) {
		c.nc.SetReadDeadline(now.Add(c.timeout))
	}
	cl.sent = now
	c.queue = append(c.queue, cl)
	c.outstanding.Add(1)
	if !c.writing {
		c.writing = true
		c.flushLocked()
		c.writing = false
	}
	c.mu.Unlock()

	select {
	case <-cl.done:
		return nil
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callWaiting, callAbandoned) {
			// The reader recycles cl once its reply is in.
			return ctxError(o, key, ctx.Err())
		}
		<-cl.done
		return nil
	}
}

func ctxError(o op, key string, err error) error {
	if key == "" {
		return fmt.Errorf("meta: %s: %w", o, err)
	}
	return fmt.Errorf("meta: %s %q: %w", o, key, err)
}

// flushLocked writes c.wbuf out, with c.mu held except during each
// write, until nothing more is queued.
func (c *Conn) flushLocked() {
	for len(c.wbuf) > 0 && c.err == nil {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
		_, err := c.nc.Write(buf)
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
}

// deliver hands cl's outcome to its waiting goroutine, or recycles it if
// that goroutine left.
func (c *Conn) deliver(cl *call) {
	c.outstanding.Add(-1)
	if cl.state.CompareAndSwap(callWaiting, callDone) {
		cl.done <- struct{}{}
		return
	}
	putCall(cl)
}
