package selector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// do runs r on the server of the key of hash h, through the gate (see
// gate.go), with failover, and returns the server it ran on last. A request
// that could not be sent goes to the key's server then, twice at most; an
// idempotent one whose connection broke is sent again twice at most, on a
// connection dialed since (see observe), which a dead server refuses and a
// restarted one answers; so is any request whose connection broke in the
// cleanup before it, which was not sent. With no server left it returns
// ErrNoServers.
func (c *Client) do(h uint64, r *keyOp) (*server, error) {
	var err error
	for unsent, brokenConns := 0, 0; ; {
		rt := c.rt.Load()
		s, newStandIn := rt.ownerNow(h)
		if s == nil {
			return nil, c.noServers()
		}
		if r.only != nil && s != r.only {
			return nil, errLeaseMoved
		}
		if r.kind == opDelete && r.seen != rt {
			c.deleteFirst(rt, h, r)
		}
		if newStandIn && r.kind != opGet && r.kind != opDelete {
			// A write waits for the routing that knows the stand-in's
			// gains: one written there before their floors would be
			// below them, and lost. A read there is a miss (below).
			if err = c.awaitRouting(r.ctx, rt); err != nil {
				return nil, err
			}
			continue
		}
		err = nil
		if r.kind.stores() { // not below a floor being taken (see awaitFloor, awaitGain)
			if err = c.awaitFloor(r.ctx, s); err == nil {
				err = c.awaitGain(r.ctx, s, h)
			}
		}
		if err == nil {
			err = c.clean(r.ctx, s, r.key, r.kind.inPlace())
		}
		sent := err == nil
		if sent {
			err = c.runOp(s, r, s != rt.baseOwner(h))
			if err == nil && r.got != nil && (newStandIn || !c.servable(r.ctx, s, r.key, h, r.got.CasID)) {
				r.got, err = nil, memcache.ErrCacheMiss
			}
		}
		f := failureOf(err)
		if f != healthy || s.timeouts.Load() != 0 || s.keptIn.Load() { // a success resets the count
			c.observe(s, f, err)
		}
		switch {
		case (f == unreachable || f == connectTimeout) && unsent < 2:
			unsent++
			c.attempt(r.ctx, rt, h, s, err, true)
			continue
		case f == broken && (r.kind.idempotent() || !sent) && brokenConns < 2:
			brokenConns++
			c.attempt(r.ctx, rt, h, s, err, true)
			continue
		}
		c.attempt(r.ctx, rt, h, s, err, false)
		return s, appError(err)
	}
}

// noServers is ErrNoServers for a request that found no server up: with
// the failure that took the last one out, if the Client has members, so
// that the caller sees why (a wrong port, a certificate not trusted) and
// not only the first time.
func (c *Client) noServers() error {
	if p := c.cause.Load(); p != nil && c.rt.Load().base != nil {
		return fmt.Errorf("%w: %w", ErrNoServers, *p)
	}
	return ErrNoServers
}

// outBecause records err as the failure that takes a server out (see
// noServers).
func (c *Client) outBecause(err error) {
	err = appError(err)
	c.cause.Store(&err)
}

// write runs r, a write or delete, on its key's server, and then the
// cleanup (see afterWrite). It reports whether the cleanup deleted the key
// somewhere.
func (c *Client) write(r *keyOp) (bool, error) {
	if err := checkKey(r.key); err != nil {
		return false, err
	}
	h := c.hash(r.key)
	s, err := c.do(h, r)
	// Even with no server to write to (all out), the key's server must
	// forget it.
	return c.afterWrite(r.ctx, h, r.key, s, err), err
}

// GetContext gets the item for key, as memcache.Client.Get. It fails over,
// and a miss at a key that moved is handed off (see Client).
func (c *Client) GetContext(ctx context.Context, key string) (_ *memcache.Item, opErr error) {
	ctx, st := c.begin(ctx, opNameGet)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return nil, err
	}
	defer c.calls.leave()
	it, err := c.getItem(ctx, key, false)
	if it != nil {
		it.Expiration = 0 // as gomemcache's Get
	}
	return it, err
}

// getItem is GetContext without metrics, for the pool's groups too. With
// ttl, the item has its remaining expiration: in a pool with miss failover,
// a repair copies it so (see pooled.repair).
func (c *Client) getItem(ctx context.Context, key string, ttl bool) (*memcache.Item, error) {
	if c.pool != nil {
		return c.pool.get(ctx, key, func(g *Client) (*memcache.Item, error) { return g.getItem(ctx, key, c.pool.miss) })
	}
	r := keyOp{ctx: ctx, kind: opGet, key: key, ttl: ttl}
	return c.get(&r, c.handoffTTL())
}

