package selector

import (
	"bytes"
	"errors"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// retry says when a request that failed on its server is sent again, to
// the key's server then (the next one along the ring if that one went out).
type retry int

const (
	// ifNotSent retries only a request that was not sent: its connection
	// could not be made. Every operation is retried so.
	ifNotSent retry = iota
	// ifIdempotent also retries once after a broken connection, when the
	// server may have run the request: for operations that leave the same
	// state when run twice (get, set, delete, touch). add, append, prepend,
	// cas, incr and decr are not: a second run would report a stored add as
	// not stored, or apply a change twice. A timeout is never retried: the
	// server may be hung, and a retry would wait as long again.
	ifIdempotent
)

// do runs op on the server of the key of hash h, with failover (see
// retry), and returns the server it ran on last. A request that could not
// be sent goes to the key's server then, twice at most; one whose
// connection broke is sent again twice at most, as a connection that a
// request in flight puts back after its server died may be broken too.
func (c *Client) do(h uint64, r retry, op func(*memcache.Client) error) (*server, error) {
	var err error
	var s *server
	for unsent, brokenConns := 0, 0; ; {
		if s = c.rt.Load().owner(h); s == nil {
			if err == nil {
				err = ErrNoServers
			}
			return nil, appError(err)
		}
		err = s.call(op)
		f := failureOf(err)
		c.observe(s, f, err)
		switch {
		case f == unreachable && unsent < 2:
			unsent++
			continue
		case f == broken && r == ifIdempotent && brokenConns < 2:
			brokenConns++
			continue
		}
		return s, appError(err)
	}
}

// write runs op, a write or delete of key, on its server, and makes sure that
// no other server that held key keeps an old value (see afterWrite). It
// reports whether afterWrite deleted key somewhere.
func (c *Client) write(key string, r retry, op func(*memcache.Client) error) (bool, error) {
	if !legalKey(key) {
		return false, memcache.ErrMalformedKey
	}
	h := c.hash(key)
	s, err := c.do(h, r, op)
	// Even with no server to write to (all out), the key's server must
	// forget it.
	return c.afterWrite(h, key, s), err
}

// afterWrite deletes key, just written to or deleted at s (nil if none), where an old
// value of it could otherwise be read later: at its member owner if that is
// out for this client (replayed when it returns), and where it was before a
// recent change of ring (a handoff's source). It reports whether it deleted
// key somewhere.
func (c *Client) afterWrite(h uint64, key string, s *server) bool {
	rt := c.rt.Load()
	deleted := false
	b := rt.baseOwner(h)
	if b != nil && b != s {
		deleted = c.invalidate(b, key)
	}
	if len(rt.past) == 0 {
		return deleted
	}
	var buf [4]*server
	for _, p := range rt.previous(h, s, time.Now(), buf[:0]) {
		if p != b {
			deleted = c.invalidate(p, key) || deleted
		}
	}
	return deleted
}

// handoff looks for key, which missed at s, where it was before a recent
// change of ring. A value found there, and not overwritten since (see
// invalidated), is copied to s with add, so that a newer value at s is
// never replaced, and deleted where it was, so that it cannot come back
// from there later; the item returned is s's copy, with s's CAS id, when
// the copy could be read back. The copy expires after exp seconds.
func (c *Client) handoff(h uint64, key string, s *server, exp int32) (*memcache.Item, error) {
	rt := c.rt.Load()
	if len(rt.past) == 0 {
		return nil, memcache.ErrCacheMiss
	}
	var buf [4]*server
	for _, p := range rt.previous(h, s, time.Now(), buf[:0]) {
		if !p.readable() || c.invalidated(p, key) {
			continue
		}
		var it *memcache.Item
		err := p.call(func(mc *memcache.Client) (err error) { it, err = mc.Get(key); return })
		if f := failureOf(err); f != healthy {
			c.sourceFailed(p, f, err)
			continue
		}
		if err != nil {
			continue // a miss
		}
		return c.copyTo(s, p, it, exp), nil
	}
	return nil, memcache.ErrCacheMiss
}

// copyTo adds it, read from p, to s, deletes it at p, and returns s's copy,
// or it if s's cannot be read. If p's value changed or went after it was
// read, a write or delete raced with the copy, which could have put an old
// value back after a delete at s: the copy is deleted again (a miss later
// is safe, a stale value is not). Delete deletes where a key was before it
// deletes at its server, so that this check sees it.
//
// Where s has the key already, it is not deleted at p: s's value is a
// write's, which deletes at p itself, or another copy's, whose check of p
// would take that delete for a racing Delete and undo the copy (two reads
// handing one key off at once lost it so, 1 key in about 3000 moved). Where
// s failed, p keeps the key for the next read.
func (c *Client) copyTo(s, p *server, it *memcache.Item, exp int32) *memcache.Item {
	cp := *it
	cp.Expiration = exp
	err := s.call(func(mc *memcache.Client) error { return mc.Add(&cp) })
	switch {
	case err == nil:
		var now *memcache.Item
		perr := p.call(func(mc *memcache.Client) (err error) { now, err = mc.Get(it.Key); return })
		if perr != nil || now.CasID != it.CasID {
			c.undoCopy(s, &cp)
			c.reportHandoff(p, s, HandoffUndone)
			return it
		}
		p.call(func(mc *memcache.Client) error { return mc.Delete(it.Key) })
		c.reportHandoff(p, s, HandoffCopied)
	case !errors.Is(err, memcache.ErrNotStored):
		c.reportHandoff(p, s, HandoffFailed)
		return it
	default:
		c.reportHandoff(p, s, HandoffPresent)
	}
	var got *memcache.Item
	if s.call(func(mc *memcache.Client) (err error) { got, err = mc.Get(it.Key); return }) == nil {
		s.seenCAS(got.CasID)
		return got
	}
	return it
}

// undoCopy removes cp, a copy that copyTo added at s, unless s's value
// changed since: a write that landed after the add is newer than the copy
// and stays (a Set writes its server before it deletes where the key was,
// so it can land between the add and the check that undoes it). The
// removal is a CompareAndSwap to an expiration in the past, which memcached
// applies only if the value is still the one read. If s cannot be read, the
// key is logged for deletion there, as a write it missed.
func (c *Client) undoCopy(s *server, cp *memcache.Item) {
	var got *memcache.Item
	err := s.call(func(mc *memcache.Client) (err error) { got, err = mc.Get(cp.Key); return })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return
	case err != nil:
		c.invalidate(s, cp.Key)
		return
	case !bytes.Equal(got.Value, cp.Value) || got.Flags != cp.Flags:
		return // a newer write's
	}
	got.Expiration = -1 // expired at once: memcached's delete-if-unchanged
	if err := s.call(func(mc *memcache.Client) error { return mc.CompareAndSwap(got) }); err != nil && !errors.Is(err, memcache.ErrCASConflict) && !errors.Is(err, memcache.ErrCacheMiss) && !errors.Is(err, memcache.ErrNotStored) {
		c.invalidate(s, cp.Key)
	}
}

