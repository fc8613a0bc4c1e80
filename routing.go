package selector

import (
	"context"
	"slices"
	"time"
)

// routing is the Client's view of its servers: an immutable value, built on
// every change and published atomically, which requests read without locks.
type routing struct {
	base    *ring     // the members, as Kubernetes (or SetServers) has them
	baseSrv []*server // base's members' servers, by member index
	live    *ring     // base without the servers out for this client
	liveSrv []*server
	past    []past // the live rings before this one, newest first (see Client.handoff)
	added   bool   // past[0] is the live ring of the routing this one was built from
}

// past is a live ring the Client routed by before, kept for a while so that
// a key that moved can be read from where it was and deleted there.
//
// It keeps only the slots whose server differs in the ring after it (the
// past ring before it in routing.past, or the live ring for the first): a
// change moves a few thousand runs of slots, which take tens of kilobytes,
// where a whole table takes 1.5 MB at a few servers and 3.5 at 1000 (a
// Client over 3 servers held 12 MB after 4 changes with whole tables). A
// key's server in a past ring is then its server in the ring after it,
// unless the past ring moved its slot: read from the live ring back (see
// pastOwners). A ring with no table of slots after it, or whose runs would
// take more than its table, is kept whole.
type past struct {
	srv    []*server // the ring's servers, by member index
	until  time.Time
	gains  gainRuns // the gains of the slots the next ring moved (see gains.of)
	moved  slotRuns // per slot: 0 for the server of the ring after it, else 1 + an index into owners
	owners []*server
	whole  *ring     // the ring, where kept whole; moved's slots are read first (see over)
	wsrv   []*server // whole's servers, by member index
	size   int       // the bytes of the ring's table, kept whole or not: what pastLimit counts
}

// owner returns the server of a key of hash h in p, whose server in the
// ring after p is after.
func (p *past) owner(h uint64, after *server) *server {
	if v := p.moved.at(uint32(slotOf(h))); v != 0 {
		return p.owners[v-1]
	}
	if p.whole != nil {
		return p.wsrv[p.whole.owner(h)]
	}
	return after
}

// pastOf returns the past ring of r, whose servers are srv, from when rt
// replaces it: the slots whose server rt's live ring changes (every slot
// where rt has no live ring: the owners of r in runs), or r whole.
func pastOf(r *ring, srv []*server, rt *routing, until time.Time) past {
	p := past{srv: srv, until: until, size: r.bytes()}
	if r.alt != nil || rt.live != nil && rt.live.alt != nil {
		p.whole, p.wsrv = r, srv
		return p
	}
	// A walk of every slot, as gains.record's, which most changes leave
	// with the same server.
	var nt *slotTable
	var nsrv []*server
	if rt.live != nil {
		nt, nsrv = &rt.live.table, rt.liveSrv
	}
	ot := &r.table
	maxRuns := p.size / 8 // beyond, the runs take more than the table
	index := map[*server]uint32{}
	var b runsBuilder
	var last *server // the last slot's server in r, if it moved
	var v uint32
	for i := range uint64(numSlots) {
		os := srv[ot.owner(i)]
		if nt != nil && os == nsrv[nt.owner(i)] {
			if last != nil {
				b.set(uint32(i), 0)
				last = nil
			}
			continue
		}
		if os != last {
			var ok bool
			if v, ok = index[os]; !ok {
				p.owners = append(p.owners, os)
				v = uint32(len(p.owners))
				index[os] = v
			}
			b.set(uint32(i), v)
			last = os
			if b.runs() > maxRuns {
				p.owners = nil
				p.whole, p.wsrv = r, srv
				return p
			}
		}
	}
	p.moved = b.done()
	p.owners = slices.Clip(p.owners)
	return p
}

// over returns q, the past ring before p, read without p: with p's moved
// slots, which q did not move, and p's whole ring, if q has none. It is
// how the rings kept stay exact when one between them is dropped.
func (q past) over(p past) past {
	if q.whole != nil && q.moved.runs() == 0 {
		return q // whole: the rings after it are not read
	}
	r := q
	r.owners = slices.Clone(q.owners)
	index := map[*server]uint32{}
	for i, s := range r.owners {
		index[s] = uint32(i + 1)
	}
	// p's runs, in q's owners, then q's own over them.
	pm := p.moved.mapped(func(v uint32) uint32 {
		if v == 0 {
			return 0
		}
		s := p.owners[v-1]
		if _, ok := index[s]; !ok {
			r.owners = append(r.owners, s)
			index[s] = uint32(len(r.owners))
		}
		return index[s]
	})
	var own []valRun
	q.moved.each(func(lo, hi, v uint32) { own = append(own, valRun{lo, hi, v}) })
	r.moved = pm.with(own)
	if q.whole == nil {
		r.whole, r.wsrv = p.whole, p.wsrv
	}
	return r
}

