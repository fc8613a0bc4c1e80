package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"
)

// defaultPoints is the root's defaultPoints: the points per
// member that the golden vectors pin.
const defaultPoints = 3000

// canon returns ids sorted, without duplicates: what New takes, as the
// root's canonical makes its members.
func canon(ids []string) []string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return slices.Compact(s)
}

// podIDs returns the ids memcache-0:11211 to memcache-<n-1>:11211.
func podIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("memcache-%d:11211", i)
	}
	return ids
}

// ownerID returns the id of the member owning key.
func (r *Ring) ownerID(key string) string {
	return r.ids[r.Owner(xxhash.Sum64String(key))]
}

// refTable computes every slot's owner and successor the slow, obvious way:
// all points sorted by their top 50 bits, then by member index; a slot's
// owner is the member of the first point at or after its start, wrapping
// around, and its successor the next distinct member along the ring.
func refTable(ms []string, points int) (owner, succ []uint32) {
	type pt struct {
		v uint64 // top 50 bits
		o uint32
	}
	var pts []pt
	for m := range ms {
		seed := xxhash.Sum64String(ms[m])
		for i := range points {
			pts = append(pts, pt{point(seed, i) >> ownerBits, uint32(m)})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		if a.v != b.v {
			if a.v < b.v {
				return -1
			}
			return 1
		}
		return int(a.o) - int(b.o)
	})
	// diff[i] is the member of the first point after i, wrapping around,
	// that is not pts[i]'s (pts[i]'s own if there is none).
	diff := make([]uint32, len(pts))
	for i := range pts {
		diff[i] = pts[i].o
		for j := 1; j < len(pts) && diff[i] == pts[i].o; j++ {
			diff[i] = pts[(i+j)%len(pts)].o
		}
	}
	owner, succ = make([]uint32, 1<<slotBits), make([]uint32, 1<<slotBits)
	i := 0
	for s := range owner {
		start := uint64(s) << (64 - slotBits) >> ownerBits
		for i < len(pts) && pts[i].v < start {
			i++
		}
		p := i % len(pts)
		owner[s], succ[s] = pts[p].o, diff[p]
	}
	return owner, succ
}

// TestRingTable checks every slot of the table against refTable, for every
// width of the table's encoding.
func TestRingTable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n, points int
		ownerBits int // a slot
		succBits  uint64
	}{
		{"one member one point", 1, 1, 4, 8},
		{"one member", 1, 100, 4, 8},
		{"two members one point each", 2, 1, 4, 8},
		{"three members", 3, 1000, 4, 8},
		{"16 members: 4 bits", 16, 50, 4, 8},
		{"17 members: 8 bits", 17, 50, 8, 8},
		{"256 members: 8 bits", 256, 5, 8, 8},
		{"257 members: 16 and 12 bits", 257, 5, 16, 12},
		{"4097 members: 16 bits", 4097, 1, 16, 16},
		{"bucketed build: 3 members", 3, 50000, 4, 8},
		{"bucketed build: 300 members", 300, 500, 16, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := canon(podIDs(tc.n))
			r := New(ms, tc.points)
			require.Equal(t, tc.ownerBits<<slotBits/8, len(r.table.owners4)+len(r.table.owners8)+2*len(r.table.owners16))
			require.Equal(t, tc.succBits, r.table.succ.bits)
			require.Len(t, r.table.succ.b, int(tc.succBits)<<slotBits/8+1)
			owner, succ := refTable(ms, tc.points)
			for s := range uint64(1 << slotBits) {
				o, n := r.table.get(s)
				if o != owner[s] || n != succ[s] {
					require.Failf(t, "wrong slot", "slot %d: owner %d successor %d, want %d and %d", s, o, n, owner[s], succ[s])
				}
			}
			first, second := r.Owners(0)
			require.Equal(t, owner[0], first)
			require.Equal(t, succ[0], second)
			require.Equal(t, first, r.Owner(1<<(64-slotBits)-1), "the last hash of slot 0")
		})
	}
}

