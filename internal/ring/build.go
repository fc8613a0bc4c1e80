package ring

import (
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// The bucketed build, of a ring of many points (see New): the points are
// bucketed by slot, and each bucket is reduced to a build state per slot,
// from which its slots of the table are filled.

const (
	bucketBits  = 10 // a build's buckets of slots: 2^10
	numBuckets  = 1 << bucketBits
	bucketSlots = numSlots / numBuckets // 2^10, whose build states take 16 KB, which stay in the L1 cache
	// maxWorkers is the most goroutines a build runs on (see bucketTable).
	maxWorkers = 4
)

// bucketTable returns the table of ms from all their points, on up to
// maxWorkers goroutines (GOMAXPROCS). See bucketTableOn.
func bucketTable(ms []string, points, chunk int) slotTable {
	return bucketTableOn(ms, points, chunk, min(runtime.GOMAXPROCS(0), maxWorkers))
}

// bucketTableOn returns the table of ms from all their points, bucketed by
// slot (see buckets), on w goroutines. The points of a bucket are reduced
// to a build state for each of its slots, 16 KB that stay in the L1 cache,
// from which its slots of the table are filled at once (see fillTable): a
// point costs a write to its bucket, a read in order and an update in the
// L1 cache, and no array of every slot's build state (16 MB) is cleared,
// updated outside the L1 cache and read again. Beyond chunk points, the
// points are bucketed half as many at a time, and all but the last chunk's
// go to such an array, b, which each bucket's states start from.
//
// Each goroutine buckets the points of a share of the members, and then
// reduces a share of the buckets, from the points all the goroutines
// bucketed: a slot's build state depends only on the set of its points,
// and so the table does not depend on w. At 1000 members, 2 goroutines
// take about half the time of one.
func bucketTableOn(ms []string, points, chunk, w int) slotTable {
	if len(ms)*points > chunk {
		chunk /= 2
	}
	chunk = max(1, chunk/points) // in members
	seeds := make([]uint64, len(ms))
	for m := range ms {
		seeds[m] = xxhash.Sum64String(ms[m])
	}
	parts := make([]*buckets, w) // parts[g] holds the points goroutine g bucketed
	var b []slotBuild
	if len(ms) > chunk {
		b = make([]slotBuild, numSlots)
	}
	for lo := 0; ; lo += chunk {
		hi := min(lo+chunk, len(ms))
		parallel(w, func(g int) {
			if parts[g] == nil {
				parts[g] = newBuckets((min(len(ms), chunk) + w - 1) / w * points)
			}
			parts[g].fill(seeds, lo+(hi-lo)*g/w, lo+(hi-lo)*(g+1)/w, points)
		})
		if hi == len(ms) {
			break
		}
		parallel(w, func(g int) {
			for i := numBuckets * g / w; i < numBuckets*(g+1)/w; i++ { // a bucket at a time: its 16 KB of b stay in cache
				for _, p := range parts {
					p.addTo(b[i*bucketSlots:], i)
				}
			}
		})
	}
	return fillTable(len(ms), w, func(states []slotBuild, i int) {
		if b != nil {
			copy(states, b[i*bucketSlots:])
		} else {
			clear(states)
		}
		for _, p := range parts {
			p.addTo(states, i)
		}
	})
}

// parallel runs f(0) to f(w-1) at once, and returns when all have.
func parallel(w int, f func(g int)) {
	var wg sync.WaitGroup
	for g := 1; g < w; g++ {
		wg.Go(func() { f(g) })
	}
	f(0)
	wg.Wait()
}

// buckets holds points bucketed by their top bucketBits bits. Each bucket
// has room for two standard deviations more points than the mean, so that
// the points are drawn once, not also counted first to size the buckets (a
// tenth of the build at 1000 members); the points of a full bucket, a few
// in one bucket in fifty, go to spill.
type buckets struct {
	pts   []uint64 // bucket i is pts[i*size:][:n[i]]
	n     [numBuckets]int
	size  int
	spill []uint64 // sorted after fill
}

// newBuckets returns buckets for about n points.
func newBuckets(n int) *buckets {
	mean := float64(n) / numBuckets
	size := int(mean+2*math.Sqrt(mean)) + 8
	return &buckets{pts: make([]uint64, numBuckets*size), size: size}
}

// fill empties bk and buckets the points of members lo to hi, whose ids
// hash to seeds[lo:hi] (see pointKey).
func (bk *buckets) fill(seeds []uint64, lo, hi, points int) {
	bk.n, bk.spill = [numBuckets]int{}, bk.spill[:0]
	for m := lo; m < hi; m++ {
		for i := range points {
			k := pointKey(seeds[m], i, m)
			b := k >> (64 - bucketBits)
			if n := bk.n[b]; n < bk.size { // almost always, which the CPU predicts
				bk.pts[int(b)*bk.size+n] = k
				bk.n[b] = n + 1
			} else {
				bk.spill = append(bk.spill, k)
			}
		}
	}
	slices.Sort(bk.spill)
}

// addTo adds the points of bucket i to states, the build states of its
// slots.
func (bk *buckets) addTo(states []slotBuild, i int) {
	states = states[:bucketSlots]
	for _, k := range bk.pts[i*bk.size:][:bk.n[i]] {
		states[slotOf(k)%bucketSlots].add(k)
	}
	at, _ := slices.BinarySearch(bk.spill, uint64(i)<<(64-bucketBits))
	for _, k := range bk.spill[at:] {
		if k>>(64-bucketBits) != uint64(i) {
			break
		}
		states[slotOf(k)%bucketSlots].add(k)
	}
}

// slotBuild is what the build knows of one slot: its first point, and its
// first point of a member other than the first's. It holds their
// complements, so that its zero value is empty (the complement of
// noPoint) and a new build state needs no initialization.
type slotBuild struct{ notFirst, notOther uint64 }

func owner(k uint64) uint16 { return uint16(k & (1<<ownerBits - 1)) }

func (s slotBuild) first() uint64 { return ^s.notFirst }
func (s slotBuild) other() uint64 { return ^s.notOther }

// add adds point k to the slot. Of k and the slot's first point, the lower
// is the new first, and the higher a candidate for the first of another
// member. It is written without branches, which the CPU would mispredict
// for about every other point, as points come in no order: adding the 3
// million points of 1000 members took 20 ms with them, 5.7 without.
func (s *slotBuild) add(k uint64) {
	first, c := min(k, s.first()), max(k, s.first())
	if owner(c) == owner(first) {
		c = noPoint
	}
	s.notFirst, s.notOther = ^first, ^min(c, s.other())
}

// fillTable returns the table of n members from the build state of every
// slot, which state(states, i) sets for bucket i's slots, on w goroutines.
// A slot's owner is the member of the first point at or after its start,
// and its successor the first member after that one along the ring: both
// are those of the first slot, at or after it, that holds a point. So one
// pass from the end of a run of buckets carries (owner, successor) back
// from each slot with a point to the slots before it, starting from those
// of the first slot with a point after the run (see ahead), which the last
// slots of the ring wrap around to. Each goroutine fills a run.
func fillTable(n, w int, state func(states []slotBuild, i int)) slotTable {
	t := makeSlotTable(n, nil)
	parallel(w, func(g int) {
		var states [bucketSlots]slotBuild
		var owners, succs [bucketSlots]uint16
		lo, hi := numBuckets*g/w, numBuckets*(g+1)/w
		own, next := ahead(states[:], hi%numBuckets, state)
		for i := hi - 1; i >= lo; i-- {
			state(states[:], i)
			for s := bucketSlots - 1; s >= 0; s-- {
				own, next = carry(states[s], own, next)
				owners[s], succs[s] = own, next
			}
			t.put(i*bucketSlots, owners[:], succs[:])
		}
	})
	return t
}

// carry returns the owner and successor of slot s with build state b, given
// those of the slots after it: its own first member, and its own second
// member, or else the owner after it if that is another member, or else the
// successor after it; or, for a slot without a point, those after it. It
// is written without branches, which the CPU would mispredict: about a
// fifth of the slots hold no point or one member's, in no order. Over the
// 2^20 slots of 1000 members, it took 5.1 ms with them, 3.2 without.
func carry(b slotBuild, own, next uint16) (uint16, uint16) {
	o, n := owner(b.first()), owner(b.other())
	after := next
	if own != o {
		after = own
	}
	if b.notOther == 0 {
		n = after
	}
	if b.notFirst == 0 {
		o, n = own, next
	}
	return o, n
}

// ahead returns the owner and successor of the first slot with a point
// from the start of bucket i on, around the ring: carry's recursion read
// forward from it, up to the first member other than its owner (most often
// in bucket i). With one member, both are it. It reads the build states
// into states.
func ahead(states []slotBuild, i int, state func(states []slotBuild, i int)) (own, next uint16) {
	found := false
	for j := range numBuckets {
		state(states, (i+j)%numBuckets)
		for _, b := range states {
			switch {
			case b.notFirst == 0:
			case !found:
				own, found = owner(b.first()), true
				if b.notOther != 0 {
					return own, owner(b.other())
				}
			case owner(b.first()) != own:
				return own, owner(b.first())
			case b.notOther != 0:
				return own, owner(b.other())
			}
		}
	}
	return own, own
}
