package ring

import (
	"cmp"
	"crypto/md5"
	"encoding/binary"
	"math"
	"math/bits"
	"net"
	"slices"
	"strconv"
)

// libmemcached's weighted ketama (libmemcached/hosts.cc,
// update_continuum), which php-memcached's OPT_LIBKETAMA_COMPATIBLE and
// twemproxy's ketama (nc_ketama.c) compute alike. The vectors of
// libmemcached's ketama test are in ketama_test.go.

const ketamaPointsPerServer = 160 // MEMCACHED_POINTS_PER_SERVER_KETAMA

// continuum is a ketama ring: its points sorted by value, each with its
// member's index, and an index of the points by their top bits, so that a
// lookup searches the few points of one bucket rather than them all.
type continuum struct {
	value  []uint32
	member []uint32
	bucket []uint32 // bucket[b]: the first point whose value >> shift >= b
	shift  uint
}

// newContinuum returns the continuum of servers with the given names and
// weights (0 counts as 1), as libmemcached builds it over its live servers.
// Equal points of two servers are ordered by rank, lowest first, and so
// the lower rank owns the keys that reach them: libmemcached sorts its
// continuum by value, then by the server's place in its list
// (continuum_item_cmp in hosts.cc), and twemproxy's qsort by value alone
// keeps the points in the order it made them, server by server (glibc's
// qsort is a merge sort), which comes to the same over its own list order
// (see KetamaRanks).
func newContinuum(names []string, weights []uint32, rank []int) *continuum {
	var total uint64
	for _, w := range weights {
		total += uint64(max(w, 1))
	}
	type point struct{ value, member uint32 }
	var pts []point
	buf := make([]byte, 0, 64)
	for i, name := range names {
		// (float)(pct * 160 / 4 * (float)live + 0.0000000001), in float32
		// as C computes it on amd64, then floored: a weight's points are
		// these float32 roundings, not the exact quotient.
		pct := float32(max(weights[i], 1)) / float32(total)
		v := float32(float32(pct*ketamaPointsPerServer)/4) * float32(len(names))
		digests := int(math.Floor(float64(float32(float64(v) + 0.0000000001))))
		host := KetamaHost(name)
		for d := range digests {
			buf = strconv.AppendInt(append(append(buf[:0], host...), '-'), int64(d), 10)
			sum := md5.Sum(buf)
			for a := range 4 {
				pts = append(pts, point{binary.LittleEndian.Uint32(sum[4*a:]), uint32(i)})
			}
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.value, b.value), cmp.Compare(rank[a.member], rank[b.member]))
	})
	c := &continuum{value: make([]uint32, len(pts)), member: make([]uint32, len(pts))}
	for i, p := range pts {
		c.value[i], c.member[i] = p.value, p.member
	}
	// About one bucket a point, 2^8 to 2^16 of them.
	b := min(max(bits.Len(uint(len(pts))), 8), 16)
	c.shift = uint(32 - b)
	c.bucket = make([]uint32, 1<<b+1)
	for i, j := 0, 0; i < len(c.bucket); i++ {
		for j < len(c.value) && uint64(c.value[j])>>c.shift < uint64(i) {
			j++
		}
		c.bucket[i] = uint32(j)
	}
	return c
}

// KetamaHost returns what the points of a server named host:port are
// hashed from, before "-i": host on port 11211, else host:port, as
// libmemcached's update_continuum and twemproxy's conf_add_server write
// them; an IPv6 host without brackets, as their users give it to them
// ("::1" and port 11212 to libmemcached, "::1:11212:1" to twemproxy), so
// "::1-i" and "::1:11212-i". A name that is no host:port (a Unix socket's
// path) is taken whole.
func KetamaHost(name string) string {
	host, port, err := net.SplitHostPort(name)
	switch {
	case err != nil:
		return name
	case port == "11211": // MEMCACHED_DEFAULT_PORT
		return host
	}
	return host + ":" + port
}

// at returns the index of the point that a key of hash h goes to: the
// first at or after h, or past the last, the first (libmemcached's
// dispatch_host).
func (c *continuum) at(h uint32) int {
	b := h >> c.shift
	lo, hi := int(c.bucket[b]), int(c.bucket[b+1]) // the answer is in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if c.value[mid] < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(c.value) {
		return 0
	}
	return lo
}

// owner returns the member index for hash h.
func (c *continuum) owner(h uint64) uint32 { return c.member[c.at(uint32(h))] }

// next returns the index of the point after i, around the ring.
func (c *continuum) next(i int) int {
	if i++; i == len(c.value) {
		return 0
	}
	return i
}
