package selector

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// The Client's consistency rests on two checks that every operation passes
// (see the README's "Consistency"):
//
//   - the gate, before any request uses a key at a server (clean) and
//     before a value read from a server is returned (servable): a key the
//     server must forget is deleted there first, and a value that predates
//     a history the Client lost, or that a write overtook while it was being
//     copied, is not served;
//   - the cleanup, after every write and delete (afterWrite): every other
//     server where an older value of the key could be read later has it
//     deleted, or logged for deletion before it is used again.
//
// Deleting is always safe: a miss is allowed, an old value is not. So every
// mechanism below deletes where in doubt, and copies (handoff, pool repair)
// are conditional and undone when a write overtakes them.

// clean makes key safe to use at s: if s's invalidation log holds key, key
// is deleted at s and at the stand-in that took its write, and leaves the
// log; a request that finds it being cleaned waits for that (see
// invalLog.claim). A server with a CAS floor has a value of key that is about to be
// changed in place checked against it. clean returns the error of the
// delete at s, which the caller observes as the request's; ctx, the
// request's, bounds it.
func (c *Client) clean(ctx context.Context, s *server, key string, inPlace bool) error {
	if inPlace && !c.lossesKnown(ctx, s) {
		// Whether s's value predates a slot's loss is not known (its
		// record could not be read): delete it, as one below a floor.
		if err := s.call(func(w wire) error { return w.Delete(ctx, key) }); failureOf(err) != healthy {
			return err
		}
	}
	if inPlace && (s.floor.Load() != 0 || c.gains.of(s, c.hash(key), c.rt.Load().past) != nil) {
		var it *memcache.Item
		err := s.call(func(w wire) (err error) { it, err = w.Get(ctx, key); return })
		if err == nil && !c.servable(ctx, s, key, c.hash(key), it.CasID) {
			// servable deleted a value below a known floor; one not
			// servable for another reason (a floor being taken, a copy
			// overtaken) is deleted too, or the change would apply to it.
			if err := s.call(func(w wire) error { return w.Delete(ctx, key) }); failureOf(err) != healthy {
				return err
			}
			return nil
		}
	}
	for {
		logged, standIns, wait := c.inval.claim(s, key)
		if !logged {
			return nil // or the log overflowed: a floor stands for the keys it lost
		}
		if wait != nil { // another request cleans it: its delete comes first
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		err := s.call(func(w wire) error { return w.Delete(ctx, key) })
		if failureOf(err) != healthy {
			c.inval.release(s, key)
			return err
		}
		for _, t := range standIns {
			c.cleanStandIn(ctx, s, key, t)
		}
		c.inval.done(s, key)
		return nil
	}
}

// cleanStandIn deletes key at standIn, which took a write of key while s
// was out, unless a past ring still has standIn as key's server: then a
// read hands the copy back to s (see handoff), and every write of key
// deletes it there (see afterWrite), until the ring is dropped. By then the
// copy has expired, as its expiration was capped below the handoff window
// (see standInExp).
//
// While the routing in use still sends key to standIn (s answers again,
// but the routing back to it is not published yet), standIn's copy is the
// key's value, which writes go on replacing there: deleted, it would be
// lost, and a handoff could copy an older value from a former stand-in in
// its place (histcheck two-out on 1.6.45). key is logged at s again
// instead, so that the copy goes when s is next cleaned.
func (c *Client) cleanStandIn(ctx context.Context, s *server, key string, standIn *server) {
	if standIn == nil || standIn == s {
		return
	}
	if c.rt.Load().owner(c.hash(key)) == standIn {
		c.logKey(s, key, standIn)
		return
	}
	var buf [4]*server
	if c.cfg.standInTTL > c.cfg.handoffWindow { // the copy can outlive the past ring
		c.invalidate(ctx, standIn, key, nil)
		return
	}
	if slices.Contains(c.rt.Load().previous(c.hash(key), s, time.Now(), buf[:0]), standIn) {
		return
	}
	c.invalidate(ctx, standIn, key, nil)
}

// servable reports whether a value of key (of hash h) with CAS id cas,
// just read from s, may be returned. It may not if a write or delete of key
// overtook a copy of it in flight (see copies); or if it is older than a CAS
// floor of s: the floor of an overflowed log (s's history was lost), or the
// one taken when s gained key's slot in a change of ring (see gains). A value
// below a known floor is deleted there, so that the next write is trusted.
// While s's record of lost slots is not known (see lossesKnown), no value
// of s is servable, and none is deleted.
func (c *Client) servable(ctx context.Context, s *server, key string, h uint64, cas uint64) bool {
	if c.copies.overtaken(key) || !c.lossesKnown(ctx, s) {
		return false
	}
	f, started := s.floor.Load(), s.started.Load()
	if e := c.gains.of(s, h, c.rt.Load().past); e != nil && e.floor.Load() > f {
		f, started = e.floor.Load(), e.started.Load()
	}
	if f == 0 || cas >= f {
		return true
	}
	if f == math.MaxUint64 {
		return false // the floor is being taken
	}
	if c.restartedSince(ctx, s, started) {
		return true
	}
	s.call(func(w wire) error { return w.Delete(ctx, key) })
	return false
}

// restartedSince reports whether s restarted since the process that
// started at started, and drops the floors taken before its restart if so:
// its CAS ids start from 1 again, and it holds nothing from before. It asks
// s at most once a second.
func (c *Client) restartedSince(ctx context.Context, s *server, started int64) bool {
	now := time.Now().UnixNano()
	last := s.checked.Load()
	if now-last < int64(time.Second) || !s.checked.CompareAndSwap(last, now) {
		return false
	}
	start, err := serverStart(ctx, s, c.cfg.conn)
	if err != nil || start == started {
		return false
	}
	if s.started.Load() != start {
		s.floor.Store(0)
	}
	c.gains.restarted(s, start)
	return true
}

// floorAll gives each of c's servers a CAS floor (see floorNow), as if
// its log had overflowed: one out until then takes it when it returns.
func (c *Client) floorAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.servers {
		c.inval.overflow(s)
		c.floorNow(s)
	}
}

