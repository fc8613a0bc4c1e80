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
}

// past is a live ring the Client routed by before, kept for a while so that
// a key that moved can be read from where it was and deleted there.
type past struct {
	r     *ring
	srv   []*server
	until time.Time
	gains []gainRun // the gains of the slots the next ring moved (see gains.of)
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
	if o := in.old; o != nil && o.live != nil && !sameServers(o, rt) {
		keep = append(keep, past{r: o.live, srv: o.liveSrv, until: in.now.Add(in.window)})
	}
	if in.old != nil {
		keep = append(keep, in.old.past...)
	}
	limit := pastLimit(in.maxPast, keep)
	for _, p := range keep {
		if len(rt.past) < limit && in.now.Before(p.until) {
			rt.past = append(rt.past, p)
		} else {
			dropped = append(dropped, p)
		}
	}
	return rt, dropped
}

// Past rings: at least maxPast of them are kept for the handoff window,
// and more, up to maxPastRings, while they take less than pastBudget. A
// rolling restart makes two changes a pod, and a key that a change moved
// must be moved (see Moves), or read, before its ring is dropped: after,
// no client reads it where it was. At 16 servers or fewer a ring takes 1.5
// MB (10 are kept); at 1000, 3.5 MB (4).
const (
	pastBudget   = 16 << 20
	maxPastRings = 16
)

// pastLimit is how many of the past rings keep (newest first) are kept.
func pastLimit(least int, keep []past) int {
	size := 0
	for i, p := range keep {
		if size += p.r.bytes(); i >= least && (size > pastBudget || i >= maxPastRings) {
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

// liveOwner returns h's server in the ring of the servers up when rt was
// built, up still or not, or nil.
func (rt *routing) liveOwner(h uint64) *server {
	if rt == nil || rt.live == nil {
		return nil
	}
	return rt.liveSrv[rt.live.owner(h)]
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
	s = rt.liveOwner(h)
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
	for _, p := range rt.past {
		s := p.srv[p.r.owner(h)]
		if s == not || slices.Contains(dst, s) || !now.IsZero() && !now.Before(p.until) {
			continue
		}
		dst = append(dst, s)
	}
	return dst
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
