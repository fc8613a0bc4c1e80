package selector

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// refPast is a past ring as it was kept before past rings kept only what
// changed: its whole table, and the gain of each slot the next ring moved.
type refPast struct {
	r     *ring
	srv   []*server
	until time.Time
	gains map[uint32]*gain
}

// refWorld runs changes through routings and gains, and through a
// reference built from whole tables (the code before), for
// TestPastEquivalence.
type refWorld struct {
	rng     *rand.Rand
	srv     map[string]*server
	g       gains
	rt      *routing
	now     time.Time
	window  time.Duration
	maxPast int
	// the reference
	past  []refPast
	slots map[uint32]*gain // each slot's gain
	lost  map[uint32]*gain // the last recorded change's
}

func (w *refWorld) server(id string) *server {
	if w.srv[id] == nil {
		w.srv[id] = &server{addr: &staticAddr{network: "tcp", str: id}}
	}
	return w.srv[id]
}

// change builds the routing of the members ids, with the servers out left
// out of the live ring, at now.
func (w *refWorld) change(t *testing.T, ids []string, out map[string]bool, now time.Time) {
	t.Helper()
	for _, id := range ids {
		w.server(id)
	}
	var base *ring
	if len(ids) > 0 {
		base = newRing(canonical(members(ids...)), 300) // few points: many runs of few slots
	}
	old := w.rt
	rt, _ := newRouting(routingInput{
		base:    base,
		server:  func(a *staticAddr) *server { return w.srv[a.str] },
		live:    func(s *server) bool { return !out[s.addr.str] },
		old:     old,
		now:     now,
		window:  w.window,
		maxPast: w.maxPast,
	})
	added, lost, _ := w.g.record(old, rt)
	if len(rt.past) > 0 && rt.added {
		rt.past[0].gains = lost
	}
	for i, e := range added {
		e.floor.Store(uint64(i + 1))
	}

	// The reference: past rings whole, and a gain a slot.
	ref := map[uint32]*gain{}
	full := old != nil && old.live != nil && rt.live != nil && old.live.alt == nil && !sameServers(old, rt)
	if full {
		gainOf := map[*server]*gain{}
		for _, e := range added {
			gainOf[e.s] = e
		}
		for i := range uint64(numSlots) {
			os, ns := old.liveSrv[old.live.table.owner(i)], rt.liveSrv[rt.live.table.owner(i)]
			if os == ns {
				continue
			}
			if e := w.slots[uint32(i)]; e != nil {
				ref[uint32(i)] = e
			}
			require.NotNil(t, gainOf[ns])
			w.slots[uint32(i)] = gainOf[ns]
		}
		w.lost = ref
	}
	var keep []refPast
	if old != nil && old.live != nil && !sameServers(old, rt) {
		keep = append(keep, refPast{r: old.live, srv: old.liveSrv, until: now.Add(w.window), gains: ref})
	}
	keep = append(keep, w.past...)
	size, limit := 0, len(keep)
	for i, p := range keep {
		if size += p.r.bytes(); i >= w.maxPast && (size > pastBudget || i >= maxPastRings) {
			limit = i
			break
		}
	}
	w.past = nil
	for _, p := range keep {
		if len(w.past) < limit && now.Before(p.until) {
			w.past = append(w.past, p)
		}
	}
	w.rt, w.now = rt, now
}

// refPrevious is routing.previous over the reference.
func (w *refWorld) refPrevious(h uint64, not *server, now time.Time) []*server {
	var dst []*server
	for _, p := range w.past {
		s := p.srv[p.r.owner(h)]
		if s == not || slices.Contains(dst, s) || !now.IsZero() && !now.Before(p.until) {
			continue
		}
		dst = append(dst, s)
	}
	return dst
}

// refOf is gains.of over the reference.
func (w *refWorld) refOf(s *server, h uint64) *gain {
	slot := uint32(slotOf(h))
	e := w.slots[slot]
	if e == nil {
		return nil
	}
	if e.s == s {
		return e
	}
	if e := w.lost[slot]; e != nil && e.s == s {
		return e
	}
	for _, p := range w.past {
		if e := p.gains[slot]; e != nil && e.s == s {
			return e
		}
	}
	return nil
}

// check compares every lookup of the past for the hashes hs.
func (w *refWorld) check(t *testing.T, step string, hs []uint64) {
	t.Helper()
	rt := w.rt
	require.Len(t, rt.past, len(w.past), "%s: past rings kept", step)
	for i, p := range rt.past {
		require.Equal(t, w.past[i].until, p.until, "%s: past ring %d", step, i)
	}
	var servers []*server
	for _, s := range w.srv {
		servers = append(servers, s)
	}
	for _, s := range servers {
		inRef := false
		for _, p := range w.past {
			inRef = inRef || slices.Contains(p.srv, s)
		}
		require.Equal(t, inRef, rt.inPast(s), "%s: inPast(%s)", step, s.addr.str)
	}
	var buf [maxPastRings]*server
	for _, h := range hs {
		owners := rt.pastOwners(h, buf[:0])
		for i, p := range w.past {
			require.Same(t, p.srv[p.r.owner(h)], owners[i], "%s: slot %d in past ring %d", step, slotOf(h), i)
		}
		for _, now := range []time.Time{{}, w.now, w.now.Add(w.window / 2)} {
			for _, not := range []*server{nil, rt.owner(h), servers[int(h%uint64(len(servers)))]} {
				require.Equal(t, w.refPrevious(h, not, now), rt.previous(h, not, now, nil), "%s: previous of slot %d", step, slotOf(h))
			}
		}
		for _, s := range servers {
			require.Same(t, w.refOf(s, h), w.g.of(s, h, rt.past), "%s: the gain of %s of slot %d", step, s.addr.str, slotOf(h))
		}
	}
}

