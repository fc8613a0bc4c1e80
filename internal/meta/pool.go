package meta

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultMaxConns is a Pool's default connection limit. Each connection
// is pipelined, so a few carry a server's whole load; a second one lets
// requests go on while one is stuck behind a large value.
const DefaultMaxConns = 2

// Pool is a small set of pipelined connections to one server, safe for
// concurrent use.
//
// Connections are dialed lazily, by the first request that finds none
// idle while fewer than MaxConns exist; otherwise a request goes to the
// connection with the fewest outstanding requests. A connection that
// failed is dropped when next seen, and a new one is dialed in its place
// on demand. A request whose connection fails returns that failure; only
// one that found its connection closed before it was queued, and so was
// never sent, goes on another (see sendTries).
//
// A request of one key whose caller left (its context ended) may still
// run; until its reply is read, the key is pinned to its connection: the
// next requests of the key go there too, and memcached runs them after
// it, so that an abandoned write never lands after a later write or
// delete. A request whose reply timed out may still run too: its
// connection is read to its end (see drainOut), and the key stays pinned
// to it until then; its next requests wait for that, within the timeout,
// and go on another connection. A connection that fails otherwise unpins
// its keys.
//
// The zero Pool is not usable; call [NewPool].
type Pool struct {
	dial     func(ctx context.Context) (net.Conn, error)
	opts     Options
	max      int
	maxValue atomic.Int64 // the bound on a value read, shared by the connections

	npins atomic.Int32 // len(pins): the request path's fast check

	mu       sync.Mutex
	conns    []*Conn
	retiring map[*Conn]bool             // out of conns, closed once answered (see CloseIdle)
	pins     map[string]*abandonedError // key -> a request of it its caller left, or that timed out, not yet settled
	draining []*Conn                    // failed, read to their end (see drainOut); Close ends them
	dialing  int
	dialDone chan struct{} // closed and replaced whenever a dial ends
	closed   bool
}

// NewPool returns a Pool that dials connections with dial, which may
// return TCP, TLS or unix-socket connections; its context bounds the dial
// (by the request's context and o's Timeout). Nothing is dialed yet.
func NewPool(dial func(ctx context.Context) (net.Conn, error), o Options) *Pool {
	p := &Pool{dial: dial, opts: o, max: o.MaxConns, dialDone: make(chan struct{})}
	if p.max <= 0 {
		p.max = DefaultMaxConns
	}
	p.maxValue.Store(valueBound(o.MaxValueSize))
	return p
}

// Options returns the Options p was made with.
func (p *Pool) Options() Options { return p.opts }

// SetMaxValueSize sets the bound on the values read, on every connection,
// from now on, as Options.MaxValueSize does.
func (p *Pool) SetMaxValueSize(n int) { p.maxValue.Store(valueBound(n)) }

// MaxValueSize is the bound on a value read from now on.
func (p *Pool) MaxValueSize() int { return int(p.maxValue.Load()) }

// Close closes every connection, failing their pending requests, and
// makes later requests fail with ErrConnClosed. It is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	for c := range p.retiring {
		conns = append(conns, c)
	}
	conns = append(conns, p.draining...)
	p.draining = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// CloseIdle closes the connections with no request outstanding, and
// retires the others: no new request goes to them (but one of a key
// pinned to one, see Pool), and each is closed once the requests on it are
// answered. p stays usable: a later request dials again. It is for a
// server that left, whose connections should not be kept (see gomemcache
// issue #118), and for one whose connection broke: its process likely
// died, and every connection to it with it, so a request sent again must
// not go to one that was open then, but to one dialed since, which a
// dead server refuses and a restarted one answers.
func (p *Pool) CloseIdle() {
	p.mu.Lock()
	var busy []*Conn
	for _, c := range p.conns {
		// A request that took c but did not queue yet goes to another
		// (see sendTries).
		if c.closeIfIdle() {
			continue
		}
		if p.retiring == nil {
			p.retiring = map[*Conn]bool{}
		}
		p.retiring[c] = true
		busy = append(busy, c)
	}
	clear(p.conns)
	p.conns = p.conns[:0]
	p.mu.Unlock()
	for _, c := range busy {
		go p.retire(c)
	}
}

