// Package ring is the consistent-hash ring of the library: pure values, no
// I/O and no locks. A Ring maps a key's 64-bit hash to the index of a
// member, given the members as the caller describes them: ids (the
// library's own ring, the slot table), names and weights (Ketama), or
// positions (Ch3). The root package keeps what users see (the Hashing
// type, DefaultPointsPerServer, ServerList) and maps the indexes to its
// members and their addresses.
//
// A Ring is immutable and safe for concurrent reads; With builds the next
// one from it when a few members change.
package ring

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Ring is an immutable consistent-hash ring. The library's own (see New) is
// a pure function of its member ids and the points per member; a Ketama or
// Ch3 ring (see NewKetama, NewCh3) is the other clients' structure over the
// names or positions it was given. Its lookups return member indexes: the
// positions of the ids (or names, or positions) it was built from.
//
// Each member has points on a ring of 64-bit values, drawn from its id's
// xxhash (see point). The ring is read at a
// fixed set of slots: slot s starts at s<<(64-slotBits), and the slot's
// owner is the member of the first point at or after its start; a key
// belongs to the owner of its hash's slot. Every slot follows the ring, so
// the ring's properties hold exactly: removing a member moves only the
// slots it owned, adding one moves slots only to it, and no slot moves
// between members that stay. The table keeps, per slot, its owner and the
// next distinct member along the ring (its successor), which is where the
// slot goes if its owner is removed; so a lookup is one hash and one read of
// a table of half a megabyte to 2 MB, whatever the number of members (see
// slotTable).
//
// Points are compared by their top 50 bits, ties broken by member id: the
// order is total, and the mapping does not depend on input order or history.
type Ring struct {
	ids    []string // sorted, no duplicates: what the points are drawn from; nil on an alt ring
	n      int      // members
	table  slotTable
	points int      // per member
	alt    *altRing // for Ketama and Ch3, in place of table (see modes.go)
}

const (
	// SlotBits is the bits of a hash that name its slot: 2^20 slots.
	SlotBits = 20
	// MaxPoints is the most points per member.
	MaxPoints = 100000
	// MaxMembers is the most members a ring takes: indexes fit ownerBits,
	// and the busiest has 1.4x the mean.
	MaxMembers = 10000
	// MaxRingPoints is the most points in all, which bounds a rebuild's
	// time.
	MaxRingPoints = 1 << 25

	slotBits      = SlotBits
	ownerBits     = 14 // a point's low bits, which hold its member's index while building
	maxMembers    = MaxMembers
	maxRingPoints = MaxRingPoints
	noPoint       = ^uint64(0)
	golden        = 0x9e3779b97f4a7c15
	buildChunk    = 1 << 22 // the most points bucketed at once: 32 MB, 1398 members at the default points
)

// MaxMembersFor returns the most members a ring of the given points per
// member takes.
func MaxMembersFor(points int) int { return min(maxMembers, maxRingPoints/max(points, 1)) }

