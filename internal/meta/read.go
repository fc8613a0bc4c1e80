package meta

import (
	"errors"
	"fmt"
	"net"
	"time"
)

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
