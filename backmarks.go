package selector

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// A server's marks of the slots it owns again tell a Client that learns
// its record of lost slots (see lostKey) which floors are of the past. A
// floor of a slot the server owns, as the learning Client routes, is
// either of a loss followed by a return (a scale-up then a scale-down; a
// pod NotReady then Ready): its values below the floor are older than
// writes made elsewhere meanwhile, and none may be served. Or it is of a
// loss that another Client saw first and this one has not seen yet: its
// values below the floor are the keys' values, which the mover is about to
// move, and none may be deleted (e2e TestClientMovesManyClients lost one
// pod's keys so). The record alone cannot tell the two apart.
//
// So every Client that sees a server gain slots marks, at that server and
// before it routes by the change, those of its lost slots that it owns
// again, with the floor of their loss (backKey). A learning Client applies
// the floors that are marked, and lets the others wait (see gains.learn).
// The marks are in a record of their own, so that Clients of an earlier
// version, which read and write lostKey alone, read the records as before;
// its key is under the claims' prefix, which the mover of every version
// skips as the Client's own (an earlier one would move any other key, and
// leave one server's marks at another).
const backKey = claimPrefix + "back"

// markedRun is a run of a record's slots with its floor, and whether its
// return is marked.
type markedRun struct {
	lostRun
	back bool
}

// marked returns runs, each split where back marks part of it: a slot is
// marked if back holds it with a floor at or above its own.
func marked(runs, back []lostRun) []markedRun {
	var out []markedRun
	j := 0
	for _, r := range runs {
		lo := r.lo
		for lo <= r.hi {
			for j < len(back) && back[j].hi < lo {
				j++
			}
			m := markedRun{lostRun: lostRun{lo: lo, hi: r.hi, floor: r.floor}}
			switch {
			case j == len(back) || back[j].lo > r.hi:
			case back[j].lo > lo:
				m.hi = back[j].lo - 1
			default:
				m.hi = min(r.hi, back[j].hi)
				m.back = back[j].floor >= r.floor
			}
			if n := len(out); n > 0 && out[n-1].back == m.back && out[n-1].floor == m.floor && out[n-1].hi+1 == m.lo {
				out[n-1].hi = m.hi
			} else {
				out = append(out, m)
			}
			if m.hi == r.hi {
				break
			}
			lo = m.hi + 1
		}
	}
	return out
}

// within returns the runs of have, with their floors, cut to the slots of
// want.
func within(have, want []lostRun) []lostRun {
	var out []lostRun
	i, j := 0, 0
	for i < len(have) && j < len(want) {
		lo, hi := max(have[i].lo, want[j].lo), min(have[i].hi, want[j].hi)
		if lo <= hi {
			out = append(out, lostRun{lo: lo, hi: hi, floor: have[i].floor})
		}
		if have[i].hi < want[j].hi {
			i++
		} else {
			j++
		}
	}
	return out
}

// baseRegains returns the slots each server gains from old's members to
// new's, for noteRegains. Of the members, not of the servers routed to: a
// server that only returns from being out for this Client (its timeouts;
// its members unchanged) regains no slot it lost in a change, and one that
// this Client routes by a ring older than another's must not mark that
// other's loss as past (see gains.learn).
func baseRegains(old, new *routing) (regains []loss) {
	if old == nil || old.base == nil || new.base == nil || old.base == new.base || old.base.alt != nil || new.base.alt != nil {
		return nil
	}
	byGainer := map[*server]int{}
	ot, nt := &old.base.keys, &new.base.keys
	var prev *server
	k := 0
	for i := range uint64(1 << slotBits) {
		ns := new.baseSrv[nt.SlotOwner(i)]
		if ns == old.baseSrv[ot.SlotOwner(i)] {
			continue
		}
		if ns != prev {
			k, prev = lossOf(&regains, byGainer, ns), ns
		}
		regains[k].add(uint32(i))
	}
	return regains
}

