package selector

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
)

// gains keeps a server from serving, for a key it gained in a change of
// ring, a value it held from before the change: a key that moves back to a
// server it left (a scale-up, then a scale-down an hour later), or to a
// stand-in that held it long ago, finds there the value it had when it
// left, while writes went elsewhere meanwhile. For each slot of the ring,
// gains records the change at which its current server gained it, with a
// CAS floor: a CAS id that server handed out just after the change. A value
// below the floor predates the change, so the gate does not serve it (see
// Client.servable); values written or copied there since are above it.
//
// It needs no history from before the Client started: any change it sees
// records its own gains. It covers the Client's own ring (the default
// Hashing); Ketama and Ch3 rings, for sharing a pool with other clients,
// have no slots, and are not covered (see the README's "Consistency").
//
// The table (4 MB) is made at the first change that moves a slot. Record
// runs with the Client's lock held, before the routing it compares is
// published; reads are lock-free.
type gains struct {
	slots  []atomic.Uint32         // per slot: an index into events, or 0
	events atomic.Pointer[[]*gain] // index 0 unused; replaced, never changed in place
	mu     sync.Mutex              // serializes record and compaction
}

// gain is one server's gain of slots at one change.
type gain struct {
	s       *server
	floor   atomic.Uint64 // math.MaxUint64 until known
	started atomic.Int64  // the process start the floor was taken in (see serverStart)
}

// record notes the slots that old and new give to different servers, and
// returns the gains whose floors are to be taken (see Client.takeFloors).
func (g *gains) record(old, new *routing) []*gain {
	if old == nil || old.live == nil || new.live == nil || old.live.alt != nil || new.live.alt != nil || sameServers(old, new) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.slots == nil {
		g.slots = make([]atomic.Uint32, 1<<slotBits)
	}
	evs := g.list()
	if len(evs) > maxGainEvents {
		evs = g.compact(evs)
	}
	// The gains are published before any slot refers to them, so that a
	// read through the routing still in use (which may already reach a
	// gaining server, as the successor of one that left) finds each slot's
	// gain as soon as the slot is marked: with its floor unknown, nothing of
	// the slot is served there until it is taken.
	ot, nt := &old.live.table, &new.live.table
	byServer := map[*server]uint32{}
	var added []*gain
	for i := range uint64(1 << slotBits) {
		ns := new.liveSrv[nt.owner(i)]
		if _, ok := byServer[ns]; ok || ns == old.liveSrv[ot.owner(i)] {
			continue
		}
		e := &gain{s: ns}
		e.floor.Store(math.MaxUint64)
		byServer[ns] = uint32(len(evs))
		evs = append(evs, e)
		added = append(added, e)
	}
	g.events.Store(&evs)
	for i := range uint64(1 << slotBits) {
		if ns := new.liveSrv[nt.owner(i)]; ns != old.liveSrv[ot.owner(i)] {
			g.slots[i].Store(byServer[ns])
		}
	}
	return added
}

// maxGainEvents is how many gains are kept before the ones no slot refers
// to are dropped.
const maxGainEvents = 1 << 12

// list returns the gains, with the unused index 0.
func (g *gains) list() []*gain {
	if p := g.events.Load(); p != nil {
		return append([]*gain(nil), *p...)
	}
	return []*gain{nil}
}

// compact drops the gains that no slot refers to any more, and renumbers
// the slots. Called with g.mu held.
func (g *gains) compact(evs []*gain) []*gain {
	remap := make([]uint32, len(evs))
	out := []*gain{nil}
	for i := range g.slots {
		idx := g.slots[i].Load()
		if idx == 0 {
			continue
		}
		if remap[idx] == 0 {
			remap[idx] = uint32(len(out))
			out = append(out, evs[idx])
		}
		g.slots[i].Store(remap[idx])
	}
	return out
}

// of returns the gain of the slot of hash h if s is the server that gained
// it, or nil.
func (g *gains) of(s *server, h uint64) *gain {
	p := g.events.Load()
	if p == nil {
		return nil
	}
	idx := g.slots[slotOf(h)].Load()
	if idx == 0 || int(idx) >= len(*p) {
		return nil
	}
	if e := (*p)[idx]; e.s == s {
		return e
	}
	return nil
}

// restarted drops the floors of s's gains taken in a process other than
// the one that started at start: s restarted since, and its CAS ids started
// from 1 again (it holds nothing from before).
func (g *gains) restarted(s *server, start int64) {
	if p := g.events.Load(); p != nil {
		for _, e := range *p {
			if e != nil && e.s == s && e.floor.Load() != math.MaxUint64 && e.started.Load() != start {
				e.floor.Store(0)
			}
		}
	}
}

// takeFloors learns the floor of each gain: a CAS id its server hands out
// now, before the routing that gains are of is published, so that every
// value this Client writes there afterwards is above it. The servers are
// asked at once, each within twice the Client's timeout; a gain whose
// server does not answer in time has no floor. Called with c.mu held: it
// observes no failure, which would take the lock.
func (c *Client) takeFloors(gs []*gain) {
	if len(gs) == 0 || c.closed.Load() {
		return
	}
	var wg sync.WaitGroup
	for _, e := range gs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
			defer cancel()
			start, f, err := c.floorOf(ctx, e.s)
			if err != nil {
				// A floor taken later would be above the values written
				// and copied there since the change, which the gate would
				// then delete: this gain goes without one (see the
				// README's "Consistency").
				f = 0
			}
			e.started.Store(start)
			e.floor.Store(f)
		})
	}
	wg.Wait()
}

// floorOf returns s's process start (see serverStart) and a CAS id it hands
// out now (see casNow): a floor, and the process it holds in.
func (c *Client) floorOf(ctx context.Context, s *server) (start int64, floor uint64, err error) {
	if start, err = serverStart(ctx, s, c.cfg.conn); err == nil {
		floor, err = c.casNow(s)
	}
	return start, floor, err
}
