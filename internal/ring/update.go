package ring

import (
	"encoding/binary"
	"math/bits"
	"runtime"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Building a ring from the previous one when a few members change: most
// slots keep their owner and successor, so the new table is the old one
// with its member indexes renumbered, and only the slots the change can
// reach recomputed from their points. A member's points are regenerated
// from its id rather than kept, which would take 20 MB at 1000 members.

const (
	numSlots = 1 << slotBits
	// maxUpdateSlots is the most slots an update recomputes, else New
	// builds the ring: the walk and the refill cost per slot, and with few
	// members a change reaches most slots (a replace reaches a third of
	// them at 10 members, and most at 2 or 3).
	maxUpdateSlots = numSlots / 2
	// updateMinMembers is the fewest members With tries to update: below, a
	// fresh build of their table of bytes (see bytesTable) costs less than
	// an update, which regenerates every point as a build does, copies the
	// table and recomputes a large share of it, or gives up after the
	// first steps. Measured at 3000 points, one member replaced, 2 cores:
	// 2.3 ms built against 2.7 updated at 48 members, even at 64 (2.9),
	// 3.3 against 2.9 at 80.
	updateMinMembers = 64
)

// With returns New(ids, points), built from r (which may be nil) when it
// can and that costs less: when ids has updateMinMembers members or more,
// both rings have the same points per member and table widths, and the
// change reaches few enough slots. ids must be sorted without duplicates.
// With the same ids as r's, it shares r's table (see Shares).
//
// The slots that may change are those holding points of added or removed
// members (dirty), and those before them that carry their owner or
// successor from them (see fillTable), found on the old table (see spread).
// Every member's points are regenerated (on up to maxWorkers goroutines,
// each a share of the members), but only those in these slots are kept;
// each run of these slots is then refilled from its points and from the
// slot after it, which has not changed (see refill).
func (r *Ring) With(ids []string, points int) *Ring {
	if len(ids) < updateMinMembers {
		return New(ids, points)
	}
	if u := r.update(ids, max(points, 1)); u != nil {
		return u
	}
	return New(ids, points)
}

// update is With's incremental build, or nil where With builds anew.
func (r *Ring) update(ms []string, points int) *Ring {
	if r == nil || r.alt != nil || len(ms) < 2 || r.n < 2 || r.points != points ||
		ownerWidth(len(ms)) != ownerWidth(r.n) || succBits(len(ms)) != succBits(r.n) {
		return nil
	}
	remap, moved, changed := diffMembers(r.ids, ms)
	if len(changed) == 0 {
		c := *r // the same table, read by the same indexes
		c.ids = ms
		return &c
	}
	if len(changed)*points > maxUpdateSlots {
		return nil
	}
	dirty := slotSet(new([numSlots / 64]uint64))
	for _, m := range changed {
		seed := xxhash.Sum64String(m)
		for i := range points {
			s := slotOf(point(seed, i))
			dirty[s/64] |= 1 << (s % 64)
		}
	}
	set, ok := r.table.spread(dirty)
	if !ok {
		return nil
	}
	// A first test on groups of 16 slots, in 8 KB that stay in the L1
	// cache, before the 128 KB of set: at 1000 members it passes about a
	// tenth of the points.
	var groups [numSlots / 16 / 64]uint64
	for i, w := range set {
		for ; w != 0; w &= w - 1 {
			g := uint64(i)*4 + uint64(bits.TrailingZeros64(w))/16
			groups[g/64] |= 1 << (g % 64)
		}
	}
	// The points in set, kept[g] those goroutine g drew, from a share of the
	// members: refill reduces a slot's points in any order.
	w := min(runtime.GOMAXPROCS(0), maxWorkers)
	kept := make([][]uint64, w)
	parallel(w, func(g int) {
		var k []uint64
		for m := len(ms) * g / w; m < len(ms)*(g+1)/w; m++ {
			seed := xxhash.Sum64String(ms[m])
			for i := range points {
				s := slotOf(point(seed, i))
				if groups[s/16/64]>>(s/16%64)&1 != 0 && has(set, s) {
					k = append(k, pointKey(seed, i, m))
				}
			}
		}
		kept[g] = k
	})
	var t slotTable
	if moved {
		t = r.table.remapped(remap)
	} else {
		t = r.table.clone()
	}
	t.refill(set, bySlot(slices.Concat(kept...)))
	return &Ring{ids: ms, n: len(ms), table: t, points: points}
}

// diffMembers returns, for each of the sorted member ids old, its index in
// the sorted ids ms (0 if it is not there: no slot the update keeps names
// it), whether any index moved, and the ids in one and not the other.
func diffMembers(old, ms []string) (remap []uint16, moved bool, changed []string) {
	remap = make([]uint16, len(old))
	i, j := 0, 0
	for i < len(old) || j < len(ms) {
		switch {
		case j == len(ms) || i < len(old) && old[i] < ms[j]:
			changed = append(changed, old[i])
			i++
		case i == len(old) || ms[j] < old[i]:
			changed = append(changed, ms[j])
			j++
		default:
			remap[i], moved = uint16(j), moved || i != j
			i, j = i+1, j+1
		}
	}
	return remap, moved, changed
}

// slotSet is a set of slots, a bit each. It is an array so that testing a
// slot of a hash needs no bounds check.
type slotSet *[numSlots / 64]uint64

func has(s slotSet, slot uint64) bool { return s[slot/64]>>(slot%64)&1 != 0 }

// addRange adds slots lo to hi, excluded, to s, and returns how many it
// did not have.
func addRange(s slotSet, lo, hi uint64) int {
	added := 0
	for lo < hi {
		n := min(hi-lo, 64-lo%64)
		mask := (^uint64(0) >> (64 - n)) << (lo % 64)
		added += bits.OnesCount64(mask &^ s[lo/64])
		s[lo/64] |= mask
		lo += n
	}
	return added
}

// next returns the first slot at or after from that is in s if in, or else
// not, or numSlots if there is none.
func next(s slotSet, from uint64, in bool) uint64 {
	for i := from / 64; i < uint64(len(s)); i++ {
		w := s[i]
		if !in {
			w = ^w
		}
		if i == from/64 {
			w &= ^uint64(0) << (from % 64)
		}
		if w != 0 {
			return i*64 + uint64(bits.TrailingZeros64(w))
		}
	}
	return numSlots
}

// spread returns the dirty slots and those whose owner or successor may
// carry a change from them, or false if they are more than maxUpdateSlots.
// Slots not in the set keep their owner and successor.
//
// It follows each dirty slot back (see follows) while a change may carry,
// and stops at a slot the set already has with as much: from there, that
// slot's own walk goes on.
func (t *slotTable) spread(dirty slotSet) (slotSet, bool) {
	set, owned := new([numSlots / 64]uint64), new([numSlots / 64]uint64) // owned: the slots whose owner may change
	*set, *owned = *dirty, *dirty
	n := 0
	for _, w := range dirty {
		n += bits.OnesCount64(w)
	}
	for i, w := range dirty {
		for ; w != 0 && n <= maxUpdateSlots; w &= w - 1 {
			own := true // whether the owner of the slot after s may change
			for s := prevSlot(uint64(i*64 + bits.TrailingZeros64(w))); n <= maxUpdateSlots; {
				lo, o, changes := t.follows(s, own)
				if !changes || has(set, s) && (!o || has(owned, s)) {
					break
				}
				n += addRange(set, lo, s+1)
				if o {
					addRange(owned, lo, s+1)
				}
				own, s = has(owned, lo), prevSlot(lo)
			}
		}
	}
	return set, n <= maxUpdateSlots
}

func prevSlot(s uint64) uint64 { return (s + numSlots - 1) % numSlots }

// follows reports whether the owner and the successor of slot s, which
// holds no point of a member added or removed, may change when the
// successor of the slot after it does, and its owner too if own; and the
// lowest slot lo of those up to s that, having the same owner and
// successor, change alike.
//
// It knows only owners and successors, which tell the slot's points apart
// this far: a slot whose owner is not the next slot's holds a point of its
// owner, and its successor is the next slot's owner unless it holds a point
// of another member too; and a slot with the next one's owner but another
// successor holds points of both. Else it may hold no point, passing the
// change on, or points of the next slot's owner alone, which keep its
// owner.
func (t *slotTable) follows(s uint64, own bool) (lo uint64, owner, changes bool) {
	o, n := t.get(s)
	o1, n1 := t.get((s + 1) % numSlots)
	switch {
	case o != o1:
		return s, false, own && n == o1
	case n != n1:
		return s, false, false
	}
	return t.stretch(s, o, n), own, true
}

// stretch returns the lowest slot lo such that slots lo to s have owner o
// and successor n, as slot s has. With successors in a byte, where the
// stretches are long, it compares 8 slots at a time.
func (t *slotTable) stretch(s uint64, o, n uint32) uint64 {
	lo := s
	for lo > 0 {
		if lo >= 8 && lo%2 == 0 && t.succ.bits == 8 {
			if d := t.differs8(lo-8, o, n); d >= 0 {
				return lo - 8 + uint64(d) + 1
			}
			lo -= 8
			continue
		}
		if o1, n1 := t.get(lo - 1); o1 != o || n1 != n {
			break
		}
		lo--
	}
	return lo
}

const ones = 0x0101010101010101

// differs8 returns the highest of slots s to s+7 (s even) whose owner is
// not o or successor not n, as an offset from s, or -1 if there is none,
// in a table whose successors take a byte.
func (t *slotTable) differs8(s uint64, o, n uint32) int {
	d := bits.Len64(binary.LittleEndian.Uint64(t.succ.b[s:])^uint64(n)*ones) + 7 // a byte a slot
	if t.owners4 != nil {
		d = max(d, 2*(bits.Len32(binary.LittleEndian.Uint32(t.owners4[s/2:])^o*0x11111111)+3)) // half a byte
	} else {
		d = max(d, bits.Len64(binary.LittleEndian.Uint64(t.owners8[s:])^uint64(o)*ones)+7)
	}
	return d/8 - 1
}

// bySlot sorts pts by slot, in two passes of a radix sort on half the slot
// bits: refill wants the points of a slot together and the slots in order,
// not the points of a slot in order.
func bySlot(pts []uint64) []uint64 {
	const digit = slotBits / 2
	tmp := make([]uint64, len(pts))
	for _, shift := range [2]int{64 - slotBits, 64 - digit} {
		var at [1<<digit + 1]int
		for _, p := range pts {
			at[p>>shift&(1<<digit-1)+1]++
		}
		for i := 1; i < len(at); i++ {
			at[i] += at[i-1]
		}
		for _, p := range pts {
			d := p >> shift & (1<<digit - 1)
			tmp[at[d]] = p
			at[d]++
		}
		pts, tmp = tmp, pts
	}
	return pts
}

// refill recomputes the slots of set, in the table of the new members,
// from pts, their points, sorted. A run of slots in the set takes its
// owners and successors from its points and from the slot after it, as
// fillTable does from the end: that slot is not in the set, and so is
// right already, or it is slot 0, after a run that ends the ring, and the
// run from slot 0, if any, is refilled first.
func (t *slotTable) refill(set slotSet, pts []uint64) {
	for lo := next(set, 0, true); lo < numSlots; lo = next(set, lo, true) {
		hi := next(set, lo, false)
		n := 0 // pts[:n] are in the run
		for n < len(pts) && slotOf(pts[n]) < hi {
			n++
		}
		o, succ := t.get(hi % numSlots)
		own, next := uint16(o), uint16(succ)
		top := hi // the slots from one with a point to top hold none
		for end := n; end > 0; {
			s := slotOf(pts[end-1])
			var b slotBuild
			for ; end > 0 && slotOf(pts[end-1]) == s; end-- {
				b.add(pts[end-1])
			}
			t.fill(s+1, top, own, next)
			own, next = carry(b, own, next)
			t.set(s, own, next)
			top = s
		}
		t.fill(lo, top, own, next)
		pts, lo = pts[n:], hi
	}
}

// set sets the owner and successor of slot s.
func (t *slotTable) set(s uint64, owner, succ uint16) {
	t.fill(s, s+1, owner, succ)
}

// fill sets the owner and successor of slots lo to hi, excluded.
func (t *slotTable) fill(lo, hi uint64, owner, succ uint16) {
	if lo >= hi {
		return
	}
	switch {
	case t.owners4 != nil:
		if lo%2 == 1 { // the high half of a byte
			t.owners4[lo/2] = t.owners4[lo/2]&15 | uint8(owner)<<4
		}
		if hi%2 == 1 { // the low half
			t.owners4[hi/2] = t.owners4[hi/2]&^15 | uint8(owner)
		}
		fillBytes(t.owners4[(lo+1)/2:hi/2], uint8(owner)*17)
	case t.owners8 != nil:
		fillBytes(t.owners8[lo:hi], uint8(owner))
	default:
		fill(t.owners16[lo:hi], owner)
	}
	t.succ.fill(lo, hi, succ)
}

func (p packed) fill(lo, hi uint64, v uint16) {
	switch p.bits {
	case 8:
		fillBytes(p.b[lo:hi], uint8(v))
	case 16:
		for i := lo; i < hi; i++ {
			binary.LittleEndian.PutUint16(p.b[2*i:], v)
		}
	default:
		for i := lo; i < hi; i++ {
			at := i * p.bits
			mask := uint16(1<<p.bits-1) << (at % 8)
			w := binary.LittleEndian.Uint16(p.b[at/8:])
			binary.LittleEndian.PutUint16(p.b[at/8:], w&^mask|v<<(at%8)&mask)
		}
	}
}

// clone returns a copy of t.
func (t slotTable) clone() slotTable {
	return slotTable{slices.Clone(t.owners4), slices.Clone(t.owners8), slices.Clone(t.owners16),
		packed{b: slices.Clone(t.succ.b), bits: t.succ.bits}}
}

// remapped returns a copy of t with each member index i replaced by
// remap[i]: a byte at a time through a table with 4 and 8 bits, and four at
// a time in six bytes with 12, so that it costs little more than a copy.
func (t slotTable) remapped(remap []uint16) slotTable {
	var bytes [256]uint8
	for i := range min(256, len(remap)) {
		bytes[i] = uint8(remap[i])
	}
	c := slotTable{succ: packed{b: make([]byte, len(t.succ.b)), bits: t.succ.bits}}
	switch {
	case t.owners4 != nil:
		var pairs [256]uint8
		for i := range 256 {
			pairs[i] = bytes[i&15] | bytes[i>>4]<<4
		}
		c.owners4 = mapBytes(t.owners4, &pairs)
	case t.owners8 != nil:
		c.owners8 = mapBytes(t.owners8, &bytes)
	default:
		c.owners16 = make([]uint16, len(t.owners16))
		for i, o := range t.owners16 {
			c.owners16[i] = remap[o]
		}
	}
	src, dst := t.succ.b[:len(t.succ.b)-1], c.succ.b // the last byte is padding
	switch t.succ.bits {
	case 8:
		for i, v := range src {
			dst[i] = bytes[v]
		}
	case 12:
		i := 0
		for ; i+8 <= len(src); i += 6 {
			w := binary.LittleEndian.Uint64(src[i:])
			w = uint64(remap[w&0xfff]) | uint64(remap[w>>12&0xfff])<<12 |
				uint64(remap[w>>24&0xfff])<<24 | uint64(remap[w>>36&0xfff])<<36
			binary.LittleEndian.PutUint32(dst[i:], uint32(w))
			binary.LittleEndian.PutUint16(dst[i+4:], uint16(w>>32))
		}
		for ; i+2 < len(src); i += 3 {
			e := remap[uint16(src[i])|uint16(src[i+1]&15)<<8]
			f := remap[uint16(src[i+1]>>4)|uint16(src[i+2])<<4]
			dst[i], dst[i+1], dst[i+2] = byte(e), byte(e>>8)|byte(f<<4), byte(f>>4)
		}
	default:
		for i := 0; i+1 < len(src); i += 2 {
			binary.LittleEndian.PutUint16(dst[i:], remap[binary.LittleEndian.Uint16(src[i:])])
		}
	}
	return c
}

func mapBytes(src []uint8, m *[256]uint8) []uint8 {
	dst := make([]uint8, len(src))
	for i, v := range src {
		dst[i] = m[v]
	}
	return dst
}
