package selector

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// handoff looks for key, which missed at s, where it was before a recent
// change of ring. A value found there, that the gate lets through, is copied
// to s (see copyTo); the item returned is s's copy, with s's CAS id, when
// the copy could be read back. The copy keeps the value's remaining
// expiration where the source tells it (the meta protocol), else it
// expires after exp seconds; with touch, after exp seconds in any case (a
// GetAndTouch). ctx bounds the reads of the sources and the copy.
func (c *Client) handoff(ctx context.Context, h uint64, key string, s *server, exp int32, touch bool, cause handoffCause) (*memcache.Item, copied, error) {
	it, cp, err := c.handoffFrom(ctx, h, key, s, exp, touch, cause)
	c.handedOff(ctx, s, cp.from, err)
	return it, cp, err
}

// copied is what a handoff did at the key's server s: whether s holds the
// key now (copied there, or there before), and the source it read; or, if
// it read none, whether a source failed (it may hold the key still), and
// whether one missed it (see moved).
type copied struct {
	at     bool
	from   *server
	failed bool
	missed bool
}

// moved reports whether a handoff that found no value read a source that
// missed the key: a copy (the mover's, another client's read's) may have
// taken it from there to s between the miss at s and that read, and
// deleted it there, so that s is worth reading again (e2e
// TestClientSharedServers on a loaded machine: 27 of 20,000 keys missed
// while the mover moved them).
func (cp copied) moved() bool { return cp.from == nil && cp.missed }

// handoffFrom is handoff, and tells what the copy did (see copied).
func (c *Client) handoffFrom(ctx context.Context, h uint64, key string, s *server, exp int32, touch bool, cause handoffCause) (*memcache.Item, copied, error) {
	rt := c.rt.Load()
	if len(rt.past) == 0 {
		return nil, copied{}, memcache.ErrCacheMiss
	}
	// The copy is registered before its source is read, so that a write or
	// delete from then on overtakes it (see copies); copyTo's part ends it.
	st := c.copies.begin(key)
	ended := false
	defer func() {
		if !ended {
			c.copies.done(key, st)
		}
	}()
	var buf [4]*server
	failed, missed := false, false
	for _, p := range rt.previous(h, s, time.Now(), buf[:0]) {
		if !p.readable() {
			continue
		}
		if logged := c.inval.lookup(p, key); logged {
			continue
		}
		var it *memcache.Item
		err := p.call(func(w wire) (err error) { it, _, err = w.GetForCopy(ctx, key, exp); return })
		switch f := failureOf(err); f {
		case healthy:
			if p.timeouts.Load() != 0 { // a server that left counts its failures in a row (see goneFailed)
				p.timeouts.Store(0)
			}
		case abandoned:
			return nil, copied{}, err
		default:
			c.sourceFailed(p, f, err)
			failed = true
			continue
		}
		if err == nil && !c.lossesKnown(ctx, p) {
			failed = true // whether p's value predates a loss is not known yet: a move leaves it for later
			continue
		}
		if err != nil || !c.servable(ctx, p, key, h, it.CasID) {
			missed = true
			continue
		}
		if touch {
			it.Expiration = exp
		}
		var cp *memcache.Item
		var at bool
		ended = true
		if err := c.detach(ctx, func() {
			defer c.copies.done(key, st)
			cp, at = c.copyTo(s, p, it, st, cause)
		}); err != nil {
			return nil, copied{}, err
		}
		if cp == nil {
			err = memcache.ErrCacheMiss
		}
		return cp, copied{at: at, from: p}, err
	}
	return nil, copied{failed: failed, missed: missed}, memcache.ErrCacheMiss
}

