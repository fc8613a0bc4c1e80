package selector

import (
	"encoding/binary"
	"math/bits"
	"net"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// DefaultPointsPerServer is the number of points each member gets on the ring
// when WithPointsPerServer is not used. It is part of the key mapping: every
// process that shares a cache must use the same value.
//
// The busiest member's share of the key space exceeds the mean by about 3%
// at 10 members, 4% at 100 and 8-9% at 1000 (see BENCHMARKS.md); more points
// balance better, and rebuild and update more slowly (3000 rather than 2500
// brought 1000 members under 1.10).
const DefaultPointsPerServer = 3000

// ring is an immutable consistent-hash ring: a pure function of its member
// ids and the points per member.
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
type ring struct {
	members []member      // sorted by id, no duplicate ids
	addrs   []*staticAddr // the members' addresses, by member index: what PickServer reads, 8 bytes a member
	servers []net.Addr    // the members' distinct addresses, sorted
	table   slotTable
	points  int      // per member
	alt     *altRing // for Ketama and Ch3, in place of table (see ring_modes.go)
}

const (
	slotBits      = 20      // 2^20 slots
	ownerBits     = 14      // a point's low bits, which hold its member's index while building
	maxPoints     = 100000  // per member
	maxMembers    = 10000   // per ring: indexes fit ownerBits, and the busiest has 1.4x the mean
	maxRingPoints = 1 << 25 // in all, which bounds a rebuild's time
	noPoint       = ^uint64(0)
	golden        = 0x9e3779b97f4a7c15
	buildChunk    = 1 << 20 // points bucketed at a time
)

// maxMembersFor returns the most members a ring of the given points per
// member takes.
func maxMembersFor(points int) int { return min(maxMembers, maxRingPoints/max(points, 1)) }

// point returns point i of a member whose id hashes to seed: a bijective
// mix (splitmix64's) of seed plus i times the golden ratio, which spreads a
// member's points as evenly as hashing "id-i" would, at a tenth of the cost.
func point(seed uint64, i int) uint64 {
	z := seed + uint64(i)*golden
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// newRing builds a ring over ms with the given points per member. ms must be
// sorted by id without duplicate ids (see canonical), and at most
// maxMembersFor(points). It returns nil for an empty member set, which
// PickServer reports as ErrNoServers.
//
// Up to sortedBuildMax points (byteBuildMax with up to byteTableMembers
// members), it sorts them and walks them with the slots; beyond, it buckets
// them into a build state per slot (see addPoints), which costs 16 MB and
// 10 ms whatever the number of points. Both give the same table.
func newRing(ms []member, points int) *ring {
	if len(ms) == 0 {
		return nil
	}
	points = max(points, 1)
	r := &ring{points: points}
	r.setMembers(ms)
	if n := len(ms) * points; n <= sortedBuildMax || len(ms) <= byteTableMembers && n <= byteBuildMax {
		r.table = sortedTable(ms, points)
	} else {
		b := make([]slotBuild, 1<<slotBits)
		addPoints(b, ms, points)
		r.table = fillTable(b, len(ms))
	}
	return r
}

// sortedBuildMax is the most points newRing sorts beyond byteTableMembers.
const sortedBuildMax = 1 << 17

// pointKey returns point i of member m, whose id hashes to seed, as the
// build compares points: its top 64-ownerBits bits, then m.
func pointKey(seed uint64, i, m int) uint64 {
	return point(seed, i)&^(1<<ownerBits-1) | uint64(m)
}

// sortedTable returns the table of ms from all their points, sorted. A
// slot's owner is the member of the first point at or after its start; its
// successor, the member of the first point after that one of another member
// (next, computed from the end, twice for the wrap around).
func sortedTable(ms []member, points int) slotTable {
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

// addPoints adds to b the points of the members ms.
//
// A point is built as its top 64-ownerBits bits with its member's index in
// the rest, so that comparing two is comparing their points, ties broken by
// member. The points are bucketed by their top 8 bits, a chunk of up to 2^20
// (8 MB) at a time, so that each bucket's updates fall in 1/256 of the
// slots, which stay in cache.
func addPoints(b []slotBuild, ms []member, points int) {
	chunk := make([]uint64, 0, min(buildChunk, len(ms)*points))
	bucketed := make([]uint64, cap(chunk))
	apply := func() {
		var next [257]int
		for _, k := range chunk {
			next[k>>56+1]++
		}
		for i := 1; i < len(next); i++ {
			next[i] += next[i-1]
		}
		for _, k := range chunk {
			bucketed[next[k>>56]] = k
			next[k>>56]++
		}
		for _, k := range bucketed[:len(chunk)] {
			b[k>>(64-slotBits)].add(k)
		}
		chunk = chunk[:0]
	}
	for m := range ms {
		seed := xxhash.Sum64String(ms[m].id)
		for i := range points {
			if len(chunk) == cap(chunk) {
				apply()
			}
			chunk = append(chunk, pointKey(seed, i, m))
		}
	}
	apply()
}

// slotBuild is what the build knows of one slot: its first point, and its
// first point of a member other than the first's. It holds their
// complements, so that its zero value is empty (the complement of
// noPoint) and a new build state needs no initialization.
type slotBuild struct{ notFirst, notOther uint64 }

func owner(k uint64) uint16 { return uint16(k & (1<<ownerBits - 1)) }

func (s slotBuild) first() uint64 { return ^s.notFirst }
func (s slotBuild) other() uint64 { return ^s.notOther }

// add adds point k to the slot.
func (s *slotBuild) add(k uint64) {
	switch first := s.first(); {
	case k < first:
		if owner(k) != owner(first) { // the old first point is now the first of another member
			s.notOther = s.notFirst
		}
		s.notFirst = ^k
	case k < s.other() && owner(k) != owner(first):
		s.notOther = ^k
	}
}

// fillTable returns the table of n members from the build state of every
// slot. A slot's owner is the member of the first point at or after its
// start, and its successor the first member after that one along the ring:
// both are those of the first slot, at or after it, that holds a point. So
// one pass from the end carries (owner, successor) back from each slot with
// a point to the slots before it, starting from those of the first slot with
// a point, which the last slots wrap around to.
func fillTable(b []slotBuild, n int) slotTable {
	owners, succs := make([]uint16, len(b)), make([]uint16, len(b))
	own, next := wrapAround(b)
	for s := len(b) - 1; s >= 0; s-- {
		if own, next = carry(b[s], own, next); n == 1 {
			next = own
		}
		owners[s], succs[s] = own, next
	}
	return newSlotTable(owners, succs, n)
}

// carry returns the owner and successor of slot s with build state b, given
// those of the slots after it: its own first member, and its own second
// member, or else the owner after it if that is another member, or else the
// successor after it.
func carry(b slotBuild, own, next uint16) (uint16, uint16) {
	if b.notFirst == 0 {
		return own, next
	}
	o := owner(b.first())
	switch {
	case b.notOther != 0:
		next = owner(b.other())
	case own != o:
		next = own
	}
	return o, next
}

// wrapAround returns the owner and successor of the first slot with a
// point, which the slots after the last point wrap around to: carry's
// recursion read forward from it, up to the first member other than its
// owner.
func wrapAround(b []slotBuild) (own, next uint16) {
	s := 0
	for b[s].notFirst == 0 {
		s++
	}
	own = owner(b[s].first())
	for ; s < len(b); s++ {
		switch {
		case b[s].notFirst == 0:
		case owner(b[s].first()) != own:
			return own, owner(b[s].first())
		case b[s].notOther != 0:
			return own, owner(b[s].other())
		}
	}
	return own, own // one member
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

// bytes is about the memory r takes: its slot table, or its Ketama
// continuum or Ch3 positions.
func (r *ring) bytes() int {
	n := 8 * len(r.members)
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

func slotOf(h uint64) uint64 { return h >> (64 - slotBits) }

// pick returns the member that owns hash h.
func (r *ring) pick(h uint64) *member {
	return &r.members[r.owner(h)]
}

// owners returns the member that owns hash h and its successor, the member
// that would own h if the owner left; with one member, both are it.
func (r *ring) owners(h uint64) (owner, succ *member) {
	if r.alt != nil {
		var buf [2]uint32
		c := r.altCandidates(h, 2, buf[:0])
		return &r.members[c[0]], &r.members[c[len(c)-1]]
	}
	o, s := r.table.get(slotOf(h))
	return &r.members[o], &r.members[s]
}

// candidates appends to dst the indexes of up to n distinct members for
// hash h, in the order a key of h would fail over: its owner, its successor
// (exactly the owner if the owner left), then the owners and successors of
// the slots after h's, which follow the ring's order more loosely. It
// allocates nothing when dst has room.
func (r *ring) candidates(h uint64, n int, dst []uint32) []uint32 {
	if r.alt != nil {
		return r.altCandidates(h, n, dst)
	}
	n = min(n, len(r.members))
	start := len(dst)
	add := func(m uint32) {
		if len(dst)-start < n && !slices.Contains(dst[start:], m) {
			dst = append(dst, m)
		}
	}
	for s := slotOf(h); len(dst)-start < n; s = (s + 1) % (1 << slotBits) {
		o, next := r.table.get(s)
		add(o)
		add(next)
	}
	return dst
}

// sameIDs reports whether r has exactly the member ids of ms, in which case
// r's table can be reused and only the addresses need rebinding.
func (r *ring) sameIDs(ms []member) bool {
	return r != nil && slices.EqualFunc(r.members, ms, func(a, b member) bool { return a.id == b.id })
}

// withMembers returns a ring with r's table and the members ms, which must
// have the same ids as r's members (sameIDs). It is how a pod that keeps its
// identity but gets a new IP is rebound without rehashing.
func (r *ring) withMembers(ms []member) *ring {
	c := *r
	c.setMembers(ms)
	return &c
}
