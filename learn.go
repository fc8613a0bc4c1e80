package selector

import (
	"context"
	"errors"

	"github.com/bradfitz/gomemcache/memcache"
)

// lossesKnown reports whether s's record of the slots it lost is known to
// this Client, reading it if it is not (once; see learnLosses): until then
// no value of s is served. ctx bounds the wait; the read goes on.
func (c *Client) lossesKnown(ctx context.Context, s *server) bool {
	if s.lossesKnown.Load() {
		return true
	}
	if c.closed.Load() {
		return false
	}
	c.mu.Lock()
	ch := c.learn(s)
	c.mu.Unlock()
	if ch == nil { // known now
		return true
	}
	select {
	case <-ch:
		return s.lossesKnown.Load()
	case <-ctx.Done():
		return false
	}
}

// learn starts learnLosses of s unless it runs or s's record is known,
// and returns the channel closed when it ends, or nil if it is known. The Client's refresh starts it for each new member,
// so that the first request there seldom waits for it. Called with c.mu
// held.
func (c *Client) learn(s *server) <-chan struct{} {
	if !c.routesByRing() { // its pool's groups read and write the servers
		s.lossesKnown.Store(true)
	}
	if s.learning == nil && !s.lossesKnown.Load() {
		ch := make(chan struct{})
		s.learning = ch
		c.wg.Go(func() {
			c.learnLosses(s)
			c.mu.Lock()
			s.learning = nil
			c.mu.Unlock()
			close(ch)
		})
	}
	return s.learning
}

// routesByRing reports whether the Client routes keys by its own ring:
// the records of lost slots are of that ring. A replicated or zoned pool's
// Client routes by its groups' rings, each its own Client (one a pod, one
// a zone): their records are theirs.
func (c *Client) routesByRing() bool { return c.cfg.pool.kind == sharded }

// learnLosses reads s's record and adds its floors to the gains of the
// slots s owns now that this Client saw no change of (see gains.learn),
// within twice the timeout, with the marks of the slots s owns again (see
// backKey). A record no Client of this version wrote is logged and taken
// for none. A read of the record that fails leaves it unknown, to be read
// again by the next request; marks that cannot be read are taken for none.
func (c *Client) learnLosses(s *server) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
	defer cancel()
	rec, ok := c.readRecord(ctx, s, lostKey)
	if !ok {
		return
	}
	var back lostRecord
	if len(rec.runs) > 0 {
		if back, _ = c.readRecord(ctx, s, backKey); back.start != rec.start {
			back = lostRecord{} // marks of another process of s
		}
	}
	// Under refreshing, so that no change is recorded meanwhile from a
	// routing this does not see (see gains.learn).
	s.losses.noteFloor(rec.start, highest(rec.runs))
	c.gains.raise(s)
	c.refreshing.Lock()
	waiting := c.gains.learn(s, c.rt.Load(), rec, back.runs)
	c.refreshing.Unlock()
	s.lossesKnown.Store(true)
	if len(waiting) > 0 {
		c.log.Debug("a server's record of lost slots has floors no Client marked as past; those slots wait",
			keyServer, s.addr.str, "wait", c.cfg.learnWait)
		c.wg.Go(func() {
			sleep(c.ctx, c.cfg.learnWait)
			settle(waiting)
		})
	}
}

// readRecord reads s's record under key (lostKey or backKey), and reports
// whether it was read: a miss is an empty record, and a value no Client of
// this version wrote is logged and taken for none.
func (c *Client) readRecord(ctx context.Context, s *server, key string) (lostRecord, bool) {
	var got *memcache.Item
	err := s.call(func(w wire) (err error) { got, err = w.Get(ctx, key); return })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return lostRecord{}, true
	case err != nil:
		return lostRecord{}, false
	}
	rec, err := decodeLost(got.Value)
	if err != nil {
		c.log.Warn("a record of slots at a server cannot be read; taken for none", keyServer, s.addr.str, "key", key, keyError, err)
		return lostRecord{}, true
	}
	return rec, true
}