// copyTo copies it, read from p, to s, deletes it at p, and returns the
// item to serve: s's copy (or it if s's cannot be read), or nil if a write
// or delete overtook the copy, which st tracks: the caller registers it
// (see copies) before it reads p, and ends it after. at tells whether s
// holds the key now, copied or there before; where it does not, p keeps
// it. A move (cause handoffMove) serves nobody: its copy is not read back.
// Its steps run on the Client's context, each within the timeout: a copy
// that stopped halfway would leave a placeholder, or a key at two servers.
// A caller that cannot wait runs it detached (see Client.detach).
//
// The copy first reserves the key at s (see wire.Reserve): a placeholder,
// which readers take for a miss. Then p is read again: if its value
// changed or went, or a write or delete of this client's overtook the
// copy, the placeholder is removed. Else the copy fills it, with a
// compare-and-swap on its CAS, which fails if a write or a delete of any
// client replaced or removed it meanwhile. So a copy never lands after a
// delete of the key (Delete deletes where a key was before it deletes at
// its server, so that the check of p sees it), and is never readable
// before its check. Over the classic protocol, which has no placeholders,
// the copy is added, checked and undone (see addCopy).
//
// Where s has the key already, a read does not delete it at p: s's value
// is a write's, which deletes at p itself, or another copy's, whose check
// of p would take that delete for a racing Delete and undo the copy. A
// move, which runs after such copies fill (s's value is present, not a
// placeholder), deletes p's if unchanged: no server keeps a key it does
// not own. Where s failed, p keeps the key for the next read.
func (c *Client) copyTo(s, p *server, it *memcache.Item, st *copyState, cause handoffCause) (_ *memcache.Item, at bool) {
	cp := c.copyOf(s, it)
	var present *memcache.Item
	var stub uint64
	var reserved bool
	reserve := func() error {
		return s.call(func(w wire) (err error) {
			present, stub, reserved, err = w.Reserve(c.ctx, it.Key, c.reserveTTL())
			return
		})
	}
	if cause == handoffMove && !c.lossesKnown(c.ctx, s) {
		// Whether a value of s's predates its gain of the key's slot is not
		// known (see servable): the key stays at p, for a later round.
		c.reportHandoff(p, s, cause, handoffFailed)
		return c.unlessOvertaken(st, it), false
	}
	h := c.hash(it.Key)
	err := c.awaitGain(c.ctx, s, h)
	if err == nil {
		err = reserve()
	}
	if err == nil && present != nil && !c.servable(c.ctx, s, it.Key, h, present.CasID) {
		// An old value of s's, from before it gained the key's slot,
		// which servable deleted (a read at s would have; one whose
		// floor was pending then, see awaitGain, was not): reserve again.
		err = reserve()
	}
	switch {
	case errors.Is(err, errNoReserve):
		return c.addCopy(s, p, it, &cp, st, cause)
	case err != nil:
		c.reportHandoff(p, s, cause, handoffFailed)
		return c.unlessOvertaken(st, it), false
	case present != nil:
		if logged := c.inval.lookup(s, it.Key); cause == handoffMove && !logged {
			// s's value is newer than p's: a write's, or a copy's filled
			// already (unless s missed a write, and its value waits to be
			// deleted: then p's stays). p's is read no more: delete it,
			// unless it changed since, so that no server keeps a key it
			// does not own for a Client that never saw the change to read
			// after a move back.
			p.call(func(w wire) error { return w.DeleteCAS(c.ctx, it.Key, it.CasID) })
		}
		c.reportHandoff(p, s, cause, handoffPresent)
		present.Expiration = cp.Expiration // for a pool's repair (see Client.getItem)
		return c.unlessOvertaken(st, present), true
	case !reserved: // another copy is under way: this read is served from p, unless deleted since
		if tomb, err := c.entombed(c.ctx, s, it.Key); tomb || err != nil {
			return nil, false
		}
		return c.unlessOvertaken(st, it), false
	}
	var now *memcache.Item
	perr := p.call(func(w wire) (err error) { now, err = w.Get(c.ctx, it.Key); return })
	if perr != nil || now.CasID != it.CasID || c.copies.check(st) {
		s.call(func(w wire) error { return w.DeleteCAS(c.ctx, it.Key, stub) })
		c.reportHandoff(p, s, cause, handoffUndone)
		return nil, false
	}
	if tomb, err := c.entombed(c.ctx, s, it.Key); tomb || err != nil {
		s.call(func(w wire) error { return w.DeleteCAS(c.ctx, it.Key, stub) })
		c.reportHandoff(p, s, cause, handoffUndone)
		if err != nil { // the copy cannot tell: p keeps the key
			return nil, false
		}
		// Deleted by a client that did not see the change (see
		// tombstone.go): p's value is older than the delete.
		p.call(func(w wire) error { return w.DeleteCAS(c.ctx, it.Key, it.CasID) })
		return nil, true
	}
	cp.CasID = stub
	if err := s.call(func(w wire) error { return w.Store(c.ctx, opCAS, &cp) }); err != nil {
		// A write or delete got there first, and is newer; or s failed,
		// and the placeholder expires by itself.
		c.reportHandoff(p, s, cause, handoffUndone)
		return nil, false
	}
	if c.rt.Load().owner(h) != s {
		// The routing sent the key elsewhere while the copy ran (the
		// server s stood in for came back): read no more at s, the copy
		// would stay there, under no floor if a later gain of s fell
		// back on an older one (see fallBack), and be served when s
		// stands in again. It is undone; p keeps the key.
		s.call(func(w wire) error { return w.Delete(c.ctx, it.Key) })
		c.reportHandoff(p, s, cause, handoffUndone)
		return c.unlessOvertaken(st, it), false
	}
	p.call(func(w wire) error { return w.Delete(c.ctx, it.Key) })
	c.reportHandoff(p, s, cause, handoffCopied)
	if cause == handoffMove {
		c.mover.add(func(st *MoveStats) { st.Bytes += int64(len(cp.Value)) })
		return &cp, true
	}
	return c.readBack(s, it, cp.Expiration, st), true
}