// noteRegains marks, at each server of gs (the slots it gains in a change),
// the slots its record says it lost before, within twice the Client's
// timeout, before the change is routed by. A mark that cannot be written
// leaves those slots to wait in a Client that learns the record (see
// gains.learn): a miss, never an old value.
func (c *Client) noteRegains(ctx context.Context, gs []loss) {
	if ctx.Err() != nil || !c.routesByRing() {
		return
	}
	var wg sync.WaitGroup
	for _, g := range gs {
		if g.s.status() == gone {
			continue
		}
		wg.Go(func() {
			tctx, cancel := context.WithTimeout(ctx, 2*c.cfg.conn.timeout)
			defer cancel()
			if err := c.noteRegain(tctx, g); err != nil {
				c.log.Debug("cannot mark the slots a server owns again; a client started now waits for them", keyServer, g.s.addr.str, keyError, err)
			}
		})
	}
	wg.Wait()
}

// noteRegain merges into g's server's marks the floors its record holds of
// the slots of g, by CAS, trying again while other clients write them too.
func (c *Client) noteRegain(ctx context.Context, g loss) error {
	rec, ok := c.readRecord(ctx, g.s, lostKey)
	if !ok {
		return errors.New("the record of lost slots cannot be read")
	}
	due := within(rec.runs, g.runs)
	if len(due) == 0 {
		return nil // slots it never lost: nothing to mark
	}
	for attempt := 0; ; attempt++ {
		var got *memcache.Item
		err := g.s.call(func(w wire) (err error) { got, err = w.Get(ctx, backKey); return })
		marks := lostRecord{start: rec.start}
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
		case err != nil:
			return err
		default:
			if old, err := decodeLost(got.Value); err == nil && old.start == rec.start {
				marks = old
			}
		}
		merged := mergeLost(marks.runs, due)
		if got != nil && slices.Equal(merged, marks.runs) {
			return nil // marked already
		}
		marks.runs = merged
		it := &memcache.Item{Key: backKey, Value: marks.encode()}
		kind := opAdd
		if got != nil {
			kind, it.CasID = opCAS, got.CasID
		}
		err = g.s.call(func(w wire) error { return w.Store(ctx, kind, it) })
		if err == nil {
			return nil
		}
		if !errors.Is(err, memcache.ErrNotStored) && !errors.Is(err, memcache.ErrCASConflict) && !errors.Is(err, memcache.ErrCacheMiss) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still written by other clients after %d tries: %w", attempt+1, ctx.Err())
		case <-time.After(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))):
		}
	}
}

// lostAsMember returns the runs of l that its server lost as a member of
// to, the routing of the change, not only as a server routed to (out for
// this Client).
func lostAsMember(l loss, to *routing) []lostRun {
	if to == nil || to.base == nil || to.base.alt != nil {
		return nil
	}
	out := loss{s: l.s}
	t := &to.base.keys
	for _, r := range l.runs {
		for i := r.lo; i <= r.hi; i++ {
			if to.baseSrv[t.SlotOwner(uint64(i))] != l.s {
				out.add(i)
			}
		}
	}
	return out.runs
}

// remark marks again, at s, the slots of runs (which s lost as a member,
// and whose floors were just raised: a second pass, see noteLossesAgain,
// or a write of what s owed) that s owns again among the members this
// Client routes by: a change back within a second, seen by this Client, is
// marked before the pass ends, with the floors before it. The routing
// being installed counts as seen: its marks (see noteRegains) are read
// after it is stored, so that a pass that raises a floor before it is
// stored is read by them, and one after marks again here.
func (c *Client) remark(ctx context.Context, s *server, runs []lostRun) {
	if len(runs) == 0 {
		return
	}
	var rts []*routing
	for _, rt := range []*routing{c.installing.Load(), c.rt.Load()} {
		if rt != nil && rt.base != nil && rt.base.alt == nil {
			rts = append(rts, rt)
		}
	}
	back := loss{s: s}
	for _, r := range runs {
		for i := r.lo; i <= r.hi; i++ {
			for _, rt := range rts {
				if rt.baseSrv[rt.base.keys.SlotOwner(uint64(i))] == s {
					back.add(i)
					break
				}
			}
		}
	}
	if len(back.runs) > 0 {
		ctx, cancel := context.WithTimeout(ctx, 2*c.cfg.conn.timeout)
		defer cancel()
		if err := c.noteRegain(ctx, back); err != nil {
			c.log.Debug("cannot mark the slots a server owns again; a client started now waits for them", keyServer, s.addr.str, keyError, err)
		}
	}
}