// TestRingGolden pins the key-to-member mapping. If this test fails, the
// change remaps the caches of every user on upgrade: do not update the
// table unless that is intended and released as a breaking change.
func TestRingGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ids    []string
		points int
		keys   map[string]string // key -> owner
		// fingerprint is the xxhash of the owners and successors of key:0
		// ... key:99999, so that any change to any key's owners shows.
		fingerprint uint64
	}{
		{
			name:   "IPs at the default points",
			ids:    []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"},
			points: defaultPoints,
			keys: map[string]string{
				"":                    "10.0.0.3:11211",
				"a":                   "10.0.0.1:11211",
				"foo":                 "10.0.0.3:11211",
				"user:42":             "10.0.0.1:11211",
				"session:7f3a9c":      "10.0.0.3:11211",
				"the quick brown fox": "10.0.0.2:11211",
				"memcache-key-0001":   "10.0.0.3:11211",
				"memcache-key-0002":   "10.0.0.1:11211",
			},
			fingerprint: 0x2e86c82b08a8d9fb,
		},
		{
			name:   "pod names at 160 points",
			ids:    []string{"memcache-0:11211", "memcache-1:11211", "memcache-2:11211", "memcache-3:11211", "memcache-4:11211"},
			points: 160,
			keys: map[string]string{
				"a":              "memcache-2:11211",
				"foo":            "memcache-1:11211",
				"user:42":        "memcache-0:11211",
				"session:7f3a9c": "memcache-3:11211",
			},
			fingerprint: 0xcb62ee26d65333b6,
		},
		{
			name:   "300 pods at 500 points: the bucketed build",
			ids:    podIDs(300),
			points: 500,
			keys: map[string]string{
				"a":              "memcache-59:11211",
				"foo":            "memcache-33:11211",
				"user:42":        "memcache-224:11211",
				"session:7f3a9c": "memcache-9:11211",
			},
			fingerprint: 0x7be776b0d51accc,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(canon(tc.ids), tc.points)
			got := map[string]string{}
			for key := range tc.keys {
				got[key] = r.ownerID(key)
			}
			d := xxhash.New()
			for i := range 100000 {
				o, s := r.Owners(xxhash.Sum64String(fmt.Sprintf("key:%d", i)))
				d.WriteString(r.ids[o] + " " + r.ids[s] + "\n")
			}
			require.Equal(t, tc.keys, got)
			require.Equal(t, tc.fingerprint, d.Sum64(), "fingerprint of the owners of 100000 keys: %#x", d.Sum64())
		})
	}
}

// TestRingPoints pins how points are drawn from the id's xxhash, and that a
// member's points do not repeat.
func TestRingPoints(t *testing.T) {
	seed := xxhash.Sum64String("memcache-0:11211")
	require.Equal(t, []uint64{0x318998fa00a9f349, 0x6ff607317d67c664, 0x3e6a8601db77a41e}, []uint64{point(seed, 0), point(seed, 1), point(seed, 1000)})
	seen := map[uint64]bool{}
	for i := range 100000 {
		p := point(seed, i)
		require.False(t, seen[p], "point %d repeats", i)
		seen[p] = true
	}
}

// TestRingCanonical: the ring is a pure function of the set of ids: order
// and duplicates in the input change nothing.
func TestRingCanonical(t *testing.T) {
	ids := []string{"10.0.0.7:11211", "10.0.0.1:11211", "memcache-3:11211", "10.0.0.4:11211", "10.0.0.2:11211"}
	want := New(canon(ids), 100)

	rng := rand.New(rand.NewPCG(3, 4))
	for range 5 {
		shuffled := slices.Clone(ids)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		shuffled = append(shuffled, shuffled[:rng.IntN(len(shuffled))]...)
		got := New(canon(shuffled), 100)
		require.Equal(t, want.table, got.table)
		require.Equal(t, want.ids, got.ids)
	}
}

// TestSlotBuild: a slot keeps its first point and its first point of
// another member; equal points are ordered by member, whatever the order
// they come in.
func TestSlotBuild(t *testing.T) {
	k := func(v uint64, o uint16) uint64 { return v<<ownerBits | uint64(o) }
	for _, tc := range []struct {
		name         string
		points       []uint64
		first, other uint64
	}{
		{"empty", nil, noPoint, noPoint},
		{"one point", []uint64{k(5, 1)}, k(5, 1), noPoint},
		{"one member", []uint64{k(5, 1), k(3, 1), k(9, 1)}, k(3, 1), noPoint},
		{"second member later", []uint64{k(5, 1), k(9, 2), k(7, 2)}, k(5, 1), k(7, 2)},
		{"second member first", []uint64{k(5, 1), k(3, 2)}, k(3, 2), k(5, 1)},
		{"first member moves ahead", []uint64{k(5, 1), k(7, 2), k(3, 1)}, k(3, 1), k(7, 2)},
		{"a third member between", []uint64{k(3, 1), k(9, 2), k(5, 3)}, k(3, 1), k(5, 3)},
		{"ties by member", []uint64{k(5, 2), k(5, 0), k(5, 1)}, k(5, 0), k(5, 1)},
		{"ties by member, other order", []uint64{k(5, 1), k(5, 2), k(5, 0)}, k(5, 0), k(5, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s slotBuild
			for _, p := range tc.points {
				s.add(p)
			}
			require.Equal(t, tc.first, s.first())
			require.Equal(t, tc.other, s.other())
		})
	}
}

