package ring

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"
)

// The bucketed build gives the same table on any number of goroutines: the
// members' points split among them, then the buckets, which each reduces
// from a run's end back, after reading ahead of it.
func TestBucketTableWorkers(t *testing.T) {
	for _, tc := range []struct{ n, points int }{{1, 10}, {2, 1}, {3, 2500}, {17, 100}, {300, 500}, {4097, 3}} {
		ms := canon(podIDs(tc.n))
		want := sortedTable(ms, tc.points)
		for _, w := range []int{1, 2, 3, maxWorkers} {
			for _, chunk := range []int{buildChunk, tc.points} {
				t.Run(fmt.Sprintf("%dx%d/w=%d/chunk=%d", tc.n, tc.points, w, chunk), func(t *testing.T) {
					require.Equal(t, want, bucketTableOn(ms, tc.points, chunk, w))
				})
			}
		}
	}
}

// Buckets too small for their points keep the rest in spill, and a
// bucket's build states are those of all its points.
func TestBucketsSpill(t *testing.T) {
	ms := canon(podIDs(40))
	seeds := make([]uint64, len(ms))
	for m, id := range ms {
		seeds[m] = xxhash.Sum64String(id)
	}
	for _, size := range []int{0, 1, 100, 1000} {
		bk := &buckets{pts: make([]uint64, numBuckets*size), size: size}
		bk.fill(seeds, 5, len(ms), 3000)
		want := make([]slotBuild, numSlots)
		for m := 5; m < len(ms); m++ {
			for i := range 3000 {
				k := pointKey(seeds[m], i, m)
				want[slotOf(k)].add(k)
			}
		}
		got := make([]slotBuild, numSlots)
		for i := range numBuckets {
			bk.addTo(got[i*bucketSlots:], i)
		}
		require.Equal(t, want, got, "size %d, %d spilled", size, len(bk.spill))
	}
}
