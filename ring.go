package selector

import (
	"math"
	"math/bits"
	"net"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// DefaultPointsPerServer is the number of points each member gets on the ring
// when WithPointsPerServer is not used. It is part of the key mapping: every
// process that shares a cache must use the same value.
//
// The busiest member's share of the key space exceeds the mean by about
// 1/sqrt(points) times a factor that grows slowly with the member count:
// with 1500 points, by 4% on average at 10 members and 7% at 100 (1000
// points give 5% and 8%). A ring of 1000 members keeps 26 MB: 12 bytes a
// point and an 8 MB table.
const DefaultPointsPerServer = 1500

// member is one server on the ring. id decides where its points go; addr is
// where its connections go. They differ for StatefulSet pods, whose id (the
// pod's hostname) outlives its IP.
type member struct {
	id   string
	addr *staticAddr
}

// staticAddr is a net.Addr whose String and Network are precomputed: gomemcache
// calls String on every operation to key its idle-connection pool.
type staticAddr struct {
	network, str string
}

func (a *staticAddr) Network() string { return a.network }
func (a *staticAddr) String() string  { return a.str }

func newStaticAddr(a net.Addr) *staticAddr {
	return &staticAddr{network: a.Network(), str: a.String()}
}

// ring is an immutable consistent-hash ring: a pure function of its member
// ids and the points per member. Every point is the xxhash of id+"-"+i;
// a key belongs to the first point at or after its own hash, wrapping
// around. Points are sorted by hash, ties broken by id, so the mapping does
// not depend on input order or history.
//
// A table splits the hash space into buckets: four per point, and at most
// maxTable (8 MB). Most buckets hold no point, and their entry is the owner
// of the whole bucket; the entry of any other bucket is where to start
// scanning the points (see bucketEntry). So most lookups read the table and
// the member, and few scan more than a few points. A ring is never modified
// after build and is safe for concurrent use.
type ring struct {
	members []member   // sorted by id, no duplicate ids
	servers []net.Addr // the members' distinct addresses, sorted
	hashes  []uint64   // point hashes, sorted
	owners  []uint32   // owners[i] indexes members for hashes[i]
	scan    []uint64   // hashes and a sentinel above every hash, to end scans
	table   []bucketEntry
	size    uint64 // len(table)
	points  int    // per member
}

const (
	tablePerPoint = 4          // buckets per point
	maxTable      = 1 << 21    // buckets at most: 8 MB
	sortGroupBits = 8          // the sort's first round makes 2^8 groups
	maxPoints     = 100000     // per member; with maxMembers, keeps point indexes below ownerFlag
	maxMembers    = 10000      // per ring, and maxRingPoints in all, so that a broken API
	maxRingPoints = 1 << 24    // server cannot exhaust memory: a ring keeps 12 bytes a point
	gone          = ^uint32(0) // in merge, the new index of a member that left
)

// maxMembersFor returns the most members a ring of the given points per
// member takes.
func maxMembersFor(points int) int { return min(maxMembers, maxRingPoints/max(points, 1)) }

// newRing builds a ring over ms with the given points per member. ms must be
// sorted by id without duplicate ids (see canonical). It returns nil for an
// empty member set, which PickServer reports as ErrNoServers.
func newRing(ms []member, points int) *ring {
	if len(ms) == 0 {
		return nil
	}
	points = max(points, 1)
	r := &ring{members: ms, servers: servers(ms), points: points}
	r.scan, r.owners = sortedPoints(ms, points)
	r.hashes = r.scan[:len(r.owners)]
	r.fillTable()
	return r
}

// rebuild returns the ring over ms (as newRing does) from r's points: the
// points of the members in both are kept, only those of new members are
// hashed and sorted, and the two runs are merged. A pod change at 1000
// members so takes half the time of a new ring. The result is the same ring
// as newRing's.
func (r *ring) rebuild(ms []member, points int) *ring {
	points = max(points, 1)
	if r == nil || r.points != points || len(ms) == 0 {
		return newRing(ms, points)
	}
	// to[i] is the new index of r's member i, or gone; added holds the new
	// members, at addedTo[j].
	to := make([]uint32, len(r.members))
	for i := range to {
		to[i] = gone
	}
	var added []member
	var addedTo []uint32
	for j, m := range ms {
		if i, ok := slices.BinarySearchFunc(r.members, m.id, func(a member, id string) int { return strings.Compare(a.id, id) }); ok {
			to[i] = uint32(j)
		} else {
			added, addedTo = append(added, m), append(addedTo, uint32(j))
		}
	}

	c := &ring{members: ms, servers: servers(ms), points: points}
	addHashes, addOwners := sortedPoints(added, points)
	c.scan, c.owners = merge(r.hashes, r.owners, to, addHashes[:len(addOwners)], addOwners, addedTo)
	c.hashes = c.scan[:len(c.owners)]
	c.fillTable()
	return c
}

// merge merges two sorted runs of points into one, renumbering their owners
// through aTo and bTo and dropping the points of a owner that aTo maps to
// gone. Ties are broken by the new owner index. Like sortedPoints, it
// returns the hashes with a sentinel and the owners.
func merge(aHashes []uint64, aOwners, aTo []uint32, bHashes []uint64, bOwners, bTo []uint32) ([]uint64, []uint32) {
	n := len(bOwners)
	for _, o := range aOwners {
		if aTo[o] != gone {
			n++
		}
	}
	hashes, owners := make([]uint64, n, n+1), make([]uint32, n)
	i, j := 0, 0
	for k := range n {
		for i < len(aOwners) && aTo[aOwners[i]] == gone {
			i++
		}
		takeA := j == len(bOwners)
		if i < len(aOwners) && j < len(bOwners) {
			ha, hb := aHashes[i], bHashes[j]
			takeA = ha < hb || ha == hb && aTo[aOwners[i]] < bTo[bOwners[j]]
		}
		if takeA {
			hashes[k], owners[k] = aHashes[i], aTo[aOwners[i]]
			i++
		} else {
			hashes[k], owners[k] = bHashes[j], bTo[bOwners[j]]
			j++
		}
	}
	return append(hashes, math.MaxUint64), owners
}

// bucketEntry is one bucket of the table: the owner of the whole bucket
// when no point falls in it, else the index of the first point in it, where
// the lookup's scan starts. The two share a uint32, told apart by ownerFlag.
type bucketEntry uint32

const ownerFlag bucketEntry = 1 << 31

func ownerEntry(member uint32) bucketEntry { return ownerFlag | bucketEntry(member) }
func scanEntry(point int) bucketEntry      { return bucketEntry(point) }

// owner returns the member an entry holds, if it holds one.
func (e bucketEntry) owner() (member uint32, ok bool) {
	return uint32(e &^ ownerFlag), e&ownerFlag != 0
}

// point returns the point an entry holds: valid only if owner is not.
func (e bucketEntry) point() int { return int(e) }

// tableSize returns the number of buckets for n points.
func tableSize(n int) int { return min(tablePerPoint*n, maxTable) }

// fillTable makes r's table from its sorted points.
func (r *ring) fillTable() {
	r.table = make([]bucketEntry, tableSize(len(r.hashes)))
	r.size = uint64(len(r.table))
	bk := 0 // the first bucket not yet filled
	for i, h := range r.hashes {
		for ; bk < r.bucket(h); bk++ {
			r.table[bk] = ownerEntry(r.owners[i]) // an empty bucket: point i is next
		}
		if bk == r.bucket(h) {
			r.table[bk] = scanEntry(i)
			bk++
		}
	}
	for ; bk < len(r.table); bk++ {
		r.table[bk] = ownerEntry(r.owners[0]) // past the last point: wrap around
	}
}

// bucket returns the table bucket of hash h: its top 32 bits scaled to the
// table's size (Lemire's fast range), so hashes and buckets keep their order
// and the table needs no power-of-two size.
func (r *ring) bucket(h uint64) int { return int((h >> 32) * r.size >> 32) }

// pick returns the member that owns hash h.
func (r *ring) pick(h uint64) *member {
	e := r.table[r.bucket(h)]
	if m, ok := e.owner(); ok {
		return &r.members[m]
	}
	i := e.point()
	for r.scan[i] < h {
		i++
	}
	if i == len(r.owners) {
		i = 0
	}
	return &r.members[r.owners[i]]
}

// sortedPoints returns the points of ms, their hashes and owners, sorted by
// hash and then by owner. The hashes end with a sentinel, math.MaxUint64.
//
// The sort takes linear time, which matters at a million points: a counting
// sort by the top 8 bits, which writes to 256 places at a time and so stays
// in cache; then a counting sort of each group by its next bits, in a small
// buffer; then an insertion sort, which only has to order the point or two
// that share those bits.
func sortedPoints(ms []member, points int) ([]uint64, []uint32) {
	n := len(ms) * points
	// The hashes in member order (owner = index / points), as two halves.
	gen := make([]uint32, 2*n)
	var name []byte
	for m := range ms {
		name = append(append(name[:0], ms[m].id...), '-', '0')
		digits := len(name) - 1
		for i := m * points; i < (m+1)*points; i++ {
			h := xxhash.Sum64(name)
			gen[2*i], gen[2*i+1] = uint32(h>>32), uint32(h)
			name = incDecimal(name, digits)
		}
	}

	group := func(h uint64) int { return int(h >> (64 - sortGroupBits)) }
	var start [1<<sortGroupBits + 1]int
	for i := 0; i < len(gen); i += 2 {
		start[gen[i]>>(32-sortGroupBits)+1]++
	}
	for g := 1; g < len(start); g++ {
		start[g] += start[g-1]
	}
	next := start
	hashes := make([]uint64, n, n+1)
	owners := make([]uint32, n)
	for m := range ms {
		for j := 2 * m * points; j < 2*(m+1)*points; j += 2 {
			h := uint64(gen[j])<<32 | uint64(gen[j+1])
			i := next[group(h)]
			next[group(h)]++
			hashes[i], owners[i] = h, uint32(m)
		}
	}

	subBits := max(0, bits.Len(uint(n))-1-sortGroupBits) // one or two points each
	sub := func(h uint64) int { return int(h << sortGroupBits >> (64 - subBits)) }
	count := make([]int, 1<<subBits+1)
	var hs []uint64
	var os []uint32
	for g := range 1 << sortGroupBits {
		lo, hi := start[g], start[g+1]
		clear(count)
		for _, h := range hashes[lo:hi] {
			count[sub(h)+1]++
		}
		for s := 1; s < len(count); s++ {
			count[s] += count[s-1]
		}
		hs, os = append(hs[:0], hashes[lo:hi]...), append(os[:0], owners[lo:hi]...)
		for j, h := range hs {
			k := lo + count[sub(h)]
			count[sub(h)]++
			hashes[k], owners[k] = h, os[j]
		}
		// Sorted by the bits so far, each point is at most a place or
		// two from its final one: an insertion sort finishes in linear time.
		insertionSort(hashes, owners, lo, hi)
	}
	return append(hashes, math.MaxUint64), owners
}

// incDecimal adds one to the decimal number in buf[start:]: the point names
// id-0, id-1, ... are built several times faster than by formatting each.
func incDecimal(buf []byte, start int) []byte {
	for i := len(buf) - 1; i >= start; i-- {
		if buf[i] < '9' {
			buf[i]++
			return buf
		}
		buf[i] = '0'
	}
	return slices.Insert(buf, start, '1')
}

// insertionSort sorts points [lo, hi) by hash, then by owner (owners index
// members, which are sorted by id, so this breaks ties by id).
func insertionSort(hashes []uint64, owners []uint32, lo, hi int) {
	for i := lo + 1; i < hi; i++ {
		h, o := hashes[i], owners[i]
		j := i
		for ; j > lo && (hashes[j-1] > h || hashes[j-1] == h && owners[j-1] > o); j-- {
			hashes[j], owners[j] = hashes[j-1], owners[j-1]
		}
		hashes[j], owners[j] = h, o
	}
}

// sameIDs reports whether r has exactly the member ids of ms, in which case
// r's points can be reused and only the addresses need rebinding.
func (r *ring) sameIDs(ms []member) bool {
	return r != nil && slices.EqualFunc(r.members, ms, func(a, b member) bool { return a.id == b.id })
}

// withMembers returns a ring with r's points and the members ms, which must
// have the same ids as r's members (sameIDs). It is how a pod that keeps its
// identity but gets a new IP is rebound without rehashing.
func (r *ring) withMembers(ms []member) *ring {
	c := *r
	c.members, c.servers = ms, servers(ms)
	return &c
}

// servers returns the distinct addresses of ms, sorted.
func servers(ms []member) []net.Addr {
	as := make([]net.Addr, 0, len(ms))
	for _, m := range ms {
		as = append(as, m.addr)
	}
	slices.SortFunc(as, func(a, b net.Addr) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(as, func(a, b net.Addr) bool { return a.String() == b.String() })
}

// canonical sorts ms by id and removes members with a duplicate id, keeping
// the first, so that equal sets give equal rings.
func canonical(ms []member) []member {
	slices.SortStableFunc(ms, func(a, b member) int { return strings.Compare(a.id, b.id) })
	return slices.CompactFunc(ms, func(a, b member) bool { return a.id == b.id })
}