// floorNow gives s, whose log overflowed while it is up, a CAS floor: none
// of its values is served until the floor is known, and none older after.
// It is taken in the background, or by the first write to s before then
// (see awaitFloor).
func (c *Client) floorNow(s *server) {
	gen := s.askFloor()
	if c.closed.Load() {
		return
	}
	c.wg.Go(func() {
		ctx := c.ctx
		for ctx.Err() == nil {
			if c.takeFloor(ctx, s, gen) == nil {
				return
			}
			if s.status() != up { // recover takes the floor when it returns
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(c.cfg.probeMin):
			}
		}
	})
}

// awaitFloor takes s's floor now if it is pending (see floorNow), before a
// write to s: written first, the value would be below the floor taken in
// the background after it, and deleted as one from before.
func (c *Client) awaitFloor(ctx context.Context, s *server) error {
	if s.floor.Load() != math.MaxUint64 {
		return nil
	}
	gen, pending := s.floorAsked()
	if !pending {
		return nil
	}
	return c.takeFloor(ctx, s, gen)
}

// takeFloor takes the floor numbered gen of s (see server.askFloor). The
// first taker to finish sets it; the others' floors are dropped.
func (c *Client) takeFloor(ctx context.Context, s *server, gen uint64) error {
	start, f, err := c.floorOf(ctx, s)
	if err != nil {
		return err
	}
	if s.setFloor(gen, start, f) {
		c.inval.clearOverflow(s)
	}
	return nil
}

// invalidate makes sure that s never serves key's old value: it deletes key
// there now if s is up (or a departed server still serving), or else logs it
// (with standIn, the server that took a write in s's place), to be deleted
// before s is used again. It reports whether key was deleted or logged: as
// mcrouter's asynclog treats a delete it could not deliver, after it s never
// serves key's old value.
func (c *Client) invalidate(ctx context.Context, s *server, key string, standIn *server) bool {
	if !s.readable() {
		c.logKey(s, key, standIn)
		return true
	}
	err := s.call(func(w wire) error { return w.Delete(ctx, key) })
	if f := failureOf(err); f != healthy {
		if s.status() == gone {
			c.goneFailed(s, f)
		}
		c.deleteLater(s, key, standIn)
		return true
	}
	c.cleanStandIn(ctx, s, key, standIn)
	return err == nil
}

// deleteLater logs key for deletion at s, and if s is up, deletes it in
// the background (or, past the log's bound, gives s a floor).
func (c *Client) deleteLater(s *server, key string, standIn *server) {
	c.logKey(s, key, standIn)
	if s.status() == up {
		if _, overflowed := c.inval.state(s); overflowed {
			c.floorNow(s)
		} else {
			c.drain(s, nil)
		}
	}
}