// retire closes c, which CloseIdle took out of p, once the requests on it
// are answered: each mn it queues is answered after them. It reads their
// replies itself if nobody else does, as those of requests whose callers
// left would else stay unread and c open. Each wait is bounded by the
// timeout, after which c fails, and Close ends it at once.
func (p *Pool) retire(c *Conn) {
	for !c.closeIfIdle() {
		c.Noop(context.Background())
	}
	p.mu.Lock()
	delete(p.retiring, c)
	p.mu.Unlock()
}

// sendTries bounds how often a request goes to another connection after
// the one it took was closed before the request was queued, as CloseIdle
// or a failure can do between the pick and the queueing. The closed one is
// out of the pool then, so the next pick is another or a new one; only
// closes that keep coming leave the request with the error, which tells
// that the connection was closed.
const sendTries = 4

var errPoolClosed = fmt.Errorf("%w: pool closed", ErrConnClosed)

// conn picks the connection for one request, dialing one if it must.
func (p *Pool) conn(ctx context.Context) (*Conn, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, errPoolClosed
		}
		if dead := p.dropFailedLocked(); dead != nil {
			p.mu.Unlock()
			for _, c := range dead {
				c.Close()
			}
			p.mu.Lock()
			continue
		}
		var best *Conn
		for _, c := range p.conns {
			if best == nil || c.Outstanding() < best.Outstanding() {
				best = c
			}
		}
		room := len(p.conns)+p.dialing < p.max
		if best != nil && (best.Outstanding() == 0 || !room) {
			p.mu.Unlock()
			return best, nil
		}
		if room {
			return p.dialLocked(ctx, best)
		}
		// No connection yet and every slot is being dialed: wait for one.
		ch := p.dialDone
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("meta: waiting for a connection: %w", ctx.Err())
		}
		p.mu.Lock()
	}
}

// dropFailedLocked removes the failed connections and returns them, to be
// closed without p.mu held; those still read to their end (see drainOut)
// are kept for Close instead.
func (p *Pool) dropFailedLocked() []*Conn {
	var dead []*Conn
	live := p.conns[:0]
	for _, c := range p.conns {
		switch {
		case c.draining():
			p.draining = append(slices.DeleteFunc(p.draining, func(d *Conn) bool { return !d.draining() }), c)
		case c.failed.Load():
			dead = append(dead, c)
		default:
			live = append(live, c)
		}
	}
	clear(p.conns[len(live):])
	p.conns = live
	return dead
}

// dialLocked dials a new connection, with p.mu held on entry and released
// on return. If the dial fails, fallback (if any) is used instead.
func (p *Pool) dialLocked(ctx context.Context, fallback *Conn) (*Conn, error) {
	p.dialing++
	p.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, p.opts.timeout())
	nc, err := p.dial(dctx)
	cancel()
	p.mu.Lock()
	p.dialing--
	close(p.dialDone)
	p.dialDone = make(chan struct{})
	if err != nil {
		p.mu.Unlock()
		if fallback != nil {
			return fallback, nil
		}
		return nil, fmt.Errorf("meta: dial: %w", err)
	}
	c := newConn(nc, p.opts, &p.maxValue)
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return nil, errPoolClosed
	}
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	return c, nil
}

// Detect tells whether the server speaks the meta protocol, by sending mn
// on a connection. It returns nil if it does, an error wrapping ErrNoMeta
// if the server answered ERROR (memcached before 1.6; use the classic
// protocol), or the error that kept it from knowing (dial, timeout).
func (p *Pool) Detect(ctx context.Context) error {
	err := p.Noop(ctx)
	if err != nil && !errors.Is(err, ErrNoMeta) {
		return fmt.Errorf("meta: detecting the meta protocol: %w", err)
	}
	return err
}

// keyConn picks the connection for a request of key: the one key is
// pinned to, if any (see Pool), else as conn does.
func (p *Pool) keyConn(ctx context.Context, key string) (*Conn, error) {
	if p.npins.Load() != 0 {
		p.mu.Lock()
		ae := p.pins[key]
		if ae != nil && ae.settled() {
			p.unpinLocked(key)
			ae = nil
		}
		p.mu.Unlock()
		if ae != nil && !ae.c.failed.Load() {
			return ae.c, nil
		}
		if ae != nil { // its request timed out, and may still run
			if err := ae.c.awaitDrained(ctx, key); err != nil {
				return nil, err
			}
			p.mu.Lock()
			if p.pins[key] == ae {
				p.unpinLocked(key)
			}
			p.mu.Unlock()
		}
	}
	return p.conn(ctx)
}

