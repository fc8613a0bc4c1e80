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
	// Timeout bounds how long a request may wait for its reply once sent,
	// and how long a write may block; 0 means DefaultTimeout. When it
	// passes, the connection is closed and every pending request fails with
	// an error wrapping os.ErrDeadlineExceeded.
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
// A request whose context ends first returns at once with an error
// wrapping ctx.Err(); its reply is still read, and discarded, so the
// connection stays in step and usable. A Conn that failed (timeout,
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
	reading *call // the request whose reply the reader is reading
	err     error // why the connection is closed; nil while open

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
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrConnClosed, cause)
		c.failed.Store(true)
		c.nc.Close()
	}
	q := c.queue[c.head:]
	c.queue, c.head = nil, 0
	reading := c.reading
	err := c.err
	c.mu.Unlock()
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

// readLoop reads replies and matches them to pending requests in order,
// until the connection fails or is closed.
func (c *Conn) readLoop() {
	defer close(c.done)
	for {
		if _, err := c.br.Peek(1); err != nil {
			c.fail(c.readError(err))
			return
		}
		c.mu.Lock()
		if c.head == len(c.queue) {
			c.mu.Unlock()
			line, _ := c.br.Peek(c.br.Buffered())
			c.fail(fmt.Errorf("%w: unsolicited reply %q with no request pending", ErrProtocol, trunc(line)))
			return
		}
		cl := c.queue[c.head]
		c.reading = cl // fail leaves it to us
		c.mu.Unlock()

		fatal := c.readCall(cl)

		c.mu.Lock()
		c.reading = nil
		if c.head < len(c.queue) && c.queue[c.head] == cl {
			c.queue[c.head] = nil
			c.head++
			if c.head >= 64 && 2*c.head >= len(c.queue) {
				n := copy(c.queue, c.queue[c.head:])
				clear(c.queue[n:])
				c.queue, c.head = c.queue[:n], 0
			}
			if c.head == len(c.queue) {
				c.queue, c.head = c.queue[:0], 0
				c.nc.SetReadDeadline(time.Time{})
			} else {
				c.nc.SetReadDeadline(c.queue[c.head].sent.Add(c.timeout))
			}
		}
		c.mu.Unlock()
		if fatal != nil {
			c.fail(fatal)
			if cl.err == nil {
				cl.err = c.Err()
			}
			c.deliver(cl)
			return
		}
		c.deliver(cl)
	}
}

// readCall reads cl's reply (or, for a batch, replies up to MN) into cl.
// A reply error the server answered (SERVER_ERROR) goes to cl.err; an
// error after which the stream cannot be trusted is returned.
func (c *Conn) readCall(cl *call) error {
	if cl.batch != nil {
		return c.readBatch(cl)
	}
	err := ReadReply(c.br, &cl.rep, c.maxValue)
	switch {
	case err == nil:
		return cl.check()
	case isServerError(err) || isClientError(err):
		// memcached answers these per command and stays in step: after a
		// refused ms it swallows the value (proto_text.c, conn_swallow).
		// The requests this package encodes are well formed, so a
		// CLIENT_ERROR is a refusal such as ma of a non-numeric value.
		cl.err = err
		return nil
	case errors.Is(err, ErrUnknownCommand):
		cl.err = err
		if cl.op == opNoop {
			cl.err = fmt.Errorf("%w: mn answered ERROR (%w)", ErrNoMeta, err)
		}
		// An ms's value would be read as a command of its own.
		return fmt.Errorf("server answered %s with ERROR, so it may not read the stream as sent: %w", cl.op, err)
	}
	return c.readError(err)
}

// check reports a reply that cannot be cl's: a status its command never
// gets, or a key or opaque not the one sent. Either means the stream is
// out of step.
func (cl *call) check() error {
	rep := &cl.rep
	if !cl.op.expects(rep.Status) {
		return fmt.Errorf("%w: reply %s to %s, which never answers so", ErrProtocol, rep.Status, cl.op)
	}
	if rep.Has&RetKey != 0 && string(rep.Key) != cl.key {
		return fmt.Errorf("%w: reply for key %q to %s of key %q", ErrProtocol, trunc(rep.Key), cl.op, cl.key)
	}
	if rep.Has&RetOpaque != 0 && rep.Opaque != cl.opaque() {
		return fmt.Errorf("%w: reply with opaque %d to %s %q sent with opaque %d", ErrProtocol, rep.Opaque, cl.op, cl.key, cl.opaque())
	}
	return nil
}

// readBatch reads the replies of a GetMulti batch, hits only, up to MN.
func (c *Conn) readBatch(cl *call) error {
	b := cl.batch
	for {
		rep := &c.scratch
		err := ReadReply(c.br, rep, c.maxValue)
		switch {
		case err == nil:
		case isServerError(err) || isClientError(err):
			if cl.err == nil {
				cl.err = err
			}
			continue
		case errors.Is(err, ErrUnknownCommand):
			cl.err = err
			return fmt.Errorf("server answered a get batch with %w", err)
		case err != nil:
			return c.readError(err)
		}
		switch rep.Status {
		case StatusMN:
			return nil
		case StatusEN:
			continue // not sent with q, but harmless
		case StatusVA, StatusHD:
		default:
			return fmt.Errorf("%w: reply %s in a get batch", ErrProtocol, rep.Status)
		}
		i := int(rep.Opaque) - 1
		if rep.Has&RetOpaque == 0 || i < 0 || i >= len(b.keys) {
			return fmt.Errorf("%w: reply in a get batch of %d with opaque %d, not one sent", ErrProtocol, len(b.keys), rep.Opaque)
		}
		if rep.Has&RetKey != 0 && string(rep.Key) != b.keys[i] {
			return fmt.Errorf("%w: reply in a get batch for key %q with the opaque of key %q", ErrProtocol, trunc(rep.Key), b.keys[i])
		}
		has := rep.Has
		rep.Has &^= RetKey // b.keys[i] is the key; no copy of it
		b.items[i] = itemOf(rep)
		b.items[i].Key, b.items[i].Has = b.keys[i], has
		b.hit[i] = true
		if rep.Status == StatusVA {
			rep.Value = nil // the item owns it now
		}
	}
}

// readError names a failed read: a timeout, the server closing, or the
// stream being out of step.
func (c *Conn) readError(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("no reply from %s within %v: %w", c.nc.RemoteAddr(), c.timeout, err)
	}
	return fmt.Errorf("reading from %s: %w", c.nc.RemoteAddr(), err)
}

// isServerError and isClientError are functions so that their errors.As
// target is allocated on error paths only.
func isServerError(err error) bool {
	var se *ServerError
	return errors.As(err, &se)
}

func isClientError(err error) bool {
	var ce *ClientError
	return errors.As(err, &ce)
}