// sourceFailed notes that a handoff's source p failed: one that left is not
// read again; a member's health is observed as for any request.
func (c *Client) sourceFailed(p *server, f failure, err error) {
	if p.status() == gone {
		p.lost.Store(true)
		return
	}
	c.observe(p, f, err)
}

// handoffTTL is the expiration, in seconds, of a value a Get copies.
func (c *Client) handoffTTL() int32 { return int32(c.cfg.handoffTTL / time.Second) }

// Get gets the item for key, as memcache.Client.Get. It fails over, and a
// miss at a key that moved is handed off (see Client).
func (c *Client) Get(key string) (_ *memcache.Item, opErr error) {
	defer c.done(OpGet, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.get(key, func(g *Client) (*memcache.Item, error) { return g.Get(key) })
	}
	return c.get(key, c.handoffTTL(), func(mc *memcache.Client) (*memcache.Item, error) { return mc.Get(key) })
}

// GetAndTouch gets the item for key and sets its expiration, as
// memcache.Client.GetAndTouch; a value handed off gets that expiration.
func (c *Client) GetAndTouch(key string, expiration int32) (_ *memcache.Item, opErr error) {
	defer c.done(OpGetAndTouch, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.get(key, func(g *Client) (*memcache.Item, error) { return g.GetAndTouch(key, expiration) })
	}
	return c.get(key, expiration, func(mc *memcache.Client) (*memcache.Item, error) { return mc.GetAndTouch(key, expiration) })
}