// pin pins key to the connection of err's request, if its caller left it
// (see Pool). Settled pins are swept as pins are added, so that the keys
// never asked again do not pile up.
func (p *Pool) pin(key string, c *Conn, err error) {
	if err == nil { // the request path: no error, no allocation
		return
	}
	p.pinAbandoned(key, c, err)
}

// pinAbandoned is pin for a request on c that failed.
func (p *Pool) pinAbandoned(key string, c *Conn, err error) {
	var ae *abandonedError
	if !errors.As(err, &ae) {
		if unsent(err) || !c.draining() {
			return
		}
		ae = &abandonedError{err, c, math.MaxUint64} // settled once c is read to its end
	}
	if ae.settled() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pins == nil {
		p.pins = map[string]*abandonedError{}
	}
	if len(p.pins) >= 64 && len(p.pins)&(len(p.pins)-1) == 0 { // at each power of two
		for k, e := range p.pins {
			if e.settled() {
				p.unpinLocked(k)
			}
		}
	}
	if p.pins[key] == nil {
		p.npins.Add(1)
	}
	p.pins[key] = ae // the later request: it runs after any earlier one there
}

func (p *Pool) unpinLocked(key string) {
	delete(p.pins, key)
	p.npins.Add(-1)
}

// send runs f on one of p's connections: key's (see keyConn), pinning key
// to it if f's request was abandoned (see pin), or for keyed false any.
// A request that found its connection closed before it was queued was
// never sent, and goes on another, sendTries times at most.
func send[T any](ctx context.Context, p *Pool, keyed bool, key string, f func(c *Conn) (T, error)) (T, error) {
	for try := 1; ; try++ {
		var c *Conn
		var err error
		if keyed {
			c, err = p.keyConn(ctx, key)
		} else {
			c, err = p.conn(ctx)
		}
		if err != nil {
			var zero T
			return zero, err
		}
		v, err := f(c)
		if err != nil && unsent(err) && try < sendTries {
			continue
		}
		if keyed {
			p.pin(key, c, err)
		}
		return v, err
	}
}

// Get is [Conn.Get] on one of p's connections.
func (p *Pool) Get(ctx context.Context, key string, o GetOptions) (Item, error) {
	return send(ctx, p, true, key, func(c *Conn) (Item, error) { return c.Get(ctx, key, o) })
}

// Set is [Conn.Set] on one of p's connections.
func (p *Pool) Set(ctx context.Context, key string, value []byte, o SetOptions) (Item, error) {
	return send(ctx, p, true, key, func(c *Conn) (Item, error) { return c.Set(ctx, key, value, o) })
}

// Delete is [Conn.Delete] on one of p's connections.
func (p *Pool) Delete(ctx context.Context, key string, o DeleteOptions) error {
	_, err := send(ctx, p, true, key, func(c *Conn) (struct{}, error) { return struct{}{}, c.Delete(ctx, key, o) })
	return err
}

// Arith is [Conn.Arith] on one of p's connections.
func (p *Pool) Arith(ctx context.Context, key string, o ArithOptions) (Counter, error) {
	return send(ctx, p, true, key, func(c *Conn) (Counter, error) { return c.Arith(ctx, key, o) })
}

// GetMulti is [Conn.GetMulti] on one of p's connections: all of keys go to
// this one server in one batch.
func (p *Pool) GetMulti(ctx context.Context, keys []string, o GetOptions) (map[string]Item, error) {
	return send(ctx, p, false, "", func(c *Conn) (map[string]Item, error) { return c.GetMulti(ctx, keys, o) })
}

// StartGetMulti is [Conn.StartGetMulti] on one of p's connections: all of
// keys go to this one server in one batch.
func (p *Pool) StartGetMulti(ctx context.Context, keys []string, o GetOptions) (Batch, error) {
	return send(ctx, p, false, "", func(c *Conn) (Batch, error) { return c.StartGetMulti(ctx, keys, o) })
}

// ItemSizeMax is [Conn.ItemSizeMax] on one of p's connections.
func (p *Pool) ItemSizeMax(ctx context.Context) (int, error) {
	return send(ctx, p, false, "", func(c *Conn) (int, error) { return c.ItemSizeMax(ctx) })
}

// Noop is [Conn.Noop] on one of p's connections.
func (p *Pool) Noop(ctx context.Context) error {
	_, err := send(ctx, p, false, "", func(c *Conn) (struct{}, error) { return struct{}{}, c.Noop(ctx) })
	return err
}
