package ring

import "math/bits"

// mcrouter's ch3, ported from mcrouter/lib/fbi/hash.c (MIT): furc_hash over
// MurmurHash64A. The vectors of mcrouter's Ch3HashTest are in ch3_test.go.

const (
	furcSeed     = 4193360111
	furcMaxTries = 32
	furcShift    = 23
	murmurM      = 0xc6a4a7935bd1e995
	murmurR      = 47

	// maxCh3 is mcrouter's furc_maximum_pool_size, 2^23.
	maxCh3 = 1 << furcShift
)

// Murmur64A is MurmurHash64A of key with furc's seed: the hash that Ch3's
// ring is read with, of the key's routing key (see RoutingKey).
func Murmur64A(key string) uint64 {
	h := uint64(furcSeed) ^ uint64(len(key))*murmurM
	for ; len(key) >= 8; key = key[8:] {
		k := uint64(key[0]) | uint64(key[1])<<8 | uint64(key[2])<<16 | uint64(key[3])<<24 |
			uint64(key[4])<<32 | uint64(key[5])<<40 | uint64(key[6])<<48 | uint64(key[7])<<56
		k *= murmurM
		k ^= k >> murmurR
		k *= murmurM
		h ^= k
		h *= murmurM
	}
	if len(key) > 0 {
		for j := len(key) - 1; j >= 0; j-- {
			h ^= uint64(key[j]) << (8 * j)
		}
		h *= murmurM
	}
	h ^= h >> murmurR
	h *= murmurM
	h ^= h >> murmurR
	return h
}

// murmurRehash is murmur_rehash_64A: MurmurHash64A of the 8 bytes of k.
func murmurRehash(k uint64) uint64 {
	h := uint64(furcSeed) ^ 0x35253c9ade8f4ca8 // seed ^ 8*m, mod 2^64
	k *= murmurM
	k ^= k >> murmurR
	k *= murmurM
	h ^= k
	h *= murmurM
	h ^= h >> murmurR
	h *= murmurM
	h ^= h >> murmurR
	return h
}

// furcBits is furc's stream of bits: word 0 the key's Murmur64A, each next
// word the rehash of the one before, computed as they are reached. furc
// reads at most bit furcShift + furcMaxTries*furcShift*furcShift (its index
// grows by furcShift a bit, up to furcShift bits a try).
type furcBits struct {
	words [(furcShift+furcMaxTries*furcShift*furcShift)/64 + 1]uint64
	n     int // words computed
}

func (b *furcBits) bit(i int) uint64 {
	w := i >> 6
	for b.n <= w {
		b.words[b.n] = murmurRehash(b.words[b.n-1])
		b.n++
	}
	return b.words[w] >> (i & 63) & 1
}

// furc is furc_hash: the index in [0, m) of a key whose Murmur64A is h.
// m is at most maxCh3.
func furc(h uint64, m uint32) uint32 {
	if m <= 1 {
		return 0
	}
	b := furcBits{n: 1}
	b.words[0] = h
	d := 32 - bits.LeadingZeros32(m-1)
	a := d
	for range furcMaxTries {
		for b.bit(a) == 0 {
			d--
			if d == 0 {
				return 0
			}
			a = d
		}
		a += furcShift
		num := uint32(1)
		for range d - 1 {
			num = num<<1 | uint32(b.bit(a))
			a += furcShift
		}
		if num < m {
			return num
		}
	}
	return 0
}

// ch3Ring is a Ch3 ring: the members at their indexes, with holes (-1)
// where a server of the order is missing, such as a pod not ready.
type ch3Ring struct {
	at []int32 // member index at each position, or -1
}

// newCh3 places each member i at pos[i].
func newCh3(pos []int) *ch3Ring {
	n := 0
	for _, p := range pos {
		n = max(n, p+1)
	}
	r := &ch3Ring{at: make([]int32, n)}
	for i := range r.at {
		r.at[i] = -1
	}
	for i, p := range pos {
		r.at[p] = int32(i)
	}
	return r
}

// probe returns the position of the i-th try for a key of hash h: furc's
// own for i = 0, then furc over rehashes of h, a fixed sequence per key, so
// that a hole's keys spread over the others and each client agrees.
func (r *ch3Ring) probe(h uint64, i int) uint32 {
	if i > 0 {
		h = murmurRehash(h + uint64(i))
	}
	return furc(h, uint32(len(r.at)))
}

// owner returns the member index for hash h: at its position, or past a
// hole, at the first try that finds a member (or the first member after
// the hole, when 32 tries find none).
func (r *ch3Ring) owner(h uint64) uint32 {
	p := r.probe(h, 0)
	if m := r.at[p]; m >= 0 {
		return uint32(m)
	}
	for i := 1; i <= furcMaxTries; i++ {
		if m := r.at[r.probe(h, i)]; m >= 0 {
			return uint32(m)
		}
	}
	for j := range r.at {
		if m := r.at[(int(p)+j)%len(r.at)]; m >= 0 {
			return uint32(m)
		}
	}
	return 0
}
