package meta

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// maxDrain bounds the replies a leader reads for others after its own,
// before it passes the read role on.
const maxDrain = 64

// lead holds the read role for own's caller. It reads replies in order,
// handing each to its caller, until own's is in or own's context ends
// before own's reply begins; then it passes the role on, reading first
// the replies already buffered. Each reply is due as readNext's with
// since. It returns as do does.
func (c *Conn) lead(ctx context.Context, own *call, since time.Time) error {
	o, key, n := own.op, own.key, own.n
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, c.interrupt)()
	}
	c.mu.Lock()
	c.leaderCtx = ctx
	c.mu.Unlock()
	for {
		cl, stopped, fatal := c.readNext(since)
		switch {
		case cl == nil: // the connection failed; fail left own to us
			own.err = fatal
		case stopped:
			c.pass(own)
			return &abandonedError{ctxError(o, key, ctx.Err()), c, n}
		case fatal != nil:
			if cl.err == nil {
				cl.err = fatal
			}
			if cl != own {
				c.deliver(cl)
				own.err = fatal
			}
		case cl != own:
			c.deliver(cl)
			continue
		default:
			c.outstanding.Add(-1)
			c.drain()
			c.pass(nil)
			return nil
		}
		c.outstanding.Add(-1)
		return nil
	}
}

// drain reads, for their callers, up to maxDrain replies that are
// already buffered, so that a burst of replies is handed out at once
// rather than one wake-up at a time.
func (c *Conn) drain() {
	c.mu.Lock()
	c.leaderCtx = nil
	c.mu.Unlock()
	now := time.Now()
	for n := 0; n < maxDrain && c.br.Buffered() > 0; n++ {
		cl, _, fatal := c.readNext(now)
		if cl == nil {
			return
		}
		if fatal != nil && cl.err == nil {
			cl.err = fatal
		}
		c.deliver(cl)
		if fatal != nil {
			return
		}
	}
}

// pass gives up the read role: to the oldest caller still waiting, or,
// if none waits, to whichever request comes next. If abandon is not nil,
// it is the leader's own request, whose context ended, and whoever reads
// its reply recycles it. Bytes buffered with no request pending are a
// reply to nothing, and fail the connection.
func (c *Conn) pass(abandon *call) {
	c.mu.Lock()
	c.leaderCtx = nil
	if c.err != nil {
		c.mu.Unlock()
		if abandon != nil { // fail left it to us, and it is out of the queue
			c.outstanding.Add(-1)
			putCall(abandon)
		}
		return
	}
	if abandon != nil {
		abandon.state.Store(callAbandoned)
	}
	for _, cl := range c.queue[c.head:] {
		if cl.state.CompareAndSwap(callWaiting, callLeading) {
			c.mu.Unlock()
			cl.done <- struct{}{}
			return
		}
	}
	if c.head == len(c.queue) && c.br.Buffered() > 0 {
		c.mu.Unlock()
		line, _ := c.br.Peek(c.br.Buffered())
		c.fail(fmt.Errorf("%w: unsolicited reply %q with no request pending", ErrProtocol, trunc(line)))
		return
	}
	c.leading = false
	c.mu.Unlock()
}

// readNext reads the reply of the oldest pending request and takes the
// request off the queue. The reply is due by the later of the request's
// queueing time and since, plus the timeout. It returns the request (nil,
// with the connection's error if it failed, or nil if nothing is
// pending), whether the leader's context ended before the reply began
// (nothing was read then, and the request stays queued), and an error
// after which the stream cannot be trusted: the connection is failed.
func (c *Conn) readNext(since time.Time) (cl *call, stopped bool, fatal error) {
	c.mu.Lock()
	if c.err != nil || c.head == len(c.queue) {
		err := c.err
		c.mu.Unlock()
		return nil, false, err
	}
	cl = c.queue[c.head]
	due := cl.sent
	if since.After(due) {
		due = since
	}
	c.reading, c.inReply, c.interrupted = cl, false, false
	c.nc.SetReadDeadline(due.Add(c.timeout))
	if c.leaderCtx != nil && c.leaderCtx.Err() != nil {
		c.reading = nil
		c.mu.Unlock()
		return cl, true, nil
	}
	c.mu.Unlock()

	_, err := c.br.Peek(1) // waits for the reply to begin; consumes nothing

	c.mu.Lock()
	if err != nil && c.interrupted {
		c.reading = nil
		c.mu.Unlock()
		return cl, true, nil
	}
	c.inReply = true
	if c.interrupted { // the interrupt came as the reply did
		c.nc.SetReadDeadline(due.Add(c.timeout))
	}
	c.mu.Unlock()

	if err != nil {
		fatal = c.readError(err)
	} else {
		fatal = c.readCall(cl)
	}
	if fatal != nil {
		// c.reading is still cl: fail leaves it to us. A reply that timed
		// out may still come, its request run (see drainOut).
		c.failIf(fatal, false, errors.Is(fatal, os.ErrDeadlineExceeded))
	}
	c.mu.Lock()
	c.reading = nil
	if fatal == nil {
		c.popLocked(cl)
	}
	c.mu.Unlock()
	if fatal != nil {
		fatal = c.Err()
	}
	return cl, false, fatal
}

