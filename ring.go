package selector

import (
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
// with 1500 points, by 3.6% on average at 10 members and 7% at 100 (1000
// points give 5% and 8%). A ring of 1000 members takes 22 MB.
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
// Lookups use a prefix index: bucket b holds the points whose top bits are b,
// so a lookup scans about one point. A ring is never modified after build
// and is safe for concurrent use.
type ring struct {
	members []member   // sorted by id, no duplicate ids
	servers []net.Addr // the members' distinct addresses, sorted
	hashes  []uint64   // point hashes, sorted
	owners  []uint32   // owners[i] indexes members for hashes[i]
	index   []uint32   // index[b] is the first point in bucket b; len = buckets+1
	shift   uint       // a hash's bucket is hash >> shift
}

// newRing builds a ring over ms with the given points per member. ms must be
// sorted by id without duplicate ids (see canonical). It returns nil for an
// empty member set, which PickServer reports as ErrNoServers.
func newRing(ms []member, points int) *ring {
	if len(ms) == 0 {
		return nil
	}
	if points < 1 {
		points = 1
	}
	total := len(ms) * points

	// About two points per bucket: a short scan, and an index a quarter the
	// size of the hash table.
	b := bits.Len(uint(total)) - 1
	if b < 1 {
		b = 1
	}
	r := &ring{
		members: ms,
		servers: servers(ms),
		hashes:  make([]uint64, total),
		owners:  make([]uint32, total),
		index:   make([]uint32, (1<<b)+1),
		shift:   uint(64 - b),
	}

	// Sort the points by hash in linear time, with two rounds of counting
	// sort: by the top bits into at most 256 groups, then each group by its
	// buckets. Each round writes to few places at a time, so it stays in
	// cache; one round into a million buckets, or a comparison sort, takes
	// several times longer. Points are hashed twice, to count and to place,
	// rather than kept in a temporary copy.
	g := min(8, b)
	gshift := uint(64 - g)
	groups := make([]uint32, (1<<g)+1)
	r.eachPoint(points, func(h uint64, _ uint32) { groups[h>>gshift+1]++ })
	for i := 1; i < len(groups); i++ {
		groups[i] += groups[i-1]
	}
	next := slices.Clone(groups)
	r.eachPoint(points, func(h uint64, m uint32) {
		i := next[h>>gshift]
		next[h>>gshift]++
		r.hashes[i], r.owners[i] = h, m
	})

	for _, h := range r.hashes {
		r.index[h>>r.shift+1]++
	}
	for i := 1; i < len(r.index); i++ {
		r.index[i] += r.index[i-1]
	}
	next = slices.Clone(r.index)
	var hs []uint64
	var ow []uint32
	for i := range len(groups) - 1 {
		lo, hi := groups[i], groups[i+1]
		hs = append(hs[:0], r.hashes[lo:hi]...)
		ow = append(ow[:0], r.owners[lo:hi]...)
		for j, h := range hs {
			k := next[h>>r.shift]
			next[h>>r.shift]++
			r.hashes[k], r.owners[k] = h, ow[j]
		}
	}
	for bk := range len(r.index) - 1 {
		r.sortBucket(int(r.index[bk]), int(r.index[bk+1]))
	}
	return r
}

// eachPoint calls f with the hash and owner of every point. The point names
// id-0, id-1, ... are built by incrementing the decimal suffix in place,
// which is several times faster than formatting each number.
func (r *ring) eachPoint(points int, f func(h uint64, m uint32)) {
	var buf []byte
	for m := range r.members {
		buf = append(append(buf[:0], r.members[m].id...), '-', '0')
		n := len(buf) - 1 // start of the decimal suffix
		for range points {
			f(xxhash.Sum64(buf), uint32(m))
			buf = incDecimal(buf, n)
		}
	}
}

// incDecimal adds one to the decimal number in buf[start:].
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

// sortBucket insertion-sorts points [lo, hi) by hash, then by owner (owners
// are indexes into members, which are sorted by id). Buckets hold about two
// points, so insertion sort is the fastest choice.
func (r *ring) sortBucket(lo, hi int) {
	for i := lo + 1; i < hi; i++ {
		h, o := r.hashes[i], r.owners[i]
		j := i
		for ; j > lo && (r.hashes[j-1] > h || r.hashes[j-1] == h && r.owners[j-1] > o); j-- {
			r.hashes[j], r.owners[j] = r.hashes[j-1], r.owners[j-1]
		}
		r.hashes[j], r.owners[j] = h, o
	}
}

// pick returns the member that owns hash h.
func (r *ring) pick(h uint64) *member {
	i, end := r.index[h>>r.shift], r.index[h>>r.shift+1]
	for i < end && r.hashes[i] < h {
		i++
	}
	if int(i) == len(r.hashes) {
		i = 0
	}
	return &r.members[r.owners[i]]
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
