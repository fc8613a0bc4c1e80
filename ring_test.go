package selector

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"
)

// members returns members with the given ids, each dialled at its id.
func members(ids ...string) []member {
	ms := make([]member, len(ids))
	for i, id := range ids {
		ms[i] = member{id: id, addr: &staticAddr{network: "tcp", str: id}}
	}
	return ms
}

func podMembers(n int) []member {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("memcache-%d:11211", i)
	}
	return members(ids...)
}

// owner returns the id of the member owning key.
func (r *ring) owner(key string) string {
	return r.pick(xxhash.Sum64String(key)).id
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
		// fingerprint is the xxhash of the owners of key:0 ... key:99999,
		// so that any change to any key's owner shows.
		fingerprint uint64
	}{
		{
			name:   "IPs at the default points",
			ids:    []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"},
			points: DefaultPointsPerServer,
			keys: map[string]string{
				"":                    "10.0.0.2:11211",
				"a":                   "10.0.0.3:11211",
				"foo":                 "10.0.0.3:11211",
				"user:42":             "10.0.0.2:11211",
				"session:7f3a9c":      "10.0.0.3:11211",
				"the quick brown fox": "10.0.0.2:11211",
				"memcache-key-0001":   "10.0.0.2:11211",
				"memcache-key-0002":   "10.0.0.1:11211",
			},
			fingerprint: 0xcd042ac72836dfc2,
		},
		{
			name:   "pod names at 160 points",
			ids:    []string{"memcache-0:11211", "memcache-1:11211", "memcache-2:11211", "memcache-3:11211", "memcache-4:11211"},
			points: 160,
			keys: map[string]string{
				"a":              "memcache-1:11211",
				"foo":            "memcache-0:11211",
				"user:42":        "memcache-2:11211",
				"session:7f3a9c": "memcache-4:11211",
			},
			fingerprint: 0xceb8166e6f71fd4a,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(canonical(members(tc.ids...)), tc.points)
			for key, want := range tc.keys {
				require.Equal(t, want, r.owner(key), "owner of %q", key)
			}
			d := xxhash.New()
			for i := range 100000 {
				d.WriteString(r.owner(fmt.Sprintf("key:%d", i)))
			}
			require.Equal(t, tc.fingerprint, d.Sum64(), "fingerprint of the owners of 100000 keys")
		})
	}
}

// TestRingPoints pins the point names: id + "-" + i in decimal.
func TestRingPoints(t *testing.T) {
	const points = 1234 // crosses 1-, 2-, 3- and 4-digit suffixes
	r := newRing(members("a:1"), points)
	want := make([]uint64, points)
	for i := range want {
		want[i] = xxhash.Sum64String(fmt.Sprintf("a:1-%d", i))
	}
	slices.Sort(want)
	require.Equal(t, want, r.hashes)
}

// TestRingPick checks the indexed lookup against a binary search of the
// sorted points, at hashes around every point (every few points in the big
// rings) and at the edges of the space, for each way the table is sized.
func TestRingPick(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n, points int
		wantTable int // buckets
	}{
		{"one member one point", 1, 1, 4},
		{"one member", 1, 1000, 4000},
		{"three members", 3, 1000, 12000},
		{"many members few points", 50, 3, 600},
		{"500k points: four buckets a point", 1000, 500, 2000000},
		{"1.5M points: at most maxTable", 1000, 1500, maxTable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(canonical(podMembers(tc.n)), tc.points)
			require.Len(t, r.table, tc.wantTable)
			ref := func(h uint64) uint32 {
				i := sort.Search(len(r.hashes), func(i int) bool { return r.hashes[i] >= h })
				if i == len(r.hashes) {
					i = 0
				}
				return r.owners[i]
			}
			probes := []uint64{0, 1, math.MaxUint64, math.MaxUint64 - 1, 1 << 63}
			stride := max(1, len(r.hashes)/20000)
			for i := 0; i < len(r.hashes); i += stride {
				h := r.hashes[i]
				probes = append(probes, h-1, h, h+1)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for range 10000 {
				probes = append(probes, rng.Uint64())
			}
			for _, h := range probes {
				got, want := r.pick(h), &r.members[ref(h)]
				require.Same(t, want, got, "pick(%#x) = %s, want %s", h, got.id, want.id)
			}
		})
	}
}

// TestRingCanonical: the ring is a pure function of the set of ids: order
// and duplicates in the input change nothing.
func TestRingCanonical(t *testing.T) {
	ids := []string{"10.0.0.7:11211", "10.0.0.1:11211", "memcache-3:11211", "10.0.0.4:11211", "10.0.0.2:11211"}
	want := newRing(canonical(members(ids...)), 100)

	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		shuffled := slices.Clone(ids)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		shuffled = append(shuffled, shuffled[:rng.IntN(len(shuffled))]...)
		got := newRing(canonical(members(shuffled...)), 100)
		require.Equal(t, want.hashes, got.hashes)
		require.Equal(t, want.owners, got.owners)
		require.Equal(t, want.members, got.members)
	}
}

// TestRingTies: equal point hashes are ordered by id, whatever the input.
func TestRingTies(t *testing.T) {
	r := &ring{hashes: []uint64{5, 5, 5, 3}, owners: []uint32{2, 0, 1, 2}}
	insertionSort(r.hashes, r.owners, 0, 4)
	require.Equal(t, []uint64{3, 5, 5, 5}, r.hashes)
	require.Equal(t, []uint32{2, 0, 1, 2}, r.owners)
}