// unlessOvertaken returns it, or nil if a write or delete of this client's
// overtook the copy st.
func (c *Client) unlessOvertaken(st *copyState, it *memcache.Item) *memcache.Item {
	if c.copies.check(st) {
		return nil
	}
	return it
}

// readBack returns s's copy of it, with s's CAS id, for the caller (it if
// s cannot be read), or nil if the copy st was overtaken.
func (c *Client) readBack(s *server, it *memcache.Item, exp int32, st *copyState) *memcache.Item {
	var got *memcache.Item
	gerr := s.call(func(w wire) (err error) { got, err = w.Get(c.ctx, it.Key); return })
	if c.copies.check(st) {
		return nil
	}
	if gerr == nil {
		got.Expiration = exp // for a pool's repair (see Client.getItem)
		return got
	}
	return it
}

// addCopy is copyTo over the classic protocol: cp, the copy of it, is
// added at s, p is read again, and the copy undone if p's value changed or
// went, or a write or delete of this client's overtook it. Between the add
// and the undo, another client can read the copy (see the README's
// "Consistency").
func (c *Client) addCopy(s, p *server, it, cp *memcache.Item, st *copyState, cause handoffCause) (_ *memcache.Item, at bool) {
	err := s.call(func(w wire) error { return w.Store(c.ctx, opAdd, cp) })
	switch {
	case err == nil:
		var now *memcache.Item
		perr := p.call(func(w wire) (err error) { now, err = w.Get(c.ctx, it.Key); return })
		if perr != nil || now.CasID != it.CasID || c.copies.check(st) {
			c.undoCopy(s, cp)
			c.reportHandoff(p, s, cause, handoffUndone)
			return nil, false
		}
		p.call(func(w wire) error { return w.Delete(c.ctx, it.Key) })
		c.reportHandoff(p, s, cause, handoffCopied)
	case !errors.Is(err, memcache.ErrNotStored):
		c.reportHandoff(p, s, cause, handoffFailed)
		return c.unlessOvertaken(st, it), false
	default:
		c.reportHandoff(p, s, cause, handoffPresent)
	}
	return c.readBack(s, it, cp.Expiration, st), true
}