// routingInput is what a routing is built from.
type routingInput struct {
	base    *ring
	server  func(*staticAddr) *server // a member's server
	live    func(*server) bool        // whether a member is routed to
	old     *routing                  // the routing before, or nil
	now     time.Time
	window  time.Duration // how long a past ring is kept
	maxPast int           // how many are kept
}

// newRouting returns the routing of in, and the past rings it no longer
// keeps.
func newRouting(in routingInput) (rt *routing, dropped []past) {
	rt = &routing{base: in.base}
	if in.base != nil {
		rt.baseSrv = make([]*server, len(in.base.members))
		var ms []member
		for i, m := range in.base.members {
			rt.baseSrv[i] = in.server(m.addr)
			if in.live(rt.baseSrv[i]) {
				ms = append(ms, m)
			}
		}
		switch {
		case len(ms) == len(in.base.members):
			rt.live, rt.liveSrv = in.base, rt.baseSrv
		case len(ms) > 0:
			var old *ring
			if in.old != nil {
				old = in.old.live // a few servers out: a small change of it
			}
			rt.live = in.base.subset(ms, old)
			rt.liveSrv = make([]*server, len(ms))
			for i, m := range ms {
				rt.liveSrv[i] = in.server(m.addr)
			}
		}
	}

	var keep []past
	fresh := false // keep[0] is old's live ring
	if o := in.old; o != nil && o.live != nil && !sameServers(o, rt) {
		keep = append(keep, pastOf(o.live, o.liveSrv, rt, in.now.Add(in.window)))
		fresh = true
	}
	if in.old != nil {
		keep = append(keep, in.old.past...)
	}
	limit := pastLimit(in.maxPast, keep)
	var gap []past // dropped since the last ring kept, newest first
	for i, p := range keep {
		if len(rt.past) < limit && in.now.Before(p.until) {
			// The ring after it is not kept (a window that ends sooner than
			// an older ring's): it is read through those dropped.
			for j := len(gap) - 1; j >= 0; j-- {
				p = p.over(gap[j])
			}
			gap = gap[:0]
			rt.added = rt.added || i == 0 && fresh
			rt.past = append(rt.past, p)
		} else {
			dropped = append(dropped, p)
			gap = append(gap, p)
		}
	}
	return rt, dropped
}

// Past rings: at least maxPast of them are kept for the handoff window,
// and more, up to maxPastRings, while their rings, counted whole (see
// past.size), take less than pastBudget. A rolling restart makes two
// changes a pod, and a key that a change moved must be moved (see Moves),
// or read, before its ring is dropped: after, no client reads it where it
// was. At 16 servers or fewer a ring counts 1.5 MB (10 are kept); at 1000,
// 3.5 MB (4). Counted whole, as when they were kept whole, so that the
// rings kept are the same; what they take is far less (see past).
const (
	pastBudget   = 16 << 20
	maxPastRings = 16
)

// pastLimit is how many of the past rings keep (newest first) are kept.
func pastLimit(least int, keep []past) int {
	size := 0
	for i, p := range keep {
		if size += p.size; i >= least && (size > pastBudget || i >= maxPastRings) {
			return i
		}
	}
	return len(keep)
}

// sameServers reports whether a and b route every key to the same server.
func sameServers(a, b *routing) bool {
	if a.live == b.live {
		return true
	}
	if b.live == nil || !a.live.sameIDs(b.live.members) {
		return false
	}
	for i := range a.liveSrv {
		if a.liveSrv[i] != b.liveSrv[i] {
			return false
		}
	}
	return true
}

// owner returns the server that a key of hash h goes to, or nil if there is
// none. A server marked out since this routing was built is skipped as if
// it had been removed: its keys go to the next live server along the ring
// (exactly, while one server is out; see ring.candidates beyond), until the
// next routing leaves it out of live.
func (rt *routing) owner(h uint64) *server {
	s, _ := rt.ownerNow(h)
	return s
}

// ownerNow is owner, and whether the server is a stand-in that this
// routing does not know of yet: its owner went out since the routing was
// built, so the gains of the next one (see gains) are not recorded yet, and
// a value read there is not trusted.
func (rt *routing) ownerNow(h uint64) (s *server, newStandIn bool) {
	if rt == nil || rt.live == nil {
		return nil, false
	}
	s = rt.liveSrv[rt.live.owner(h)]
	switch st := s.status(); {
	case st == up:
		return s, false
	case st == gone && !s.lost.Load():
		// It left, and still serves (a terminating pod in its grace
		// period, or a server removed from a fixed list): until the next
		// routing, which the Client is building, it keeps its keys.
		return s, false
	}
	s = rt.next(h)
	return s, s != nil
}