// TestRingMovement checks minimal disruption key by key: removing a member
// moves only its keys, adding one moves keys only to it.
func TestRingMovement(t *testing.T) {
	ms := canonical(podMembers(10))
	full := newRing(ms, DefaultPointsPerServer)
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key:%d", i)
	}
	for gone := range ms {
		rest := slices.Delete(slices.Clone(ms), gone, gone+1)
		less := newRing(rest, DefaultPointsPerServer)
		for _, k := range keys {
			before, after := full.owner(k), less.owner(k)
			if before != ms[gone].id {
				require.Equal(t, before, after, "key %q moved between survivors when %s left", k, ms[gone].id)
			}
			// Read in reverse, the same pair is an add of ms[gone].
			if after != before {
				require.Equal(t, ms[gone].id, before, "key %q moved to %s, not to the added member", k, before)
			}
		}
	}
}

func TestRingEmpty(t *testing.T) {
	require.Nil(t, newRing(nil, DefaultPointsPerServer))
	require.False(t, (*ring)(nil).sameIDs(podMembers(1)))
}

func TestIncDecimal(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"x-0", "x-1"}, {"x-9", "x-10"}, {"x-19", "x-20"}, {"x-999", "x-1000"}, {"x-1099", "x-1100"},
	} {
		require.Equal(t, tc.want, string(incDecimal([]byte(tc.in), 2)), tc.in)
	}
}

// TestRingRebuild: a ring rebuilt from the previous one is the ring newRing
// builds, whatever the change.
func TestRingRebuild(t *testing.T) {
	ids := func(lo, hi int) []member {
		var s []string
		for i := lo; i < hi; i++ {
			s = append(s, fmt.Sprintf("10.0.%d.%d:11211", i/250, i%250+1))
		}
		return canonical(members(s...))
	}
	for _, tc := range []struct {
		name     string
		from, to []member
		points   int
	}{
		{"one added", ids(0, 10), ids(0, 11), 100},
		{"one removed", ids(0, 10), ids(1, 10), 100},
		{"one replaced", ids(0, 10), ids(1, 11), 100},
		{"half removed", ids(0, 40), ids(0, 20), 50},
		{"many added", ids(0, 3), ids(0, 60), 50},
		{"all replaced", ids(0, 10), ids(10, 20), 100},
		{"from one member", ids(0, 1), ids(0, 5), 1000},
		{"to one member", ids(0, 5), ids(4, 5), 1000},
		{"one point each", ids(0, 200), ids(100, 300), 1},
		{"at the default points", ids(0, 100), ids(1, 101), DefaultPointsPerServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := newRing(slices.Clone(tc.from), tc.points)
			got := old.rebuild(slices.Clone(tc.to), tc.points)
			want := newRing(slices.Clone(tc.to), tc.points)
			require.Equal(t, want.hashes, got.hashes)
			require.Equal(t, want.scan, got.scan)
			require.Equal(t, want.owners, got.owners)
			require.Equal(t, want.table, got.table)
			require.Equal(t, want.members, got.members)
			require.Equal(t, want.size, got.size)
		})
	}
	t.Run("other points or no members", func(t *testing.T) {
		r := newRing(ids(0, 5), 100)
		require.Equal(t, newRing(ids(0, 6), 160).hashes, r.rebuild(ids(0, 6), 160).hashes)
		require.Nil(t, r.rebuild(nil, 100))
		require.Equal(t, newRing(ids(0, 6), 100).hashes, (*ring)(nil).rebuild(ids(0, 6), 100).hashes)
	})
}

// TestRingMerge: merged runs are ordered by hash and then by new owner, and
// the points of members that left are dropped.
func TestRingMerge(t *testing.T) {
	hashes, owners := merge(
		[]uint64{1, 5, 5, 9}, []uint32{0, 1, 2, 1}, []uint32{0, 3, gone}, // old members 0, 1 stay as 0, 3; 2 left
		[]uint64{5, 9, 12}, []uint32{0, 0, 1}, []uint32{2, 4}, // new members 0, 1 are 2, 4
	)
	require.Equal(t, []uint64{1, 5, 5, 9, 9, 12, math.MaxUint64}, hashes)
	require.Equal(t, []uint32{0, 2, 3, 2, 3, 4}, owners)
}

// FuzzRingRebuild: a ring rebuilt from any previous ring is the ring built
// from scratch, and every key's owner is the first point at or after it.
func FuzzRingRebuild(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{2, 3, 4}, uint8(10))
	f.Add([]byte{0}, []byte{}, uint8(1))
	f.Add([]byte{5, 5, 6}, []byte{6, 7, 7, 8}, uint8(200))
	f.Fuzz(func(t *testing.T, from, to []byte, points uint8) {
		ids := func(b []byte) []member {
			var ms []member
			for _, x := range b {
				ms = append(ms, member{id: fmt.Sprintf("pod-%d:11211", x), addr: &staticAddr{network: "tcp", str: fmt.Sprintf("10.0.0.%d:11211", x)}})
			}
			return canonical(ms)
		}
		p := int(points%50) + 1
		old := newRing(ids(from), p)
		got := old.rebuild(ids(to), p)
		want := newRing(ids(to), p)
		if want == nil {
			require.Nil(t, got)
			return
		}
		require.Equal(t, want.hashes, got.hashes)
		require.Equal(t, want.owners, got.owners)
		require.Equal(t, want.table, got.table)
		for _, h := range []uint64{0, math.MaxUint64, want.hashes[0], want.hashes[len(want.hashes)-1] + 1} {
			i := sort.Search(len(want.hashes), func(i int) bool { return want.hashes[i] >= h })
			if i == len(want.hashes) {
				i = 0
			}
			require.Equal(t, want.members[want.owners[i]].id, got.pick(h).id)
		}
	})
}