// point returns point i of a member whose id hashes to seed: a bijective
// mix (splitmix64's) of seed plus i times the golden ratio, which spreads a
// member's points as evenly as hashing "id-i" would, at a tenth of the cost.
func point(seed uint64, i int) uint64 {
	z := seed + uint64(i)*golden
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// New builds the library's own ring over the member ids with the given
// points per member; member i is ids[i]. ids must be sorted without
// duplicates, and at most MaxMembersFor(points). It returns nil for no ids,
// which the ServerList reports as ErrNoServers. The ring keeps ids.
//
// Up to sortedBuildMax points (byteBuildMax with up to byteTableMembers
// members), it sorts them and walks them with the slots; beyond, it buckets
// them by slot and reduces each bucket to a build state per slot (see
// bucketTable). Both give the same table.
func New(ids []string, points int) *Ring {
	if len(ids) == 0 {
		return nil
	}
	points = max(points, 1)
	r := &Ring{ids: ids, n: len(ids), points: points}
	if n := len(ids) * points; n <= sortedBuildMax || len(ids) <= byteTableMembers && n <= byteBuildMax {
		r.table = sortedTable(ids, points)
	} else {
		r.table = bucketTable(ids, points, buildChunk)
	}
	return r
}

// pointKey returns point i of member m, whose id hashes to seed, as the
// build compares points: its top 64-ownerBits bits, then m.
func pointKey(seed uint64, i, m int) uint64 {
	return point(seed, i)&^(1<<ownerBits-1) | uint64(m)
}

const (
	bucketBits  = 10 // a build's buckets of slots: 2^10
	numBuckets  = 1 << bucketBits
	bucketSlots = numSlots / numBuckets // 2^10, whose build states take 16 KB, which stay in the L1 cache
)

// bucketTable returns the table of ms from all their points, bucketed by
// slot (see bucket). The points of a bucket are reduced to a build state
// for each of its slots, 16 KB that stay in the L1 cache, from which its
// slots of the table are filled at once (see fillTable): a point costs a
// write to the end of its bucket, a read in order and an update in the L1
// cache, and no array of every slot's build state (16 MB) is cleared,
// updated outside the L1 cache and read again. Beyond chunk points, the
// points are bucketed half as many at a time (so that they and that array
// take no more memory than one chunk), and all but the last chunk's go to
// such an array, b, which each bucket's states start from.
func bucketTable(ms []string, points, chunk int) slotTable {
	if len(ms)*points > chunk {
		chunk /= 2
	}
	chunk = max(1, chunk/points) // in members
	pts := make([]uint64, min(len(ms), chunk)*points)
	var b []slotBuild
	if len(ms) > chunk {
		b = make([]slotBuild, numSlots)
	}
	var at *[numBuckets + 1]int
	for lo := 0; ; lo += chunk {
		hi := min(lo+chunk, len(ms))
		at = bucket(pts, ms[lo:hi], lo, points)
		if hi == len(ms) {
			break
		}
		for _, k := range pts[:at[numBuckets]] { // a bucket at a time: its 16 KB of b stay in cache
			b[slotOf(k)].add(k)
		}
	}
	var states [bucketSlots]slotBuild
	state := func(i int) []slotBuild { // the build states of bucket i's slots
		if b != nil {
			copy(states[:], b[i*bucketSlots:])
		} else {
			clear(states[:])
		}
		for _, k := range pts[at[i]:at[i+1]] {
			states[slotOf(k)%bucketSlots].add(k)
		}
		return states[:]
	}
	return fillTable(state, len(ms))
}

// bucket writes to pts the points of ms, whose indexes start at first (see
// pointKey), bucketed by their top bucketBits bits, and returns where each
// bucket starts: bucket i is pts[at[i]:at[i+1]]. It draws the points twice,
// to count them and then to place them, rather than keeping them in a
// second array as large as pts to place them from.
func bucket(pts []uint64, ms []string, first, points int) (at *[numBuckets + 1]int) {
	at = new([numBuckets + 1]int)
	for m := range ms {
		seed := xxhash.Sum64String(ms[m])
		for i := range points {
			at[point(seed, i)>>(64-bucketBits)+1]++
		}
	}
	for i := 1; i < len(at); i++ {
		at[i] += at[i-1]
	}
	next := *at
	for m := range ms {
		seed := xxhash.Sum64String(ms[m])
		for i := range points {
			k := pointKey(seed, i, first+m)
			pts[next[k>>(64-bucketBits)]] = k
			next[k>>(64-bucketBits)]++
		}
	}
	return at
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
// slot, state(i) being those of bucket i. A slot's owner is the member of
// the first point at or after its start, and its successor the first
// member after that one along the ring: both are those of the first slot,
// at or after it, that holds a point. So one pass from the end carries
// (owner, successor) back from each slot with a point to the slots before
// it, starting from those of the first slot with a point, which the last
// slots wrap around to.
func fillTable(state func(int) []slotBuild, n int) slotTable {
	owners, succs := make([]uint16, numSlots), make([]uint16, numSlots)
	own, next := wrapAround(state)
	for i := numBuckets - 1; i >= 0; i-- {
		b, lo := state(i), i*bucketSlots
		for s := len(b) - 1; s >= 0; s-- {
			own, next = carry(b[s], own, next)
			owners[lo+s], succs[lo+s] = own, next
		}
	}
	return newSlotTable(owners, succs, n)
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

// wrapAround returns the owner and successor of the first slot with a
// point, which the slots after the last point wrap around to: carry's
// recursion read forward from it, up to the first member other than its
// owner (most often in bucket 0). With one member, both are it.
func wrapAround(state func(int) []slotBuild) (own, next uint16) {
	found := false
	for i := range numBuckets {
		for _, b := range state(i) {
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

// slotTable holds each slot's owner, where PickServer reads it, in half a
// byte with up to 16 members, one byte up to 256 and two beyond; and, apart,
// each slot's successor, read only to fail over, packed in 8, 12 or 16 bits.
// It takes 1.5 MB with up to 16 members, 2 MB up to 256, 3.5 MB up to 4096
// and 4 MB beyond. The owner table is what a lookup waits for, from beyond
// the CPU's L2 cache at 1 MB and more: the smaller, the faster.
type slotTable struct {
	owners4  []uint8  // with up to 16 members: two slots a byte, the even one low
	owners8  []uint8  // with up to 256 members
	owners16 []uint16 // with more
	succ     packed
}

// newSlotTable encodes the owners and successors of the slots of a ring of
// n members. It keeps owners itself as owners16.
func newSlotTable(owners, succs []uint16, n int) slotTable {
	var t slotTable
	switch {
	case n <= 1<<4:
		t.owners4 = make([]uint8, len(owners)/2)
		for i := range t.owners4 {
			t.owners4[i] = uint8(owners[2*i]) | uint8(owners[2*i+1])<<4
		}
	case n <= 1<<8:
		t.owners8 = make([]uint8, len(owners))
		for i, o := range owners {
			t.owners8[i] = uint8(o)
		}
	default:
		t.owners16 = owners
	}
	t.succ = newPacked(succs, succBits(n))
	return t
}

// Bytes is about the memory r takes: its slot table, or its Ketama
// continuum or Ch3 positions.
func (r *Ring) Bytes() int {
	n := 0
	if a := r.alt; a != nil {
		if a.cont != nil {
			n += 4 * (len(a.cont.value) + len(a.cont.member) + len(a.cont.bucket))
		}
		if a.ch3 != nil {
			n += 4 * len(a.ch3.at)
		}
		return n
	}
	t := &r.table
	return n + len(t.owners4) + len(t.owners8) + 2*len(t.owners16) + len(t.succ.b)
}

// succBits returns the bits a successor takes in a table of n members.
func succBits(n int) int { return max(8, (bits.Len(uint(n-1))+3)/4*4) }

// owner returns the owner of slot s.
func (t *slotTable) owner(s uint64) uint32 {
	switch {
	case t.owners4 != nil:
		return uint32(t.owners4[s/2] >> (s % 2 * 4) & 15)
	case t.owners8 != nil:
		return uint32(t.owners8[s])
	}
	return uint32(t.owners16[s])
}

// get returns the owner and successor of slot s.
func (t *slotTable) get(s uint64) (owner, succ uint32) { return t.owner(s), t.succ.get(s) }

// packed is an array of unsigned integers of bits bits each: 8, 12 or 16.
// Element i is in the 16 bits at bit i*bits, so it ends with a byte of
// padding.
type packed struct {
	b    []byte
	bits uint64
}

// newPacked returns vs packed in bits bits each (8, 12 or 16; len(vs) even).
func newPacked(vs []uint16, bits int) packed {
	p := packed{b: make([]byte, len(vs)*bits/8+1), bits: uint64(bits)}
	switch bits {
	case 8:
		for i, v := range vs {
			p.b[i] = byte(v)
		}
	case 12: // two values in three bytes
		for i := 0; i+1 < len(vs); i += 2 {
			e, f := vs[i], vs[i+1]
			p.b[3*i/2], p.b[3*i/2+1], p.b[3*i/2+2] = byte(e), byte(e>>8)|byte(f<<4), byte(f>>4)
		}
	default:
		for i, v := range vs {
			binary.LittleEndian.PutUint16(p.b[2*i:], v)
		}
	}
	return p
}

func (p packed) get(i uint64) uint32 {
	at := i * p.bits
	return uint32(binary.LittleEndian.Uint16(p.b[at/8:]) >> (at % 8) & (1<<p.bits - 1))
}
