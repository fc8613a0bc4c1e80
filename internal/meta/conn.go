package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
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
	// MaxValueSize bounds a value read; 0 means DefaultMaxValueSize, and
	// it is at most MaxItemSize. A larger value fails its request with an
	// error wrapping ErrTooLarge; its bytes are read and dropped, and the
	// connection stays usable. Set it to the server's item_size_max (see
	// [Conn.ItemSizeMax]) to read every value the server stores.
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
// A write over 64 KiB (a large batch or value) goes on in a goroutine of
// its own while its caller reads: memcached stops reading requests once
// its unread replies fill the socket buffers, so a writer that read
// nothing until its write was done could wait for ever.
//
// Replies are read by the callers themselves, one at a time: the caller
// that finds nobody reading becomes the reader (the leader), reads the
// replies in order, hands each to its waiting caller, and once its own is
// in, reads on through the replies already buffered and then passes the
// role to the oldest caller still waiting (or leaves it to the next
// request). So a request alone on the connection costs what it costs
// gomemcache: the caller is woken once, by its reply, and not a second
// time by a reader goroutine handing it over; and under load the replies
// of a burst are delivered together.
//
// A leader whose context ends while it waits for a reply to begin stops
// at once: an interrupt (context.AfterFunc) moves the read deadline to the
// past, which ends the wait without consuming a byte, and the role passes
// on. A reply that has begun is read to its end, which the timeout
// bounds, so the stream never stops mid-reply. A read's deadline is the
// queueing time of the reply being read (or of the leader's own request,
// if later) plus the timeout.
//
// While no request is pending nothing reads, so a reply the server sends
// unasked is noticed when the next request reads it: each request but mn
// is sent with an opaque of its own (O<n>, replacing the caller's), which
// memcached copies into every reply; once the server has echoed one, a
// reply without it, or with another, or for another key, means the
// stream is out of step, and fails the connection. Unasked bytes
// already buffered when the last reply is read fail it at once.
//
// A request whose context ends first returns at once with an error
// wrapping ctx.Err(); its reply is still read, by whoever reads next, and
// discarded, so the connection stays in step and usable. (One exception:
// a goroutine that is writing the queued requests out returns once its
// write, at most 64 KiB, is done, which Timeout bounds; a write blocks
// only if the server stops reading.) A Conn that failed (timeout,
// transport error, malformed reply) is closed and fails every request
// pending on it; it is not reopened: [Pool] dials a new one.
type Conn struct {
	nc        net.Conn
	br        *bufio.Reader
	timeout   time.Duration
	maxValue  *atomic.Int64 // the bound on a value read: the Conn's, or its Pool's
	interrupt func()        // c.interruptLeader, made once: AfterFunc's argument

	outstanding atomic.Int32 // requests queued and not yet answered
	failed      atomic.Bool
	drained     chan struct{} // closed once nc is closed (see drainOut)
	answered    atomic.Uint64 // requests whose replies were read: the first that many queued (see Pool's pins)

	mu      sync.Mutex
	wbuf    []byte  // encoded requests waiting for the writer
	spare   []byte  // the writer's previous buffer, reused
	writing bool    // a goroutine is writing wbuf out
	queue   []*call // pending requests, oldest first, from head
	head    int
	err     error  // why the connection is closed; nil while open
	seq     uint32 // the last opaque sent
	queued  uint64 // requests ever queued

	// The read role, under mu.
	leading     bool            // a caller holds it
	leaderCtx   context.Context // the leader's context while its own reply is due
	reading     *call           // the call whose reply the leader reads; fail leaves it to the leader
	inReply     bool            // that reply has begun: an interrupt must not cut it
	interrupted bool            // an interrupt moved the read deadline

	// The leader's alone.
	echoes  bool  // the server echoed an opaque: every reply must carry it
	scratch Reply // for batch replies
	// While a batch is read, its read deadline moves on as its replies
	// come (see readBatch): extended is when it last moved.
	extending bool
	extended  time.Time
}

// connReader is what a Conn's bufio.Reader reads from: the connection, its
// read deadline moved on before each read while a batch is read (see
// readBatch), so that the clock is read once a read, not once a reply.
type connReader struct{ c *Conn }

