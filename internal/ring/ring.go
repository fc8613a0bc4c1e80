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
	buildChunk    = 1 << 22 // the most points bucketed at once: about 35 MB, 1398 members at the default points
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
	t := makeSlotTable(n, owners)
	t.put(0, owners, succs)
	return t
}

// makeSlotTable returns the table of a ring of n members, to be filled by
// put. With more than 256 members, its owners16 is owners16 if not nil.
func makeSlotTable(n int, owners16 []uint16) slotTable {
	t := slotTable{succ: packed{b: make([]byte, numSlots*succBits(n)/8+1), bits: uint64(succBits(n))}}
	switch {
	case n <= 1<<4:
		t.owners4 = make([]uint8, numSlots/2)
	case n <= 1<<8:
		t.owners8 = make([]uint8, numSlots)
	case owners16 != nil:
		t.owners16 = owners16
	default:
		t.owners16 = make([]uint16, numSlots)
	}
	return t
}

// put encodes the owners and successors of slots lo (even) on: the
// bucketed build writes a bucket at a time, and buckets apart at once.
func (t *slotTable) put(lo int, owners, succs []uint16) {
	switch {
	case t.owners4 != nil:
		w := t.owners4[lo/2:][:len(owners)/2]
		for i := range w {
			w[i] = uint8(owners[2*i]) | uint8(owners[2*i+1])<<4
		}
	case t.owners8 != nil:
		w := t.owners8[lo:][:len(owners)]
		for i, o := range owners {
			w[i] = uint8(o)
		}
	case &t.owners16[lo] != &owners[0]: // not in place already (see newSlotTable)
		copy(t.owners16[lo:], owners)
	}
	t.succ.put(lo, succs)
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

// ownerWidth returns the bits an owner takes in a table of n members (see
// slotTable).
func ownerWidth(n int) int {
	switch {
	case n <= 1<<4:
		return 4
	case n <= 1<<8:
		return 8
	}
	return 16
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

// put packs vs into elements lo (even) on, two of 12 bits in three bytes.
func (p packed) put(lo int, vs []uint16) {
	switch p.bits {
	case 8:
		b := p.b[lo:][:len(vs)]
		for i, v := range vs {
			b[i] = byte(v)
		}
	case 12:
		b := p.b[lo*3/2:][:len(vs)*3/2]
		for i := 0; i+1 < len(vs); i += 2 {
			e, f := vs[i], vs[i+1]
			b[3*i/2], b[3*i/2+1], b[3*i/2+2] = byte(e), byte(e>>8)|byte(f<<4), byte(f>>4)
		}
	default:
		b := p.b[2*lo:][:2*len(vs)]
		for i, v := range vs {
			binary.LittleEndian.PutUint16(b[2*i:], v)
		}
	}
}

func (p packed) get(i uint64) uint32 {
	at := i * p.bits
	return uint32(binary.LittleEndian.Uint16(p.b[at/8:]) >> (at % 8) & (1<<p.bits - 1))
}
