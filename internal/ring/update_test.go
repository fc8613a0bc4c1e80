package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// changeMembers returns ms, sorted, without remove members picked by rng and
// with add new ones, whose ids sort among the others.
func changeMembers(rng *rand.Rand, ms []string, add, remove int) []string {
	out := slices.Clone(ms)
	for range min(remove, len(out)) {
		i := rng.IntN(len(out))
		out = slices.Delete(out, i, i+1)
	}
	for range add {
		out = append(out, fmt.Sprintf("memcache-%d:11211", 1000000+rng.IntN(1000000)))
	}
	return canon(out)
}

// requireSameRing fails unless got is the ring New builds over ms.
func requireSameRing(t testing.TB, ms []string, points int, got *Ring) {
	want := New(ms, points)
	require.Equal(t, want.ids, got.ids)
	require.Equal(t, want.n, got.n)
	require.Equal(t, want.points, got.points)
	w, g := want.table, got.table
	if slices.Equal(w.owners4, g.owners4) && slices.Equal(w.owners8, g.owners8) && slices.Equal(w.owners16, g.owners16) &&
		slices.Equal(w.succ.b, g.succ.b) && w.succ.bits == g.succ.bits {
		return // the encoding, padding included
	}
	for s := range uint64(numSlots) {
		wo, ws := w.get(s)
		if o, n := g.get(s); o != wo || n != ws {
			require.Failf(t, "wrong slot", "slot %d: owner %d successor %d, want %d and %d", s, o, n, wo, ws)
		}
	}
	require.Equal(t, w, g, "the encoding, padding included")
}

// TestRingUpdate: With gives exactly New's table over the new members,
// built incrementally where update says it can be.
func TestRingUpdate(t *testing.T) {
	for _, tc := range []struct {
		name        string
		n, points   int // members before
		add, remove int
		update      bool // built incrementally, not by New: with few members a change moves most slots
	}{
		{"1: add 1", 1, 100, 1, 0, false},
		{"2: remove 1", 2, 100, 0, 1, false},
		{"2: replace 1", 2, 100, 1, 1, false},
		{"2: add 1", 2, 2500, 1, 0, false},
		{"3: remove 1", 3, 2500, 0, 1, false},
		{"3: replace 1 at 1 point", 3, 1, 1, 1, false},
		{"10: add 1", 10, defaultPoints, 1, 0, true},
		{"10: remove 1", 10, defaultPoints, 0, 1, true},
		{"10: replace 1", 10, defaultPoints, 1, 1, true},
		{"10: add 3 remove 2", 10, defaultPoints, 3, 2, false},
		{"100: add 3 remove 2", 100, defaultPoints, 3, 2, true},
		{"15 to 16: 4 bits", 15, 100, 1, 0, true},
		{"16 to 17: 4 to 8 bits", 16, 100, 1, 0, false},
		{"17 to 16: 8 to 4 bits", 17, 100, 0, 1, false},
		{"16: replace 1", 16, 7, 1, 1, true},
		{"255 to 256: 8 bits", 255, 7, 1, 0, true},
		{"255 to 257: 8 to 16 bits", 255, 7, 2, 0, false},
		{"257 to 256", 257, 7, 0, 1, false},
		{"300: replace 1 at 1 point", 300, 1, 1, 1, true},
		{"4096 to 4097: successors in 12 to 16 bits", 4096, 1, 1, 0, false},
		{"4097: replace 1, successors in 16 bits", 4097, 1, 1, 1, true},
		{"1000: add 1", 1000, defaultPoints, 1, 0, true},
		{"1000: remove 1", 1000, defaultPoints, 0, 1, true},
		{"1000: replace 1", 1000, defaultPoints, 1, 1, true},
		{"1000: add 5 remove 5", 1000, defaultPoints, 5, 5, true},
		{"1000: replace 1 at 1 point", 1000, 1, 1, 1, true},
		{"1000: replace 1 at 7 points", 1000, 7, 1, 1, true},
		{"1000: replace 1 at 100 points", 1000, 100, 1, 1, true},
		{"1000: replace 200: too many", 1000, defaultPoints, 200, 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.points)))
			ms := canon(podIDs(tc.n))
			old := New(ms, tc.points)
			for range 2 {
				next := changeMembers(rng, ms, tc.add, tc.remove)
				require.Equal(t, tc.update, old.update(next, tc.points) != nil, "built incrementally")
				requireSameRing(t, next, tc.points, old.With(next, tc.points))
			}
		})
	}
}

// TestRingUpdateEnds: members added and removed at either end of the order,
// which leave the other members' indexes, and the wrap around the ring.
func TestRingUpdateEnds(t *testing.T) {
	ms := canon(podIDs(20))
	old := New(ms, 500)
	for _, tc := range []struct {
		name string
		ms   []string
	}{
		{"add first", canon(append(slices.Clone(ms), "a:11211"))},
		{"add last", canon(append(slices.Clone(ms), "z:11211"))},
		{"remove first", ms[1:]},
		{"remove last", ms[:len(ms)-1]},
		{"replace last", canon(append(slices.Clone(ms[:len(ms)-1]), "z:11211"))},
		{"replace first", canon(append(slices.Clone(ms[1:]), "a:11211"))},
		{"no change", ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NotNil(t, old.update(tc.ms, 500))
			requireSameRing(t, tc.ms, 500, old.With(tc.ms, 500))
		})
	}
	require.Nil(t, old.update(ms[1:], 400), "other points per member")
	require.Nil(t, (*Ring)(nil).With(nil, 10))
	require.Nil(t, old.With(nil, 500))
}

// TestRingUpdateChain: a run of random changes, each built from the ring
// before, stays the ring of its members.
func TestRingUpdateChain(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ms := canon(podIDs(40))
	r := New(ms, 300)
	for i := range 20 {
		ms = changeMembers(rng, ms, rng.IntN(3), rng.IntN(3))
		r = r.With(ms, 300)
		t.Run(fmt.Sprint(i), func(t *testing.T) { requireSameRing(t, ms, 300, r) })
	}
}

// FuzzRingUpdate checks With against New over random small member sets
// and changes.
func FuzzRingUpdate(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{2, 3, 4}, uint8(10))
	f.Add([]byte{0}, []byte{0, 1}, uint8(1))
	f.Add([]byte{5, 6, 7, 8}, []byte{5, 7}, uint8(200))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, uint8(3))
	f.Fuzz(func(t *testing.T, before, after []byte, points uint8) {
		ids := func(bs []byte) []string {
			var s []string
			for _, x := range bs {
				s = append(s, fmt.Sprintf("pod-%d:11211", x))
			}
			return canon(s)
		}
		p := int(points%200) + 1
		old, ms := New(ids(before), p), ids(after)
		got := old.With(ms, p)
		if len(ms) == 0 {
			require.Nil(t, got)
			return
		}
		requireSameRing(t, ms, p, got)
	})
}