// reserveTTL is how long a copy's placeholder lives, in seconds, if the
// copy never fills it: longer than a copy's check and fill take (two
// requests, each within the timeout), short enough that a copier that died
// costs its key a few seconds of misses.
func (c *Client) reserveTTL() int32 {
	return max(2, int32((4*c.cfg.conn.timeout+time.Second-1)/time.Second))
}

// undoCopy removes cp, a copy that copyTo added at s, unless s's value
// changed since: a write that landed after the add is newer than the copy
// and stays. The removal is a CompareAndSwap to an expiration in the past,
// which memcached applies only if the value is still the one read. If s
// cannot be read or the removal fails, the key is invalidated there (deleted
// or logged), as after a write s missed.
func (c *Client) undoCopy(s *server, cp *memcache.Item) {
	var got *memcache.Item
	err := s.call(func(w wire) (err error) { got, err = w.Get(c.ctx, cp.Key); return })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return
	case err != nil:
		c.invalidate(c.ctx, s, cp.Key, nil)
		return
	case !bytes.Equal(got.Value, cp.Value) || got.Flags != cp.Flags:
		return // a newer write's
	}
	got.Expiration = -1 // expired at once: memcached's delete-if-unchanged
	if err := s.call(func(w wire) error { return w.Store(c.ctx, opCAS, got) }); err != nil && !errors.Is(err, memcache.ErrCASConflict) && !errors.Is(err, memcache.ErrCacheMiss) && !errors.Is(err, memcache.ErrNotStored) {
		c.invalidate(c.ctx, s, cp.Key, nil)
	}
}

// sourceFailed notes that a handoff's source p failed: a member's health
// is observed as for any request; one that left, see goneFailed.
func (c *Client) sourceFailed(p *server, f failure, err error) {
	if p.status() == gone {
		c.goneFailed(p, f)
		return
	}
	c.observe(p, f, err)
}

// goneFailed notes that a request to s, which left, failed with f. Without
// discovery, s served until then, and is not used again. With it, s serves
// while Kubernetes says so (a terminating pod in its grace period), unless
// it refuses connections, or fails as many times in a row as take a member
// out: one slow reply, under the load of its keys' moves, does not end its
// grace period. Its invalidation log holds the keys whose deletes failed
// there meanwhile (see Client.invalidate).
func (c *Client) goneFailed(s *server, f failure) {
	switch {
	case f == healthy || f == refused || f == abandoned || f == local:
	case !c.list.drains || f == unreachable:
		s.lost.Store(true)
		s.retire()
	case int(s.timeouts.Add(1)) >= c.cfg.timeoutsUntilDown:
		// Slow in a row, maybe under the load of its own moves: not read
		// for a while, then again while Kubernetes says it drains (see
		// refresh), and its keys' moves resume.
		s.lost.Store(true)
		s.retire()
		s.timeouts.Store(0)
		time.AfterFunc(c.cfg.probeMin, c.signal)
	}
}

// handoffTTL is the expiration, in seconds, of a value a Get copies.
func (c *Client) handoffTTL() int32 { return int32(c.cfg.handoffTTL / time.Second) }

// handoffFirst hands r's key off before r runs, if the key moved: an Add
// at the key's server must fail where the key still holds a value where it
// was. A key that did not move costs nothing.
func (c *Client) handoffFirst(r *keyOp) {
	rt := c.rt.Load()
	if len(rt.past) == 0 || !legalKey(r.key) {
		return
	}
	h := c.hash(r.key)
	s, _ := rt.ownerNow(h)
	var buf [4]*server
	if s == nil || len(rt.previous(h, s, time.Now(), buf[:0])) == 0 {
		return
	}
	c.handoff(r.ctx, h, r.key, s, c.handoffTTL(), false, handoffRead)
}