// GetAndTouchContext gets the item for key and sets its expiration, as
// memcache.Client.GetAndTouch; a value handed off gets that expiration.
func (c *Client) GetAndTouchContext(ctx context.Context, key string, expiration int32) (_ *memcache.Item, opErr error) {
	ctx, st := c.begin(ctx, opNameGetAndTouch)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return nil, err
	}
	defer c.calls.leave()
	if c.pool != nil {
		it, err := c.pool.get(ctx, key, func(g *Client) (*memcache.Item, error) {
			it, err := g.GetAndTouchContext(ctx, key, expiration)
			if it != nil {
				it.Expiration = expiration // what a repair gives its copies
			}
			return it, err
		})
		if it != nil {
			it.Expiration = 0
		}
		return it, err
	}
	r := keyOp{ctx: ctx, kind: opGetAndTouch, key: key, exp: expiration}
	it, err := c.get(&r, expiration)
	if it != nil {
		it.Expiration = 0 // as gomemcache's GetAndTouch
	}
	return it, err
}

func (c *Client) get(r *keyOp, exp int32) (*memcache.Item, error) {
	if err := checkKey(r.key); err != nil {
		return nil, err
	}
	h := c.hash(r.key)
	s, err := c.do(h, r)
	switch {
	case err == nil:
		return r.got, nil
	case errors.Is(err, memcache.ErrCacheMiss):
		it, cp, err := c.handoff(r.ctx, h, r.key, s, exp, r.kind == opGetAndTouch, handoffRead)
		if cp.moved() { // read again where the key went meanwhile
			r.got = nil
			if _, err := c.do(h, r); err == nil {
				return r.got, nil
			}
		}
		return it, err
	}
	return nil, err
}

// TouchContext sets the expiration of key, as memcache.Client.Touch, at its server.
// A key that moved is handed off first.
func (c *Client) TouchContext(ctx context.Context, key string, seconds int32) (opErr error) {
	ctx, st := c.begin(ctx, opNameTouch)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.all(key, func(g *Client) error { return g.TouchContext(ctx, key, seconds) })
	}
	r := keyOp{ctx: ctx, kind: opTouch, key: key, exp: seconds}
	return c.change(&r)
}

// SetContext writes item, as memcache.Client.Set. It is retried when its server
// fails before it is sent, or its connection breaks.
func (c *Client) SetContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNameSet)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.all(item.Key, func(g *Client) error { return g.SetContext(ctx, item) })
	}
	r := keyOp{ctx: ctx, kind: opSet, key: item.Key, item: item}
	_, err := c.write(&r)
	return err
}

// AddContext writes item if its key holds no value, as memcache.Client.Add. A
// key that moved is handed off first, so that a value where it was counts.
func (c *Client) AddContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNameAdd)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.AddContext(ctx, item) }, func(g *Client) error { return g.SetContext(ctx, item) })
	}
	r := keyOp{ctx: ctx, kind: opAdd, key: item.Key, item: item}
	c.handoffFirst(&r) // the key may hold a value where it was
	_, err := c.write(&r)
	return err
}

// ReplaceContext writes item if its key holds a value, as memcache.Client.Replace.
// A key that moved is handed off first.
func (c *Client) ReplaceContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNameReplace)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.ReplaceContext(ctx, item) }, func(g *Client) error { return g.SetContext(ctx, item) })
	}
	r := keyOp{ctx: ctx, kind: opReplace, key: item.Key, item: item}
	return c.change(&r)
}

// AppendContext appends item's value to its key's, as memcache.Client.Append. A
// key that moved is handed off first.
func (c *Client) AppendContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNameAppend)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.AppendContext(ctx, item) }, func(g *Client) error { return g.DeleteContext(ctx, item.Key) })
	}
	r := keyOp{ctx: ctx, kind: opAppend, key: item.Key, item: item}
	return c.change(&r)
}

// PrependContext prepends item's value to its key's, as memcache.Client.Prepend. A
// key that moved is handed off first.
func (c *Client) PrependContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNamePrepend)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.PrependContext(ctx, item) }, func(g *Client) error { return g.DeleteContext(ctx, item.Key) })
	}
	r := keyOp{ctx: ctx, kind: opPrepend, key: item.Key, item: item}
	return c.change(&r)
}