func (c *Client) get(key string, exp int32, get func(*memcache.Client) (*memcache.Item, error)) (*memcache.Item, error) {
	if !legalKey(key) {
		return nil, memcache.ErrMalformedKey
	}
	h := c.hash(key)
	var it *memcache.Item
	s, err := c.do(h, ifIdempotent, func(mc *memcache.Client) (err error) { it, err = get(mc); return })
	if err == nil && c.suspect(s, key) {
		err = memcache.ErrCacheMiss
	}
	switch {
	case err == nil:
		s.seenCAS(it.CasID)
		return it, nil
	case errors.Is(err, memcache.ErrCacheMiss):
		return c.handoff(h, key, s, exp)
	}
	return nil, err
}

// Touch sets the expiration of key, as memcache.Client.Touch, at its server.
func (c *Client) Touch(key string, seconds int32) (opErr error) {
	defer c.done(OpTouch, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.all(key, func(g *Client) error { return g.Touch(key, seconds) })
	}
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	_, err := c.do(c.hash(key), ifIdempotent, func(mc *memcache.Client) error { return mc.Touch(key, seconds) })
	return err
}

// Set writes item, as memcache.Client.Set. It is retried when its server
// fails (see retry).
func (c *Client) Set(item *memcache.Item) (opErr error) {
	defer c.done(OpSet, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.all(item.Key, func(g *Client) error { return g.Set(item) })
	}
	_, err := c.write(item.Key, ifIdempotent, func(mc *memcache.Client) error { return mc.Set(item) })
	return err
}

// Add writes item if its key holds no value, as memcache.Client.Add.
func (c *Client) Add(item *memcache.Item) (opErr error) {
	defer c.done(OpAdd, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.Add(item) }, func(g *Client) error { return g.Set(item) })
	}
	_, err := c.write(item.Key, ifNotSent, func(mc *memcache.Client) error { return mc.Add(item) })
	return err
}

// Replace writes item if its key holds a value, as memcache.Client.Replace.
func (c *Client) Replace(item *memcache.Item) (opErr error) {
	defer c.done(OpReplace, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.Replace(item) }, func(g *Client) error { return g.Set(item) })
	}
	_, err := c.write(item.Key, ifNotSent, func(mc *memcache.Client) error { return mc.Replace(item) })
	return err
}

// Append appends item's value to its key's, as memcache.Client.Append. A
// key that moved is handed off first.
func (c *Client) Append(item *memcache.Item) (opErr error) {
	defer c.done(OpAppend, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.Append(item) }, func(g *Client) error { return g.Delete(item.Key) })
	}
	return c.change(item.Key, func(mc *memcache.Client) error { return mc.Append(item) })
}

// Prepend prepends item's value to its key's, as memcache.Client.Prepend. A
// key that moved is handed off first.
func (c *Client) Prepend(item *memcache.Item) (opErr error) {
	defer c.done(OpPrepend, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.primary(item.Key, func(g *Client) error { return g.Prepend(item) }, func(g *Client) error { return g.Delete(item.Key) })
	}
	return c.change(item.Key, func(mc *memcache.Client) error { return mc.Prepend(item) })
}

// CompareAndSwap writes item if its key's value has not changed since item
// was read, as memcache.Client.CompareAndSwap.
func (c *Client) CompareAndSwap(item *memcache.Item) (opErr error) {
	defer c.done(OpCompareAndSwap, c.begin(), &opErr)
	if c.pool != nil {
		return ErrPoolCAS
	}
	_, err := c.write(item.Key, ifNotSent, func(mc *memcache.Client) error { return mc.CompareAndSwap(item) })
	return err
}

