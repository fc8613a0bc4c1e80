package selector

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gainsWorld builds routings over named servers, as Client.refresh does,
// and records their gains.
type gainsWorld struct {
	g      gains
	srv    map[string]*server
	rt     *routing
	now    time.Time
	losses []loss // the last change's
}

func (w *gainsWorld) change(t *testing.T, ids ...string) (added []*gain) {
	t.Helper()
	if w.srv == nil {
		w.srv = map[string]*server{}
	}
	for _, id := range ids {
		if w.srv[id] == nil {
			w.srv[id] = &server{addr: &staticAddr{network: "tcp", str: id}}
		}
	}
	w.now = w.now.Add(time.Second)
	rt, _ := newRouting(routingInput{
		base:    newRing(canonical(members(ids...)), DefaultPointsPerServer),
		server:  func(a *staticAddr) *server { return w.srv[a.str] },
		live:    func(*server) bool { return true },
		old:     w.rt,
		now:     w.now,
		window:  time.Hour,
		maxPast: 4,
	})
	added, lost, losses := w.g.record(w.rt, rt)
	w.losses = losses
	if len(rt.past) > 0 && w.rt != nil && rt.past[0].r == w.rt.live {
		rt.past[0].gains = lost
	}
	for i, e := range added {
		e.floor.Store(uint64(100*len(w.g.list()) + i)) // distinct, increasing
	}
	w.rt = rt
	return added
}

// slotMoved returns the hash of a slot that from gives to fromID and w's
// routing now to toID.
func slotMoved(t *testing.T, w *gainsWorld, from *routing, fromID, toID string) uint64 {
	t.Helper()
	for i := range uint64(1 << slotBits) {
		h := i << (64 - slotBits)
		if from.owner(h) == w.srv[fromID] && w.rt.owner(h) == w.srv[toID] {
			return h
		}
	}
	t.Fatalf("no slot moved from %s to %s", fromID, toID)
	return 0
}

func TestGains(t *testing.T) {
	var w gainsWorld
	require.Empty(t, w.change(t, "a", "b"), "the first ring gains nothing: no history is needed")
	ab := w.rt
	h0 := uint64(12345) << (64 - slotBits)
	require.Nil(t, w.g.of(ab.owner(h0), h0, ab.past), "no change yet: no floor")

	require.Len(t, w.change(t, "a", "b", "c"), 1, "c gains")
	h := slotMoved(t, &w, ab, "a", "c")
	ec := w.g.of(w.srv["c"], h, w.rt.past)
	require.NotNil(t, ec)
	require.Same(t, w.srv["c"], ec.s)
	require.Nil(t, w.g.of(w.srv["a"], h, w.rt.past), "a gained nothing: its values from before are its own")
	abc := w.rt

	added := w.change(t, "a", "b")
	require.Len(t, added, 2, "a and b gain c's slots back")
	ea := w.g.of(w.srv["a"], h, w.rt.past)
	require.NotNil(t, ea, "a gained h's slot back")
	require.Same(t, w.srv["a"], ea.s)
	require.Same(t, ec, w.g.of(w.srv["c"], h, w.rt.past), "c, a former owner, keeps its floor in the past ring")

	w.change(t, "a", "b", "c")
	require.Equal(t, abc.owner(h), w.rt.owner(h), "the slot is c's again")
	require.Same(t, ea, w.g.of(w.srv["a"], h, w.rt.past), "a, which just lost it, keeps the floor it took when it gained it back")
	require.NotSame(t, ec, w.g.of(w.srv["c"], h, w.rt.past), "c has a newer gain")

	// Runs: each covers slots that moved, in order, with the gain they had.
	for _, p := range w.rt.past {
		for i, r := range p.gains {
			require.LessOrEqual(t, r.lo, r.hi)
			if i > 0 {
				require.Less(t, p.gains[i-1].hi, r.lo)
			}
			require.NotNil(t, r.e)
		}
	}
}

// TestGainsCompactKeepsThePast: compaction drops only the gains that
// neither a slot nor a kept past ring refers to.
func TestGainsCompactKeepsThePast(t *testing.T) {
	var w gainsWorld
	w.change(t, "a", "b")
	w.change(t, "a", "b", "c")
	w.change(t, "a", "b")
	kept := map[*gain]bool{}
	for _, p := range w.rt.past {
		for _, r := range p.gains {
			kept[r.e] = true
		}
	}
	require.NotEmpty(t, kept)
	w.g.mu.Lock()
	evs := w.g.compact(w.g.list(), w.rt.past)
	w.g.mu.Unlock()
	for e := range kept {
		require.Contains(t, evs, e)
	}
	require.NotContains(t, evs[1:], (*gain)(nil))
	for _, e := range evs[1:] {
		require.NotEqual(t, uint64(math.MaxUint64), e.floor.Load())
	}
}

// BenchmarkGainsRecord: recording a change of one server out of 4 (a
// failover), then back, as Client.refresh does on every change: it walks
// every slot, and holds the refresh meanwhile.
func BenchmarkGainsRecord(b *testing.B) {
	srv := map[string]*server{}
	rings := make([]*routing, 2)
	for i, ids := range [][]string{{"a", "b", "c", "d"}, {"a", "b", "c"}} {
		for _, id := range ids {
			if srv[id] == nil {
				srv[id] = &server{addr: &staticAddr{network: "tcp", str: id}}
			}
		}
		rings[i], _ = newRouting(routingInput{
			base:   newRing(canonical(members(ids...)), DefaultPointsPerServer),
			server: func(a *staticAddr) *server { return srv[a.str] },
			live:   func(*server) bool { return true },
		})
	}
	var g gains
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		g.record(rings[i%2], rings[(i+1)%2])
	}
}