// TestPastEquivalence runs random changes (members added, removed and
// replaced, servers out, every server out, no members, windows that end
// out of order) through past rings kept as what changed and through whole
// tables, as they were kept before, and compares every lookup of the past:
// the servers of sampled keys in each past ring, routing.previous,
// routing.inPast and gains.of, at each step, and at every slot at the end.
func TestPastEquivalence(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed))
			w := &refWorld{rng: rng, srv: map[string]*server{}, slots: map[uint32]*gain{},
				window: time.Minute, maxPast: 1 + int(seed%4), now: time.Unix(1e9, 0)}
			pool := podIDs(12)
			ids := slices.Clone(pool[:3])
			out := map[string]bool{}
			hs := make([]uint64, 200)
			steps := 30
			if testing.Short() {
				steps = 15
			}
			for step := range steps {
				switch k := rng.IntN(10); {
				case k < 3 && len(ids) < 8: // added
					for _, id := range pool {
						if !slices.Contains(ids, id) {
							ids = append(ids, id)
							break
						}
					}
					rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
				case k < 5 && len(ids) > 1: // removed
					i := rng.IntN(len(ids))
					ids = slices.Delete(ids, i, i+1)
				case k < 6: // replaced
					for _, id := range pool {
						if !slices.Contains(ids, id) {
							ids[rng.IntN(len(ids))] = id
							break
						}
					}
				case k < 8: // a server out, or back
					id := ids[rng.IntN(len(ids))]
					out[id] = !out[id]
				case k < 9: // every server out, or none
					all := !out[ids[0]]
					for _, id := range ids {
						out[id] = all
					}
				default: // no members, for a step
					w.change(t, nil, out, w.now.Add(time.Second))
				}
				// Windows end out of order now and then: a clock that steps back.
				now := w.now.Add(time.Duration(rng.IntN(40)) * time.Second)
				if rng.IntN(8) == 0 {
					now = w.now.Add(-time.Duration(rng.IntN(60)) * time.Second)
				}
				w.change(t, slices.Clone(ids), out, now)
				for i := range hs {
					hs[i] = rng.Uint64()
				}
				w.check(t, fmt.Sprint("step ", step), hs)
			}
			// Every slot at the end.
			all := make([]uint64, numSlots)
			for i := range all {
				all[i] = uint64(i) << (64 - slotBits)
			}
			var buf [maxPastRings]*server
			for _, h := range all {
				owners := w.rt.pastOwners(h, buf[:0])
				for i, p := range w.past {
					if p.srv[p.r.owner(h)] != owners[i] {
						t.Fatalf("slot %d in past ring %d: %s, want %s", slotOf(h), i, owners[i].addr.str, p.srv[p.r.owner(h)].addr.str)
					}
				}
				for _, s := range owners {
					if w.refOf(s, h) != w.g.of(s, h, w.rt.past) {
						t.Fatalf("the gain of %s of slot %d", s.addr.str, slotOf(h))
					}
				}
			}
			require.ElementsMatch(t, refLosers(w), w.rt.losers(), "the servers that hold keys they do not own")
		})
	}
}

// refLosers is routing.losers over the reference.
func refLosers(w *refWorld) []*server {
	var out []*server
	rt := w.rt
	if rt.live == nil {
		return nil
	}
	for _, p := range w.past {
		for slot := range uint64(numSlots) {
			h := slot << (64 - slotBits)
			if was := p.srv[p.r.owner(h)]; was != rt.liveSrv[rt.live.owner(h)] && !slices.Contains(out, was) {
				out = append(out, was)
			}
		}
	}
	return out
}

// TestSlotRuns: runs set over runs, packed (values below 4096) or wide,
// read back slot by slot as a table of every slot would be.
func TestSlotRuns(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets [][]valRun // applied in turn (see slotRuns.with)
	}{
		{"empty", nil},
		{"one run", [][]valRun{{{lo: 10, hi: 20, v: 3}}}},
		{"the whole ring", [][]valRun{{{lo: 0, hi: numSlots - 1, v: 1}}}},
		{"runs over runs", [][]valRun{
			{{lo: 0, hi: 99, v: 1}, {lo: 100, hi: 199, v: 2}, {lo: numSlots - 5, hi: numSlots - 1, v: 7}},
			{{lo: 50, hi: 149, v: 2}, {lo: 150, hi: 150, v: 0}},
		}},
		{"wide values", [][]valRun{{{lo: 5, hi: 6, v: 1 << 20}, {lo: 9, hi: 9, v: 4095}}}},
		{"overlapping runs ignored", [][]valRun{{{lo: 5, hi: 10, v: 1}, {lo: 8, hi: 12, v: 2}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]uint32, numSlots)
			var m slotRuns
			for _, rs := range tc.sets {
				m = m.with(rs)
				next := uint32(0)
				for _, r := range rs {
					if r.lo < next {
						continue
					}
					for i := r.lo; i <= r.hi; i++ {
						want[i] = r.v
					}
					next = r.hi + 1
				}
			}
			c := newRunCursor(&m)
			for i := range uint32(numSlots) {
				if m.at(i) != want[i] || c.at(i) != want[i] {
					t.Fatalf("slot %d: %d (cursor %d), want %d", i, m.at(i), c.at(i), want[i])
				}
			}
			require.Zero(t, testing.AllocsPerRun(100, func() { m.at(12345) }))
		})
	}
}
