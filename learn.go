package selector

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"

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
	ch := c.learn(s, false)
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
// and returns the channel closed when it ends, or nil if it is known. The
// Client's refresh starts it for each new member (prompt), so that the
// first request there seldom waits for it; a request starts it again if
// that one failed. Called with c.mu held.
func (c *Client) learn(s *server, prompt bool) <-chan struct{} {
	if !c.routesByRing() { // its pool's groups read and write the servers
		s.lossesKnown.Store(true)
	}
	if s.learning == nil && !s.lossesKnown.Load() {
		ch := make(chan struct{})
		s.learning = ch
		c.wg.Go(func() {
			c.learnLosses(s, prompt)
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
// within twice the timeout. A record no Client of this version wrote is
// logged and taken for none. A read of the record that fails leaves it
// unknown, to be read again by the next request.
//
// Read as s joins this Client's routing (prompt), the record's losses are
// taken for the past: they were written before this Client's routing
// (only a Client that starts within the moments between another's seeing
// a change and its own could read one that is not). Read later, after
// that read failed, a loss may be of a change this Client has not seen
// yet: the floors apply where s's marks of the slots it owns again (see
// backKey) say the loss is past, and wait elsewhere (marks that cannot be
// read are taken for none).
func (c *Client) learnLosses(s *server, prompt bool) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
	defer cancel()
	rec, ok := c.readRecord(ctx, s, lostKey)
	if !ok {
		return
	}
	var back lostRecord
	switch {
	case prompt:
		back = rec
	case len(rec.runs) > 0:
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

// settleMarked reads, as a change comes, the marks of each server whose
// gains wait (see gains.learn), within twice the timeout, and settles
// those marked since: a Client that read a record late as slots came
// back, before any Client marked them, and sees them leave again within
// its wait, keeps
// their floors for the past ring, so that no value from before their first
// loss is handed off or moved. A gain still not marked is of this change,
// or of one no Client could mark: record drops it.
func (c *Client) settleMarked() {
	var wg sync.WaitGroup
	for _, s := range c.gains.waitingAt() {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
			defer cancel()
			if marks, ok := c.readRecord(ctx, s, backKey); ok {
				c.gains.settleMarked(s, marks)
			}
		})
	}
	wg.Wait()
}

// learn adds the floors of s's record of lost slots (see lostKey) to the
// slots that s owns in rt and that no change this Client saw moved: a
// value of such a slot below its floor predates a time the slot was
// elsewhere. A slot a change moved has the gain of that change, which is
// later. The gains are published before any slot refers to them (see
// record). Called with the Client's refreshing held, so that rt is the
// routing the next change is recorded from.
//
// A floor of a slot whose return to s is not marked (see backKey) may be
// of a loss this Client has not seen yet: another Client saw a change
// first and wrote it, and s's values of the slot are the keys' values,
// to be moved, not older ones. Or this Client read the record late as the
// slot came back, before any Client marked it (a record read as s joins
// the routing is taken as marked: see Client.learnLosses). Its gain waits: none of s's values of
// the slot is served, and none is deleted, until the change that loses the
// slot drops it (see record), or it is given the floor (see settle). The
// gains that wait are returned.
func (g *gains) learn(s *server, rt *routing, rec lostRecord, back []lostRun) (waiting []*gain) {
	if len(rec.runs) == 0 || rt == nil || rt.live == nil || rt.live.alt != nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	evs := g.begin(rt.past)
	type kind struct {
		floor uint64
		wait  bool
	}
	// The slots s owns, no change moved, and the record holds, by kind.
	t := &rt.live.keys
	var own []markedRun
	for _, r := range marked(rec.runs, back) {
		for i := r.lo; i <= r.hi; i++ {
			if g.slots[i].Load() != 0 || rt.liveSrv[t.SlotOwner(uint64(i))] != s {
				continue
			}
			if n := len(own); n > 0 && own[n-1].hi+1 == i && own[n-1].floor == r.floor && own[n-1].back == r.back {
				own[n-1].hi = i
			} else {
				own = append(own, markedRun{lostRun{lo: i, hi: i, floor: r.floor}, r.back})
			}
		}
	}
	byKind := map[kind]uint32{}
	for _, r := range own {
		k := kind{r.floor, !r.back}
		if _, ok := byKind[k]; ok {
			continue
		}
		e := &gain{s: s}
		e.started.Store(rec.start)
		if k.wait {
			e.floor.Store(math.MaxUint64)
			e.later = r.floor
			waiting = append(waiting, e)
		} else {
			e.floor.Store(r.floor)
		}
		byKind[k] = uint32(len(evs))
		evs = append(evs, e)
	}
	g.events.Store(&evs)
	for _, r := range own {
		for i := r.lo; i <= r.hi; i++ {
			g.slots[i].Store(byKind[kind{r.floor, !r.back}])
		}
	}
	return waiting
}

// settleKept settles each gain that waits (see learn) of which new keeps
// a slot at the same server as old: the loss it learned is not this
// change's, which loses the slot, and a change that loses its other slots
// keeps the floor for the past ring. One whose every slot this change
// loses is dropped by record: the loss it learned is this change's (or a
// loss of the same slots before, which no Client marked as past: see
// docs/consistency.md). Called with g.mu held.
func (g *gains) settleKept(old, new *routing, evs []*gain) {
	var ws []*gain
	for _, e := range evs {
		if e != nil && e.waiting() {
			ws = append(ws, e)
		}
	}
	if len(ws) == 0 {
		return
	}
	ot, nt := &old.live.keys, &new.live.keys
	for i := range uint64(1 << slotBits) {
		e := evs[g.slots[i].Load()]
		if e != nil && e.waiting() && old.liveSrv[ot.SlotOwner(i)] == e.s && new.liveSrv[nt.SlotOwner(i)] == e.s {
			settle([]*gain{e})
		}
	}
}

// waitingAt returns the servers of the gains that wait (see learn).
func (g *gains) waitingAt() []*server {
	var out []*server
	if p := g.events.Load(); p != nil {
		for _, e := range *p {
			if e != nil && e.waiting() && !slices.Contains(out, e.s) {
				out = append(out, e.s)
			}
		}
	}
	return out
}

// settleMarked gives the slots of s whose gains wait the floors they
// learned where marks, s's marks read now, mark them: their loss was
// followed by a return (this Client started as they came back), and a
// change that loses them again keeps the floor for its past ring.
func (g *gains) settleMarked(s *server, marks lostRecord) {
	if len(marks.runs) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	evs := g.list()
	byFloor := map[uint64]uint32{}
	var settle []uint32 // slots, then their gains' indexes
	for i := range g.slots {
		e := evs[g.slots[i].Load()]
		if e == nil || e.s != s || !e.waiting() || e.started.Load() != marks.start || floorOfSlot(marks.runs, uint32(i)) < e.later {
			continue
		}
		if _, ok := byFloor[e.later]; !ok {
			n := &gain{s: s}
			n.started.Store(e.started.Load())
			n.floor.Store(e.later)
			byFloor[e.later] = uint32(len(evs))
			evs = append(evs, n)
		}
		settle = append(settle, uint32(i), byFloor[e.later])
	}
	g.events.Store(&evs)
	for k := 0; k < len(settle); k += 2 {
		g.slots[settle[k]].Store(settle[k+1])
	}
}

// floorOfSlot returns the floor of slot in runs (in slot order), or 0.
func floorOfSlot(runs []lostRun, slot uint32) uint64 {
	i, found := slices.BinarySearchFunc(runs, slot, func(r lostRun, s uint32) int {
		switch {
		case r.hi < s:
			return -1
		case r.lo > s:
			return 1
		}
		return 0
	})
	if !found {
		return 0
	}
	return runs[i].floor
}

// waiting reports whether e is a learned gain that waits for its floor
// (see learn).
func (e *gain) waiting() bool { return e.later != 0 && e.floor.Load() == math.MaxUint64 }

// settle gives each gain of ws that still waits the floor it learned.
func settle(ws []*gain) {
	for _, e := range ws {
		e.floor.CompareAndSwap(math.MaxUint64, e.later)
	}
}