// popLocked takes cl, whose reply was read, off the head of the queue.
func (c *Conn) popLocked(cl *call) {
	if c.head == len(c.queue) || c.queue[c.head] != cl {
		return
	}
	c.queue[c.head] = nil
	c.head++
	c.answered.Add(1)
	if c.head >= 64 && 2*c.head >= len(c.queue) {
		n := copy(c.queue, c.queue[c.head:])
		clear(c.queue[n:])
		c.queue, c.head = c.queue[:n], 0
	}
	if c.head == len(c.queue) {
		c.queue, c.head = c.queue[:0], 0
	}
}

// interruptLeader ends the leader's wait for a reply to begin if the
// leader's context has ended, by moving the read deadline to the past.
// It is called by context.AfterFunc, possibly late: it checks that the
// leader it finds is one whose context ended.
func (c *Conn) interruptLeader() {
	c.mu.Lock()
	if c.reading != nil && !c.inReply && c.leaderCtx != nil && c.leaderCtx.Err() != nil {
		c.interrupted = true
		c.nc.SetReadDeadline(time.Unix(1, 0))
	}
	c.mu.Unlock()
}

// readCall reads cl's reply (or, for a batch, replies up to MN) into cl.
// A reply error the server answered (SERVER_ERROR) goes to cl.err; an
// error after which the stream cannot be trusted is returned.
func (c *Conn) readCall(cl *call) error {
	switch {
	case cl.batch != nil:
		return c.readBatch(cl)
	case cl.op == opStats:
		return c.readStats(cl)
	}
	err := ReadReply(c.br, &cl.rep, int(c.maxValue.Load()))
	switch {
	case err == nil:
		return c.check(cl)
	case errors.Is(err, ErrTooLarge):
		// Read past, with the stream in step if the reply is cl's.
		if ferr := c.check(cl); ferr != nil {
			return ferr
		}
		cl.err = err
		return nil
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
// gets, or a key or opaque not the one sent, or none once the server has
// shown that it echoes opaques (memcached does, on every reply). Each
// means the stream is out of step.
func (c *Conn) check(cl *call) error {
	rep := &cl.rep
	if !cl.op.expects(rep.Status) {
		return fmt.Errorf("%w: reply %s to %s, which never answers so", ErrProtocol, rep.Status, cl.op)
	}
	if rep.Has&RetKey != 0 && string(rep.Key) != cl.key {
		return fmt.Errorf("%w: reply for key %q to %s of key %q", ErrProtocol, trunc(rep.Key), cl.op, cl.key)
	}
	sent := cl.opaque()
	switch {
	case sent == 0:
	case rep.Has&RetOpaque != 0:
		if rep.Opaque != sent {
			return fmt.Errorf("%w: reply with opaque %d to %s %q sent with opaque %d", ErrProtocol, rep.Opaque, cl.op, cl.key, sent)
		}
		c.echoes = true
	case c.echoes:
		return fmt.Errorf("%w: reply %s without the opaque %d sent with %s %q, from a server that echoes them", ErrProtocol, rep.Status, sent, cl.op, cl.key)
	}
	return nil
}

// readBatch reads the replies of a GetMulti batch, hits only, up to its
// last MN. The timeout bounds the wait for each reply, MN included, not
// for all: a large batch takes as long as its replies take to come. The
// read deadline moves on before each read from the connection (see
// connReader), not before each reply, most of which are buffered.
func (c *Conn) readBatch(cl *call) error {
	b := cl.batch
	maxValue := int(c.maxValue.Load())
	c.extending, c.extended = true, time.Now()
	defer func() { c.extending = false }()
	mns := marks(len(b.keys)) // MNs still due
	most := len(b.keys) + mns // replies: one a key at most, and the MNs
	for n := 0; ; n++ {
		if n == most {
			return fmt.Errorf("%w: more replies than the %d keys of a get batch", ErrProtocol, len(b.keys))
		}
		rep := &c.scratch
		err := ReadReply(c.br, rep, maxValue)
		tooLarge := false
		switch {
		case err == nil:
		case errors.Is(err, ErrTooLarge):
			tooLarge = true // read past; its key is checked below
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
			if mns--; mns == 0 {
				return nil
			}
			continue
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
		if tooLarge {
			if cl.err == nil {
				cl.err = err
			}
			continue
		}
		has := rep.Has
		rep.Has &^= RetKey // b.keys[i] is the key; no copy of it
		b.items[i] = itemOf(rep)
		b.items[i].Key, b.items[i].Has = b.keys[i], has&^RetOpaque
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