// CompareAndSwapContext writes item if its key's value has not changed since item
// was read, as memcache.Client.CompareAndSwap.
func (c *Client) CompareAndSwapContext(ctx context.Context, item *memcache.Item) (opErr error) {
	ctx, st := c.begin(ctx, opNameCompareAndSwap)
	defer c.done(ctx, st, &opErr)
	if err := c.admitItem(ctx, item); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return ErrPoolCAS
	}
	r := keyOp{ctx: ctx, kind: opCAS, key: item.Key, item: item}
	_, err := c.write(&r)
	return err
}

// DeleteContext deletes key, as memcache.Client.Delete, also where it was before a
// recent change of ring (first, so that a handoff copying it sees the
// delete), and at its server if that is out for this client (when it
// returns); so it returns ErrCacheMiss only if key was found nowhere it can
// be.
func (c *Client) DeleteContext(ctx context.Context, key string) (opErr error) {
	ctx, st := c.begin(ctx, opNameDelete)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.delete(key)
	}
	if err := checkKey(key); err != nil {
		return err
	}
	h := c.hash(key)
	c.copies.written(key) // a copy that lands after the delete must not be served (see copies)
	r := keyOp{ctx: ctx, kind: opDelete, key: key}
	// Where key was first, then the tombstone: a copy that finds the
	// tombstone deletes the value at its source, and the delete there
	// would not find it, nor tell the caller that key was found.
	c.deleteFirst(c.rt.Load(), h, &r)
	c.entombAt(ctx, h, key)
	s, err := c.do(h, &r) // again, for a routing published meanwhile
	deleted := r.deletedFirst
	if c.afterWrite(ctx, h, key, s, err) { // s may be nil: the key's server must forget it even so
		deleted = true
	}
	if deleted && errors.Is(err, memcache.ErrCacheMiss) {
		return nil
	}
	return err
}

// deleteFirst deletes r's key where it was before a recent change of rt,
// before r deletes it at its server: so a handoff copying it, whose check
// of its source follows its placeholder, sees the delete (see copyTo). It
// runs again for each routing r is sent by: one published between a delete
// begun by the routing before and its send has a former server of the key
// that the delete did not know, whose value a handoff of the new routing
// would copy after the delete (histcheck unseen-change on a loaded machine:
// a Delete begun 0.1 ms before a change, then a read of the value it
// deleted).
func (c *Client) deleteFirst(rt *routing, h uint64, r *keyOp) {
	r.seen = rt
	s := rt.owner(h)
	if l := rt.liveOwner(h); l != s && l != rt.baseOwner(h) { // out since rt was built (see afterWrite)
		r.deletedFirst = c.invalidate(r.ctx, l, r.key, nil) || r.deletedFirst
	}
	if len(rt.past) == 0 {
		return
	}
	var buf [4]*server
	for _, p := range rt.previous(h, s, time.Now(), buf[:0]) {
		r.deletedFirst = c.invalidate(r.ctx, p, r.key, nil) || r.deletedFirst
	}
}

// IncrementContext adds delta to key's value, as memcache.Client.Increment. A key
// that moved is handed off first.
func (c *Client) IncrementContext(ctx context.Context, key string, delta uint64) (_ uint64, opErr error) {
	ctx, st := c.begin(ctx, opNameIncrement)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return 0, err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.counter(key, func(g *Client) (uint64, error) { return g.IncrementContext(ctx, key, delta) })
	}
	r := keyOp{ctx: ctx, kind: opIncr, key: key, delta: delta}
	err := c.change(&r)
	return r.n, err
}

// DecrementContext subtracts delta from key's value, as memcache.Client.Decrement.
// A key that moved is handed off first.
func (c *Client) DecrementContext(ctx context.Context, key string, delta uint64) (_ uint64, opErr error) {
	ctx, st := c.begin(ctx, opNameDecrement)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return 0, err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.counter(key, func(g *Client) (uint64, error) { return g.DecrementContext(ctx, key, delta) })
	}
	r := keyOp{ctx: ctx, kind: opDecr, key: key, delta: delta}
	err := c.change(&r)
	return r.n, err
}

// change runs r, which changes its key's value in place and fails if there
// is none; if it fails so and the key moved, it hands the key off and runs r
// again. Then the cleanup, as for any write.
func (c *Client) change(r *keyOp) error {
	if err := checkKey(r.key); err != nil {
		return err
	}
	h := c.hash(r.key)
	s, err := c.do(h, r)
	if s != nil && (errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrNotStored)) {
		if _, cp, herr := c.handoff(r.ctx, h, r.key, s, c.handoffTTL(), false, handoffRead); herr == nil || cp.moved() {
			s, err = c.do(h, r)
		}
	}
	c.afterWrite(r.ctx, h, r.key, s, err)
	return err
}
