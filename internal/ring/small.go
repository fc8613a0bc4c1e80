package ring

import (
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// The sorted builds, of a ring of few points (see New): sortedTable,
// and bytesTable for a ring of up to 256 members, whose owners and
// successors take a byte or half of one: the common case of a few servers,
// where a build is mostly writing 1.5 or 2 MB of table. bytesTable writes
// the encoded table directly, a run of slots at a time, rather than two
// arrays of 2^20 uint16s that newSlotTable would then read again (as
// sortedTable does).

const (
	sortedBuildMax   = 1 << 17 // the most points New sorts beyond byteTableMembers
	byteTableMembers = 1 << 8  // the most members whose table bytesTable builds
	// byteBuildMax is the most points bytesTable sorts: the points and the
	// sort's buffer take 16 bytes each, twice what the bucketed build (see
	// bucketTable) takes, which is slower up to this many (at 256 members
	// of 3000 points, 13.5 ms against 10.5 measured in CPU time).
	byteBuildMax = 1 << 20
)

// sortedTable returns the table of ms from all their points, sorted. A
// slot's owner is the member of the first point at or after its start; its
// successor, the member of the first point after that one of another member
// (next, computed from the end, twice for the wrap around).
func sortedTable(ms []string, points int) slotTable {
	if len(ms) <= byteTableMembers {
		return bytesTable(ms, points) // the same table, written directly
	}
	pts := sortedPoints(ms, points)
	next := make([]uint16, len(pts))
	after := owner(pts[0]) // the successor of the point after i
	for range 2 {
		for i := len(pts) - 1; i >= 0; i-- {
			o, n := owner(pts[i]), owner(pts[(i+1)%len(pts)])
			if n == o {
				n = after
			}
			next[i], after = n, n
		}
	}
	// Point p is the first at or after the starts of the slots after
	// point p-1's, up to its own; the slots after the last point's wrap
	// around to point 0.
	own, succ := make([]uint16, 1<<slotBits), make([]uint16, 1<<slotBits)
	lo := 0
	for p, k := range pts {
		hi := int(slotOf(k)) + 1
		fill(own[lo:hi], owner(k))
		fill(succ[lo:hi], next[p])
		lo = hi
	}
	fill(own[lo:], owner(pts[0]))
	fill(succ[lo:], next[0])
	return newSlotTable(own, succ, len(ms))
}

func fill[T uint8 | uint16](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}

// sortedPoints returns the point keys of all of ms's points (see pointKey),
// sorted.
func sortedPoints(ms []string, points int) []uint64 {
	pts := make([]uint64, 0, len(ms)*points)
	for m := range ms {
		seed := xxhash.Sum64String(ms[m])
		for i := range points {
			pts = append(pts, pointKey(seed, i, m))
		}
	}
	sortKeys(pts)
	return pts
}

// bytesTable returns the table of ms, at most byteTableMembers, from all
// their points, sorted: the table sortedTable and fillTable give.
//
// A slot's owner is the member of the first point at or after its start,
// and its successor the member of the first point after that one of another
// member. One pass from the last point back carries the successor of the
// point after, so the successors need no array of their own.
func bytesTable(ms []string, points int) slotTable {
	pts := sortedPoints(ms, points)

	t := slotTable{succ: packed{b: make([]byte, numSlots+1), bits: 8}} // the last byte is padding (see packed)
	if len(ms) <= 1<<4 {
		t.owners4 = make([]uint8, numSlots/2)
	} else {
		t.owners8 = make([]uint8, numSlots)
	}
	// The slots after the last point wrap around to point 0, whose successor
	// is the first other member after it, or itself alone.
	own := owner(pts[0])
	next := own
	for _, k := range pts[1:] {
		if owner(k) != own {
			next = owner(k)
			break
		}
	}
	t.fillDown(slotOf(pts[len(pts)-1])+1, numSlots, own, next)
	// Point p is the first at or after the starts of the slots after point
	// p-1's, up to its own; its successor is the member of point p+1 (own)
	// if another, or else point p+1's successor (next).
	for p := len(pts) - 1; p >= 0; p-- {
		o := owner(pts[p])
		if o != own {
			next = own
		}
		own = o
		lo := uint64(0)
		if p > 0 {
			lo = slotOf(pts[p-1]) + 1
		}
		t.fillDown(lo, slotOf(pts[p])+1, own, next)
	}
	return t
}

// fillDown sets the owner and successor of slots lo to hi, excluded, in a
// table of bytes (owners in 4 or 8 bits, successors in 8) that is being
// filled from its end down. It sets the 32 slots below hi whatever the
// length of the run, and 8 at a time beyond: slots below lo may be set
// too, and the build sets them after. Runs of slots are about 30 long with
// 10 members, so that most take no loop and no branch on their length,
// which the CPU would mispredict at every run and which costs more than
// the stores. Slot hi, set before, is kept, including the other half of
// its byte with owners in 4 bits.
func (t *slotTable) fillDown(lo, hi uint64, owner, succ uint16) {
	if lo < 32 { // the first slots of the ring, below which nothing is
		t.fill(lo, hi, owner, succ)
		return
	}
	o, n := uint8(owner), uint8(succ)
	ns, s := uint64(n)*ones, t.succ.b
	if t.owners4 != nil {
		// With hi odd, slot hi-1 is the low half of a byte whose high half
		// is slot hi: set it alone, and go on from hi-1. Without a branch,
		// which half the time would be mispredicted: with hi even, the
		// mask keeps the byte as it is (and the last byte, at the end of
		// the ring), and slot hi-1 is set again below.
		odd := uint8(hi % 2)
		b := &t.owners4[min(hi/2, numSlots/2-1)]
		*b = *b&^(15*odd) | o*odd
		s[hi-1] = n
		hi -= hi % 2
		os, w := uint64(o)*0x11*ones, t.owners4
		put64x4(s[hi-32:hi], ns)
		binary.LittleEndian.PutUint64(w[hi/2-16:], os)
		binary.LittleEndian.PutUint64(w[hi/2-8:], os)
		for hi -= 32; hi > lo; hi -= 8 {
			binary.LittleEndian.PutUint64(s[hi-8:], ns)
			binary.LittleEndian.PutUint32(w[hi/2-4:], uint32(os))
		}
		return
	}
	os, w := uint64(o)*ones, t.owners8
	put64x4(s[hi-32:hi], ns)
	put64x4(w[hi-32:hi], os)
	for hi -= 32; hi > lo; hi -= 8 {
		binary.LittleEndian.PutUint64(s[hi-8:], ns)
		binary.LittleEndian.PutUint64(w[hi-8:], os)
	}
}

// put64x4 sets the 32 bytes of b to the 8 of v.
func put64x4(b []byte, v uint64) {
	b = b[:32]
	binary.LittleEndian.PutUint64(b[0:], v)
	binary.LittleEndian.PutUint64(b[8:], v)
	binary.LittleEndian.PutUint64(b[16:], v)
	binary.LittleEndian.PutUint64(b[24:], v)
}

// sortKeys sorts pts, the points of a build. Points are uniform, so a radix
// sort on their top bits, about as many as there are points in bits, leaves
// only small groups with the same top bits to finish by insertion; a group
// large enough to cost that (a set of points that collide, which uniform
// points do not) is sorted apart.
func sortKeys(pts []uint64) {
	top := min(bits.Len(uint(len(pts)))+2, 2*sortDigit)
	if len(pts) < 1<<8 {
		slices.Sort(pts)
		return
	}
	// Least significant digit first, so that the second pass keeps the
	// order of the first among equal digits; both counted in one read.
	lo, hi := top/2, top-top/2 // the digits' widths
	var at [2][1<<sortDigit + 1]int
	for _, k := range pts {
		at[0][k>>(64-top)&(1<<lo-1)+1]++
		at[1][k>>(64-hi)+1]++
	}
	tmp := make([]uint64, len(pts))
	for pass, shift := range [2]int{64 - top, 64 - hi} {
		c := &at[pass]
		for i := 1; i < len(c); i++ {
			c[i] += c[i-1]
		}
		mask := uint64(1)<<(64-shift) - 1
		if pass == 0 {
			mask = 1<<lo - 1
		}
		for _, k := range pts {
			d := k >> shift & mask
			tmp[c[d]] = k
			c[d]++
		}
		pts, tmp = tmp, pts
	}
	// Finish the points with the same top bits, by insertion: there are
	// about a quarter as many as points, each moving one place. A run of
	// points that collide, which uniform points do not make, would make it
	// quadratic: past a few moves a point, it sorts all.
	moves := 0
	for i := 1; i < len(pts); i++ {
		k, j := pts[i], i
		for ; j > 0 && k < pts[j-1]; j-- {
			pts[j] = pts[j-1]
		}
		pts[j] = k
		if moves += i - j; moves > 4*len(pts) {
			slices.Sort(pts)
			return
		}
	}
}

// sortDigit is the most bits a pass of sortKeys sorts on: a count array of
// 8 KB, which stays in the L1 cache.
const sortDigit = 10

// fillBytes sets the bytes of s to v, 8 at a time, for the runs of slots of
// a few members; a last store overlapping the one before ends it, rather
// than a byte at a time.
func fillBytes(s []byte, v byte) {
	if len(s) < 8 {
		fill(s, v)
		return
	}
	w := uint64(v) * ones
	for i := 0; i+8 < len(s); i += 8 {
		binary.LittleEndian.PutUint64(s[i:], w)
	}
	binary.LittleEndian.PutUint64(s[len(s)-8:], w)
}