func (r connReader) Read(p []byte) (int, error) {
	c := r.c
	if c.extending {
		if now := time.Now(); now.Sub(c.extended) > c.timeout/4 {
			c.nc.SetReadDeadline(now.Add(c.timeout))
			c.extended = now
		}
	}
	return c.nc.Read(p)
}

// NewConn starts a Conn over nc, which it owns: Close closes nc.
func NewConn(nc net.Conn, o Options) *Conn {
	bound := new(atomic.Int64)
	bound.Store(valueBound(o.MaxValueSize))
	return newConn(nc, o, bound)
}

func newConn(nc net.Conn, o Options, maxValue *atomic.Int64) *Conn {
	c := &Conn{
		nc:       nc,
		timeout:  o.timeout(),
		maxValue: maxValue,
		drained:  make(chan struct{}),
	}
	c.br = bufio.NewReaderSize(connReader{c}, MaxLineLen)
	c.interrupt = c.interruptLeader
	return c
}

// valueBound is the bound on a value read that Options.MaxValueSize n
// means.
func valueBound(n int) int64 {
	if n <= 0 {
		return DefaultMaxValueSize
	}
	return int64(min(n, MaxItemSize))
}

// SetMaxValueSize sets the bound on the values read from now on, as
// Options.MaxValueSize does.
func (c *Conn) SetMaxValueSize(n int) { c.maxValue.Store(valueBound(n)) }

// Close closes the connection and fails every pending request with an
// error wrapping ErrConnClosed; a caller reading a reply returns with it
// as soon as its read fails. Close starts no goroutine and leaves none (it
// ends the reading of a connection that timed out, see drainOut); it is
// idempotent and always returns nil.
func (c *Conn) Close() error {
	c.fail(errClosedByClose)
	c.nc.Close()
	<-c.drained
	return nil
}

var errClosedByClose = errors.New("closed by Close")

