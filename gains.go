package selector

import (
	"math"
	"slices"
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
// records its own gains. A slot's gain is kept, after the slot moves on,
// with the past ring it belongs to (see gainRun), so that a value read from
// a former owner for a handoff is checked against that owner's floor too: a
// key that left a server, came back and left again finds there the value
// from before it came back, which its writes since have not deleted. It covers the Client's own ring (the default
// Hashing); Ketama and Ch3 rings, for sharing a pool with other clients,
// have no slots, and are not covered (see the README's "Consistency").
//
// The table (4 MB) is made at the first change that moves a slot. Record
// runs under the Client's refreshing lock, before the routing it compares
// is published; reads are lock-free.
type gains struct {
	slots  []atomic.Uint32           // per slot: an index into events, or 0
	events atomic.Pointer[[]*gain]   // index 0 unused; replaced, never changed in place
	lost   atomic.Pointer[[]gainRun] // the last change's (see record)
	mu     sync.Mutex                // serializes record and compaction
}

// gain is one server's gain of slots at one change.
type gain struct {
	s       *server
	floor   atomic.Uint64 // math.MaxUint64 until known
	started atomic.Int64  // the process start the floor was taken in (see serverStart)
	fallen  bool          // the floor is the record's (see fallBack); under gains.mu
	later   uint64        // a learned floor that waits (see learn); set before it is published
	taking  sync.Mutex    // held while the floor is taken or fallen back on (see take)
}

// gainRun is a run of slots, lo to hi, and the gain they had in a past
// ring: the one their server there gained them at, or nil.
type gainRun struct {
	lo, hi uint32
	e      *gain
}

// record notes the slots that old and new give to different servers. It
// returns the gains whose floors are to be taken (see Client.takeFloors),
// the gains those slots had in old, for old's past ring (see past.gains):
// runs in slot order, and the slots each server of old lost, for its
// record (see lostKey).
//
// A slot's gain learned from a record and still waiting (see learn), of
// which this change keeps no slot at its server (see settleKept), is not
// kept for the past ring: the loss it waited on is this change's, which
// this Client sees now, and the server's values of the slot are the ones
// to hand off and move.
func (g *gains) record(old, new *routing) (added []*gain, lost []gainRun, losses []loss) {
	if old != nil && old.live != nil && old.live.alt == nil && new.live == nil {
		return nil, nil, lostAll(old) // every server left (a replicated pool's pod; a zone)
	}
	if old == nil || old.live == nil || new.live == nil || old.live.alt != nil || new.live.alt != nil || sameServers(old, new) {
		return nil, nil, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	evs := g.begin(new.past)
	g.settleKept(old, new, evs)
	// The gains, and the ones the slots had (lost), are published before
	// any slot refers to the new ones, so that a read through the routing
	// still in use finds each slot's gains as soon as the slot is marked: a
	// gaining server (which it may reach already, as the successor of one
	// that left) with its floor unknown, so that nothing of the slot is
	// served there until it is taken; a losing server, its owner there,
	// with its floor (see of).
	ot, nt := &old.live.keys, &new.live.keys
	var moved []gainRun // the slots that change server, in runs, with the gain they go to
	byServer := map[*server]uint32{}
	byLoser := map[*server]int{}
	var prevNs, prevOs *server // the last changed slot's: most slots change in long runs
	var ev uint32
	var k int
	for i := range uint64(1 << slotBits) {
		ns, os := new.liveSrv[nt.SlotOwner(i)], old.liveSrv[ot.SlotOwner(i)]
		if ns == os {
			continue
		}
		slot := uint32(i)
		if os != prevOs {
			k = lossOf(&losses, byLoser, os)
			prevOs = os
		}
		losses[k].add(slot)
		if ns != prevNs {
			var ok bool
			if ev, ok = byServer[ns]; !ok {
				e := &gain{s: ns}
				e.floor.Store(math.MaxUint64)
				ev = uint32(len(evs))
				byServer[ns] = ev
				evs = append(evs, e)
				added = append(added, e)
			}
			prevNs = ns
		}
		if n := len(moved); n > 0 && moved[n-1].hi+1 == slot && moved[n-1].e == evs[ev] {
			moved[n-1].hi++
		} else {
			moved = append(moved, gainRun{lo: slot, hi: slot, e: evs[ev]})
		}
		if e := evs[g.slots[i].Load()]; e != nil && !e.waiting() {
			if n := len(lost); n > 0 && lost[n-1].e == e && lost[n-1].hi == slot-1 {
				lost[n-1].hi++
			} else {
				lost = append(lost, gainRun{lo: slot, hi: slot, e: e})
			}
		}
	}
	g.events.Store(&evs)
	g.lost.Store(&lost)
	for _, r := range moved {
		ev := byServer[r.e.s]
		for i := r.lo; i <= r.hi; i++ {
			g.slots[i].Store(ev)
		}
	}
	return added, lost, losses
}

// lostAll returns the slots of each server of rt's live ring.
func lostAll(rt *routing) (losses []loss) {
	byLoser := map[*server]int{}
	t := &rt.live.keys
	for i := range uint64(1 << slotBits) {
		losses = addLost(losses, byLoser, rt.liveSrv[t.SlotOwner(i)], uint32(i))
	}
	return losses
}

// addLost adds slot, which s lost, to losses (in slot order), whose index
// of each server is byLoser.
func addLost(losses []loss, byLoser map[*server]int, s *server, slot uint32) []loss {
	losses[lossOf(&losses, byLoser, s)].add(slot)
	return losses
}

// add adds slot, the next in order, to l's runs.
func (l *loss) add(slot uint32) {
	if rs := l.runs; len(rs) > 0 && rs[len(rs)-1].hi+1 == slot {
		rs[len(rs)-1].hi++
	} else {
		l.runs = append(rs, lostRun{lo: slot, hi: slot})
	}
}

// lossOf returns the index in losses of s's loss, added if it has none.
func lossOf(losses *[]loss, byLoser map[*server]int, s *server) int {
	k, ok := byLoser[s]
	if !ok {
		k = len(*losses)
		byLoser[s] = k
		*losses = append(*losses, loss{s: s})
	}
	return k
}

// begin makes the table if there is none, and returns a copy of the gains
// to add to, compacted past maxGainEvents (kept: the gains of past rings).
// Called with g.mu held.
func (g *gains) begin(kept []past) []*gain {
	if g.slots == nil {
		g.slots = make([]atomic.Uint32, 1<<slotBits)
	}
	evs := g.list()
	if len(evs) > maxGainEvents {
		evs = g.compact(evs, kept)
	}
	return evs
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
// the slots. The gains of the past rings kept are kept too, for restarted.
// Called with g.mu held.
func (g *gains) compact(evs []*gain, kept []past) []*gain {
	remap := make([]uint32, len(evs))
	out := []*gain{nil}
	inPast := map[*gain]bool{}
	for _, p := range kept {
		for _, r := range p.gains {
			inPast[r.e] = true
		}
	}
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
	for i, e := range evs {
		if i > 0 && remap[i] == 0 && inPast[e] {
			out = append(out, e)
		}
	}
	return out
}

// of returns s's latest gain of the slot of hash h: the slot's gain now if
// s is the server that gained it, else the newest one of s in the past
// rings (a former owner), or nil. A server's latest gain of a slot is the
// start of its latest time as the slot's owner, or later: a value there
// from before it predates a time the slot was elsewhere.
func (g *gains) of(s *server, h uint64, pastRings []past) *gain {
	e, moved := g.last(h)
	if !moved {
		return nil // the slot never moved: no past ring has a gain of it
	}
	if e.s == s {
		return e
	}
	// The last change's runs are its past ring's too, once the routing it
	// made is published; until then, they are only here.
	slot := uint32(slotOf(h))
	if lp := g.lost.Load(); lp != nil {
		if e := runOf(*lp, slot); e != nil && e.s == s {
			return e
		}
	}
	for _, pr := range pastRings {
		if e := runOf(pr.gains, slot); e != nil && e.s == s {
			return e
		}
	}
	return nil
}

// last returns the last gain of the slot of hash h, and whether the slot
// ever moved (else there is none).
func (g *gains) last(h uint64) (*gain, bool) {
	p := g.events.Load()
	if p == nil {
		return nil, false
	}
	idx := g.slots[slotOf(h)].Load()
	if idx == 0 || int(idx) >= len(*p) {
		return nil, false
	}
	return (*p)[idx], true
}

// runOf returns the gain of slot in runs, or nil.
func runOf(runs []gainRun, slot uint32) *gain {
	i, found := slices.BinarySearchFunc(runs, slot, func(r gainRun, s uint32) int {
		switch {
		case r.hi < s:
			return -1
		case r.lo > s:
			return 1
		}
		return 0
	})
	if !found {
		return nil
	}
	return runs[i].e
}

// restarted drops the floors of s's gains taken in a process other than
// the one that started at start: s restarted since, and its CAS ids started
// from 1 again (it holds nothing from before).
func (g *gains) restarted(s *server, start int64) {
	if p := g.events.Load(); p != nil {
		for _, e := range *p { // the past rings' gains included (see compact)
			if e != nil && e.s == s && e.floor.Load() != math.MaxUint64 && e.started.Load() != start {
				e.floor.Store(0)
			}
		}
	}
}