// next returns the first live server among h's candidates, or nil.
func (rt *routing) next(h uint64) *server {
	var buf [8]uint32
	for _, i := range rt.live.candidates(h, len(buf), buf[:0]) {
		if s := rt.liveSrv[i]; s.status() == up {
			return s
		}
	}
	return nil
}

// inPast reports whether s is a server of one of rt's past rings.
func (rt *routing) inPast(s *server) bool {
	for _, p := range rt.past {
		if slices.Contains(p.srv, s) {
			return true
		}
	}
	return false
}

// baseOwner returns the server that owns h among the members, live or not.
func (rt *routing) baseOwner(h uint64) *server {
	if rt == nil || rt.base == nil {
		return nil
	}
	return rt.baseSrv[rt.base.owner(h)]
}

// previous appends to dst the servers that owned h in the past rings not
// expired at now, newest first, without repeats and without not: where the
// value of a key that moved may still be. A zero now counts every past
// ring of rt, expired or not (see Client.afterWrite).
func (rt *routing) previous(h uint64, not *server, now time.Time, dst []*server) []*server {
	s := rt.liveOwner(h)
	for i := range rt.past {
		p := &rt.past[i]
		s = p.owner(h, s)
		if s == nil || s == not || slices.Contains(dst, s) || !now.IsZero() && !now.Before(p.until) {
			continue
		}
		dst = append(dst, s)
	}
	return dst
}

// pastOwners appends to dst the server that owns h in each past ring of
// rt, newest first.
func (rt *routing) pastOwners(h uint64, dst []*server) []*server {
	s := rt.liveOwner(h)
	for i := range rt.past {
		s = rt.past[i].owner(h, s)
		dst = append(dst, s)
	}
	return dst
}

// liveOwner returns the server of h in the live ring, where the newest
// past ring reads it: a ring kept as the slots it moved. Without a live
// ring, the newest past ring's runs have every slot (see pastOf).
func (rt *routing) liveOwner(h uint64) *server {
	if len(rt.past) == 0 || rt.past[0].whole != nil || rt.live == nil {
		return nil
	}
	return rt.liveSrv[rt.live.owner(h)]
}

// losers returns the servers that may hold keys they do not own: those
// that own, in one of rt's past rings, a slot that rt's live ring gives to
// another server. Where a ring has no slot table (Ketama, Ch3), every
// server of the past rings.
//
// A past ring's server of a slot it did not move is the ring after it's,
// which that ring's own runs (or the live ring) account for: only the
// slots each one moved, or all of a ring kept whole, are read.
func (rt *routing) losers() []*server {
	if rt.live == nil {
		return nil // no server owns a slot: the keys wait where they are
	}
	var out []*server
	add := func(s *server) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	live := func(slot uint32) *server {
		return rt.liveSrv[rt.live.owner(uint64(slot)<<(64-slotBits))]
	}
	for _, p := range rt.past {
		if p.whole != nil && p.whole.alt != nil || rt.live.alt != nil {
			for _, s := range p.srv {
				add(s)
			}
			continue
		}
		p.moved.each(func(lo, hi, v uint32) {
			was := p.owners[v-1]
			if slices.Contains(out, was) {
				return
			}
			for slot := lo; slot <= hi; slot++ {
				if was != live(slot) {
					add(was)
					return
				}
			}
		})
		if p.whole == nil {
			continue
		}
		for slot := range uint32(numSlots) {
			h := uint64(slot) << (64 - slotBits)
			if p.moved.at(slot) != 0 {
				continue
			}
			if was := p.wsrv[p.whole.owner(h)]; was != live(slot) {
				add(was)
			}
		}
	}
	return out
}

// publish makes rt the routing, and wakes the requests that wait for it
// (see awaitRouting). Called with c.refreshing held.
func (c *Client) publish(rt *routing) {
	c.rt.Store(rt)
	next := make(chan struct{})
	close(*c.routed.Swap(&next))
}

// awaitRouting waits, within ctx, for a routing after rt, which a server's
// health made stale: the next one records the stand-ins' gains, and takes
// their floors, before a write goes there (see gains).
func (c *Client) awaitRouting(ctx context.Context, rt *routing) error {
	ch := *c.routed.Load()
	if c.rt.Load() != rt {
		return nil
	}
	c.signal()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
}