// logKey logs key for deletion at s (see invalLog), and reports it.
func (c *Client) logKey(s *server, key string, standIn *server) {
	_, before := c.inval.state(s)
	c.inval.add(s, key, standIn)
	_, after := c.inval.state(s)
	c.reportLogged(s, 1, after && !before)
}

// afterWrite is the cleanup after a write or delete of key, whose hash is
// h, that ran at s (nil if no server took it) and failed with err: wherever
// else an older value of key could be read later, it is deleted, or logged
// for deletion: at key's member owner if s stood in for it, and where the
// key was before a recent change of ring (a handoff's source). A write that
// failed at s has key deleted at s too, so that a read after it returns the
// written value or a miss, never the one before. It reports whether it
// deleted key somewhere. A GetOrLoad that starts after it no longer joins
// the load of key in flight, which may return an older value (see
// flights.written).
func (c *Client) afterWrite(ctx context.Context, h uint64, key string, s *server, err error) bool {
	c.loads.written(key)
	rt := c.rt.Load()
	deleted := false
	if s != nil {
		switch f := failureOf(err); {
		case f == healthy:
		case f == abandoned:
			// The caller gave up; the write may have landed. The key is
			// logged, not deleted now, which would outlast the caller's
			// deadline: the gate deletes it before s serves it (see
			// clean), and the drain soon after.
			c.deleteLater(s, key, nil)
			deleted = true
		case f == refused && answered(err):
			// The server answered: the write did not happen, and the value
			// there is as before (see answered).
		case f == refused || f == timedOut || f == broken:
			deleted = c.invalidate(ctx, s, key, nil)
		}
	}
	b := rt.baseOwner(h)
	if b != nil && b != s {
		deleted = c.invalidate(ctx, b, key, c.standInFor(b, s)) || deleted
	}
	if l := rt.liveOwner(h); l != nil && l != s && l != b {
		// Out since rt was built: s is its successor (see ownerNow), and
		// l held the key until then. The next routing has it in a past
		// ring, whose handoff would read its older value (histcheck
		// two-out on 1.6.45: a stand-in out on timeouts, a Delete sent
		// to the next, then an Increment of the deleted value).
		deleted = c.invalidate(ctx, l, key, nil) || deleted
	}
	if len(rt.past) == 0 {
		return deleted
	}
	// Every past ring still routed by, even one that expired a moment ago:
	// a server that left is told the keys written meanwhile only so, until
	// the refresh that drops its ring gives its history up (see
	// refreshLocked: its log overflows). Skipped here, a write between the
	// expiry and that refresh went nowhere for it, and a server that
	// returned in that same refresh (a replicated pod, whose group has no
	// other server) is given nothing up, and served the older value.
	var buf [4]*server
	for _, p := range rt.previous(h, s, time.Time{}, buf[:0]) {
		if p != b {
			deleted = c.invalidate(ctx, p, key, nil) || deleted
		}
	}
	return deleted
}

// standInFor returns s if it took a write in b's place, so that its copy
// goes when b is cleaned (see cleanStandIn), or nil if s is the key's
// server in the ring of the servers up. Under Ketama a server out moves
// keys between servers that are up as well (the continuum rebuilt without
// it gives every server other points, as libmemcached's does): b is up, and
// s holds the value just written, which a past ring hands back to b when
// the server out returns. That value expires within the handoff window
// (see standInExp) only if StandInExpiration is shorter; else it goes as a
// stand-in's does, since no past ring would delete it later.
func (c *Client) standInFor(b, s *server) *server {
	if b.status() == up && c.cfg.standInTTL <= c.cfg.handoffWindow {
		return nil
	}
	return s
}

// standInExp returns exp, an expiration in memcached's form, capped for a
// write to a stand-in (as mcrouter's failover_exptime): a copy away from a
// key's home must not outlive the outage by much, in case a cleanup misses
// it. It returns exp unchanged where no cap applies.
func (c *Client) standInExp(exp int32) int32 {
	limit := int32(c.cfg.standInTTL / time.Second)
	if limit <= 0 || exp < 0 {
		return exp
	}
	rel := int64(exp)
	if exp > 30*24*3600 { // an absolute unix time
		rel = int64(exp) - time.Now().Unix()
		if rel <= 0 {
			return exp
		}
	}
	if exp == 0 || rel > int64(limit) {
		return limit
	}
	return exp
}