// Delete deletes key, as memcache.Client.Delete, also where it was before a
// recent change of ring (first, so that a handoff copying it sees the
// delete; see copyTo), and at its server if that is out for this client
// (when it returns); so it returns ErrCacheMiss only if key was found
// nowhere it can be.
func (c *Client) Delete(key string) (opErr error) {
	defer c.done(OpDelete, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.delete(key)
	}
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	h := c.hash(key)
	deleted := false
	if rt := c.rt.Load(); len(rt.past) > 0 {
		var buf [4]*server
		for _, p := range rt.previous(h, rt.owner(h), time.Now(), buf[:0]) {
			deleted = c.invalidate(p, key) || deleted
		}
	}
	s, err := c.do(h, ifIdempotent, func(mc *memcache.Client) error { return mc.Delete(key) })
	if c.afterWrite(h, key, s) { // s may be nil: the key's server must forget it even so
		deleted = true
	}
	if deleted && errors.Is(err, memcache.ErrCacheMiss) {
		return nil
	}
	return err
}

// Increment adds delta to key's value, as memcache.Client.Increment. A key
// that moved is handed off first.
func (c *Client) Increment(key string, delta uint64) (_ uint64, opErr error) {
	defer c.done(OpIncrement, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.counter(key, func(g *Client) (uint64, error) { return g.Increment(key, delta) })
	}
	var v uint64
	err := c.change(key, func(mc *memcache.Client) (err error) { v, err = mc.Increment(key, delta); return })
	return v, err
}

// Decrement subtracts delta from key's value, as memcache.Client.Decrement.
// A key that moved is handed off first.
func (c *Client) Decrement(key string, delta uint64) (_ uint64, opErr error) {
	defer c.done(OpDecrement, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.counter(key, func(g *Client) (uint64, error) { return g.Decrement(key, delta) })
	}
	var v uint64
	err := c.change(key, func(mc *memcache.Client) (err error) { v, err = mc.Decrement(key, delta); return })
	return v, err
}

// change runs op, which changes key's value in place and fails if there is
// none; if it fails so and key moved, it hands key off and runs op again.
func (c *Client) change(key string, op func(*memcache.Client) error) error {
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	h := c.hash(key)
	s, err := c.do(h, ifNotSent, op)
	if s == nil {
		c.afterWrite(h, key, nil)
		return err
	}
	if errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrNotStored) {
		if _, herr := c.handoff(h, key, s, c.handoffTTL()); herr == nil {
			err = s.call(op)
		}
	}
	c.afterWrite(h, key, s)
	return appError(err)
}

// each runs op on every member server and returns the first error.
func (c *Client) each(op func(*memcache.Client) error) error {
	rt := c.rt.Load()
	var first error
	for _, s := range rt.baseSrv {
		if err := s.call(op); err != nil && first == nil {
			first = appError(err)
		}
	}
	return first
}

// Ping checks that every server answers, as memcache.Client.Ping, and
// returns the first error; servers out for this client are pinged too.
func (c *Client) Ping() (opErr error) {
	defer c.done(OpPing, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.each(func(g *Client) error { return g.Ping() })
	}
	return c.each(func(mc *memcache.Client) error { return mc.Ping() })
}

// FlushAll deletes every item on every server, as memcache.Client.FlushAll.
// A server out for this client is flushed when it returns.
func (c *Client) FlushAll() (opErr error) {
	defer c.done(OpFlushAll, c.begin(), &opErr)
	if c.pool != nil {
		return c.pool.each(func(g *Client) error { return g.FlushAll() })
	}
	c.mu.Lock()
	if rt := c.rt.Load(); rt != nil {
		for _, s := range rt.baseSrv {
			if s.status() != up {
				c.setLog(s, invalidations{overflowed: true})
			}
		}
	}
	c.mu.Unlock()
	return c.each(func(mc *memcache.Client) error { return mc.FlushAll() })
}

// DeleteAll deletes every item on every server, as FlushAll. Unlike
// memcache.Client.DeleteAll, which flushes only the server of the key "",
// it clears the whole cache.
func (c *Client) DeleteAll() error { return c.FlushAll() }

// legalKey reports whether memcached takes key, as gomemcache checks it:
// at most 250 bytes, with no spaces or control characters.
func legalKey(key string) bool {
	if len(key) > 250 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return false
		}
	}
	return true
}