// TestRingMovement checks minimal disruption slot by slot: removing a member
// moves only its slots, each to that slot's successor, and adding one moves
// slots only to it.
func TestRingMovement(t *testing.T) {
	ms := canon(podIDs(10))
	full := New(ms, defaultPoints)
	for gone := range ms {
		rest := slices.Delete(slices.Clone(ms), gone, gone+1)
		less := New(rest, defaultPoints)
		moved := 0
		for s := range uint64(1 << slotBits) {
			o, n := full.table.get(s)
			after, _ := less.table.get(s)
			before, next, now := full.ids[o], full.ids[n], less.ids[after]
			switch {
			case before == ms[gone]:
				moved++
				if now != next {
					require.Failf(t, "wrong successor", "slot %d of %s went to %s, not to its successor %s", s, before, now, next)
				}
			case now != before: // read in reverse, this is an add of ms[gone]
				require.Failf(t, "moved between survivors", "slot %d moved from %s to %s when %s left", s, before, now, ms[gone])
			}
		}
		require.NotZero(t, moved)
	}
}

func TestRingEmpty(t *testing.T) {
	require.Nil(t, New(nil, defaultPoints))
}

// FuzzRing checks random member sets against refTable at random slots.
func FuzzRing(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint8(10), uint64(1))
	f.Add([]byte{0}, uint8(1), uint64(2))
	f.Add([]byte{5, 5, 6, 200, 201}, uint8(200), uint64(3))
	f.Fuzz(func(t *testing.T, ids []byte, points uint8, seed uint64) {
		var s []string
		for _, x := range ids {
			s = append(s, fmt.Sprintf("pod-%d:11211", x))
		}
		ms := canon(s)
		p := int(points%50) + 1
		r := New(ms, p)
		if len(ms) == 0 {
			require.Nil(t, r)
			return
		}
		owner, succ := refTable(ms, p)
		rng := rand.New(rand.NewPCG(seed, 0))
		for range 1000 {
			slot := rng.Uint64N(1 << slotBits)
			o, n := r.table.get(slot)
			require.Equal(t, owner[slot], o, "owner of slot %d", slot)
			require.Equal(t, succ[slot], n, "successor of slot %d", slot)
		}
	})
}

// candidates lists distinct members, owner and successor first, and all of
// them when asked for all; it allocates nothing with room in dst.
func TestRingCandidates(t *testing.T) {
	r := New(canon(podIDs(10)), 100)
	dst := make([]uint32, 0, 10)
	for i := range 1000 {
		h := xxhash.Sum64String(fmt.Sprint("key:", i))
		c := r.Candidates(h, 10, dst[:0])
		require.Len(t, c, 10)
		o, n := r.table.get(slotOf(h))
		require.Equal(t, []uint32{o, n}, c[:2])
		sorted := slices.Sorted(slices.Values(c))
		require.Equal(t, []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, sorted)
		require.Equal(t, c[:3], r.Candidates(h, 3, nil))
	}
	require.Equal(t, []uint32{0}, New(podIDs(1), 10).Candidates(5, 3, nil))
	require.Zero(t, testing.AllocsPerRun(100, func() { r.Candidates(12345, 4, dst[:0]) }))
}

// The two builds, sorted points and bucketed build states, give the same
// table, on each side of sortedBuildMax, with the points bucketed at once
// and in chunks (of many members, of one, and of fewer points than one
// member has), which go through the array of every slot's build state.
func TestRingBuildsAgree(t *testing.T) {
	for _, tc := range []struct{ n, points int }{{1, 10}, {2, 1}, {3, 2500}, {10, 2500}, {17, 100}, {40, 2500}, {100, 3000}, {256, 7}, {300, 500}, {4097, 3}} {
		for _, chunk := range []int{buildChunk, 1 << 16, tc.points, 1} {
			t.Run(fmt.Sprintf("%dx%d/chunk=%d", tc.n, tc.points, chunk), func(t *testing.T) {
				ms := canon(podIDs(tc.n))
				require.Equal(t, sortedTable(ms, tc.points), bucketTable(ms, tc.points, chunk))
			})
		}
	}
}

// sortKeys sorts as slices.Sort does, uniform points as well as points that
// share their top bits, which it finishes by insertion up to a bound.
func TestSortKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 255, 256, 1000, 30000, 1 << 20} {
		for _, collide := range []uint64{0, ^uint64(0) >> 8} {
			pts := make([]uint64, n)
			for i := range pts {
				pts[i] = rng.Uint64() &^ collide
			}
			want := slices.Clone(pts)
			slices.Sort(want)
			sortKeys(pts)
			require.Equal(t, want, pts, "%d points, collide %x", n, collide)
		}
	}
}