// closeIfIdle closes the connection, as Close does, if no request is
// outstanding on it, and reports whether it is closed. The check and the
// close are one step under c.mu, where requests are queued: a request
// either is queued first, and the connection stays open for it, or finds
// it closed, and was not sent (see unsentError).
func (c *Conn) closeIfIdle() bool {
	return c.failIf(errClosedByClose, true, false)
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
// request but the ones a reader will finish: the one it is reading, and
// the reader's own.
func (c *Conn) fail(cause error) { c.failIf(cause, false, false) }

// failIf is fail; if idle, only if no request is outstanding, and it
// reports whether the connection is closed. With drain, the connection is
// read to its end before it is closed (see drainOut).
func (c *Conn) failIf(cause error, idle, drain bool) bool {
	c.mu.Lock()
	if idle && c.err == nil && c.outstanding.Load() != 0 {
		c.mu.Unlock()
		return false
	}
	first := c.err == nil
	if first {
		c.err = fmt.Errorf("%w: %w", ErrConnClosed, cause)
		c.failed.Store(true)
	}
	q := c.queue[c.head:]
	c.queue, c.head = nil, 0
	var fails []*call
	for _, cl := range q {
		if cl != c.reading && cl.state.Load() != callLeading {
			fails = append(fails, cl)
		}
	}
	err := c.err
	c.mu.Unlock()
	switch {
	case first && drain:
		go c.drainOut()
	case first:
		// Not under c.mu: a tls.Conn's Close may wait for a blocked write.
		c.nc.Close()
		close(c.drained)
	}
	for _, cl := range fails {
		cl.err = err
		c.deliver(cl)
	}
	return true
}

// do queues cl, writes it (and whatever else is queued) unless another
// goroutine is writing, and waits for its reply or the end of ctx,
// reading replies itself if nobody else is.
//
// If do returns an error, cl is no longer the caller's: do recycled it, or
// whoever reads its reply will. Otherwise the caller reads cl's outcome
// and recycles it.
func (c *Conn) do(ctx context.Context, cl *call) error {
	lead, err := c.start(ctx, cl, true)
	if err != nil {
		return err
	}
	return c.wait(ctx, cl, cl.sent, lead)
}

// start is do's first half: it queues cl and writes it (and whatever else
// is queued) unless another goroutine is writing; if tryLead, it takes the
// read role for cl if nobody holds it, and reports whether it did. If it
// returns an error, cl was not queued, and start recycled it; otherwise
// wait is to follow.
func (c *Conn) start(ctx context.Context, cl *call, tryLead bool) (lead bool, _ error) {
	if err := ctx.Err(); err != nil {
		o, key := cl.op, cl.key
		putCall(cl)
		return false, ctxError(o, key, err)
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		putCall(cl)
		return false, &unsentError{err}
	}
	c.queueLocked(cl, time.Now())
	if !c.writing {
		c.writing = true
		if c.outstanding.Load() > 1 {
			// Others are in flight, so the callers their replies just
			// woke are about to queue theirs: let them, and write all in
			// one. A request alone is written at once.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		c.flushLocked(true)
	}
	if tryLead {
		lead = c.leadLocked(cl)
	}
	c.mu.Unlock()
	return lead, nil
}

// leadLocked takes the read role for cl if nobody holds it, unless cl's
// reply is in already (while its goroutine wrote, the leader may have
// read it and moved on), and reports whether it did. c.mu is held.
func (c *Conn) leadLocked(cl *call) bool {
	lead := !c.leading && c.err == nil && cl.state.CompareAndSwap(callWaiting, callLeading)
	if lead {
		c.leading = true
	}
	return lead
}

// wait is do's second half, for cl, which start queued: it waits for cl's
// reply or the end of ctx, reading replies itself if it holds the read
// role (lead) or is passed it. If it reads, the reply it waits for first
// is due by the later of its request's queueing time and since, plus the
// timeout. It returns as do does.
func (c *Conn) wait(ctx context.Context, cl *call, since time.Time, lead bool) error {
	o, key := cl.op, cl.key
	if lead {
		return c.lead(ctx, cl, since)
	}

	select {
	case <-cl.done:
	case <-ctx.Done():
		if n := cl.n; cl.state.CompareAndSwap(callWaiting, callAbandoned) {
			// Whoever reads its reply recycles cl.
			return &abandonedError{ctxError(o, key, ctx.Err()), c, n}
		}
		<-cl.done
	}
	if cl.state.Load() == callLeading {
		return c.lead(ctx, cl, since) // passed the read role
	}
	return nil
}

// queueLocked numbers cl, encodes it into the write buffer and queues it
// for its reply. c.mu is held.
func (c *Conn) queueLocked(cl *call, now time.Time) {
	c.seq++
	if c.seq == 0 {
		c.seq = 1
	}
	cl.setOpaque(c.seq)
	c.wbuf = cl.encode(c.wbuf)
	cl.sent = now
	c.queued++
	cl.n = c.queued
	c.queue = append(c.queue, cl)
	c.outstanding.Add(1)
}

// abandonedError is the error of a request whose caller left after it was
// queued: it may still run, until the Conn has read its reply (see
// Pool's pins), which is its nth.
type abandonedError struct {
	err error
	c   *Conn
	n   uint64
}

func (e *abandonedError) Error() string { return e.err.Error() }
func (e *abandonedError) Unwrap() error { return e.err }

// settled reports whether the abandoned request can no longer run after a
// request queued now on another connection: its reply was read, or its
// connection failed (see Pool's pins for what that leaves).
func (e *abandonedError) settled() bool {
	return e.c.answered.Load() >= e.n || e.c.failed.Load() && !e.c.draining()
}

// unsentError is the error of a request that found its connection closed
// when it came to queue it: nothing was sent, so it may go on another
// connection, whatever it is (see Pool).
type unsentError struct{ err error }

func (e *unsentError) Error() string { return e.err.Error() }
func (e *unsentError) Unwrap() error { return e.err }

// unsent reports whether err is a request's that was never sent, as its
// connection was closed first.
func unsent(err error) bool {
	_, ok := err.(*unsentError)
	return ok
}

func ctxError(o op, key string, err error) error {
	if key == "" {
		return fmt.Errorf("meta: %s: %w", o, err)
	}
	return fmt.Errorf("meta: %s %q: %w", o, key, err)
}

// deliver hands cl's outcome to its waiting caller, or recycles it if
// that caller left. cl is not the reader's own.
func (c *Conn) deliver(cl *call) {
	c.outstanding.Add(-1)
	if cl.state.CompareAndSwap(callWaiting, callDone) {
		cl.done <- struct{}{}
		return
	}
	putCall(cl)
}
