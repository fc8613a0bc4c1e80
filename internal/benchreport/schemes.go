package main

// The routing schemes the report compares the ring with: modulo hashing as
// gomemcache's ServerList and the seed library do it, counted exactly, and
// jump hashing as Thanos and grafana dskit do it, over sampled keys.

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// node is a server as a routing scheme sees it: key is what the scheme
// hashes or sorts (ip:port, or a pod's hostname:port); pod is the server
// behind it, which decides whether a key moved.
type node struct{ key, pod string }

func same(ids []string) []node {
	ns := make([]node, len(ids))
	for i, id := range ids {
		ns[i] = node{id, id}
	}
	return ns
}

// measure returns the fraction of the keys that a change of servers to
// after moved, and the fraction of them that moved between two servers
// present before and after it.
type measure func(after []node) (moved, needless float64)

// scheme is a routing scheme in the movement tables. prepare takes the
// servers before a change, in discovery order, and returns the measure of
// changes from them. Each scheme orders lists as its library does.
type scheme struct {
	name, method string
	prepare      func(before []node) measure
}

// podsInOrder returns the pods of ns in the order of their keys: as given
// (order == nil), or sorted by order.
func podsInOrder(ns []node, order func(a, b string) int) []string {
	ns = slices.Clone(ns)
	if order != nil {
		slices.SortFunc(ns, func(a, b node) int { return order(a.key, b.key) })
	}
	pods := make([]string, len(ns))
	for i, n := range ns {
		pods[i] = n.pod
	}
	return pods
}

// moduloScheme is crc32 % N over the list as given (order == nil) or sorted.
func moduloScheme(order func(a, b string) int) func([]node) measure {
	return func(before []node) measure {
		a := podsInOrder(before, order)
		return func(after []node) (float64, float64) {
			return moduloMoves(a, podsInOrder(after, order))
		}
	}
}

// moduloMoves counts exactly, over all 2^32 crc32 values, the keys that
// modulo hashing (gomemcache: servers[crc32(key) % len]) sends to another
// server when the list changes from before to after. It assumes the keys'
// checksums are uniform over the 2^32 values. h%len(before) and
// h%len(after) repeat with period lcm(len(before), len(after)), so one period
// is counted and weighted by how often it occurs below 2^32.
func moduloMoves(before, after []string) (moved, needless float64) {
	inBefore, inAfter := map[string]bool{}, map[string]bool{}
	for _, s := range before {
		inBefore[s] = true
	}
	for _, s := range after {
		inAfter[s] = true
	}
	n1, n2 := len(before), len(after)
	period := n1 / gcd(n1, n2) * n2
	full, rest := (1<<32)/period, (1<<32)%period
	var mv, nl int
	for r := range period {
		x, y := before[r%n1], after[r%n2]
		if x == y {
			continue
		}
		w := full
		if r < rest {
			w++
		}
		mv += w
		if inAfter[x] && inBefore[y] {
			nl += w
		}
	}
	return float64(mv) / (1 << 32), float64(nl) / (1 << 32)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// jumpScheme is jump hashing of the xxhash of each sampled key over the
// list in natural order, as Thanos and dskit do.
func jumpScheme(hashes []uint64) func([]node) measure {
	return func(before []node) measure {
		pods := map[string]int{} // pod -> number, to compare owners cheaply
		intern := func(ns []node) []int {
			ids := make([]int, len(ns))
			for i, p := range podsInOrder(ns, natCompare) {
				if _, ok := pods[p]; !ok {
					pods[p] = len(pods)
				}
				ids[i] = pods[p]
			}
			return ids
		}
		a := intern(before)
		owners := make([]int, len(hashes))
		for i, h := range hashes {
			owners[i] = a[jump(h, len(a))]
		}
		return func(after []node) (float64, float64) {
			b := intern(after)
			inA, inB := make([]bool, len(pods)), make([]bool, len(pods))
			for _, p := range a {
				inA[p] = true
			}
			for _, p := range b {
				inB[p] = true
			}
			var mv, nl int
			for i, h := range hashes {
				x, y := owners[i], b[jump(h, len(b))]
				if x != y {
					mv++
					if inB[x] && inA[y] {
						nl++
					}
				}
			}
			return float64(mv) / float64(len(hashes)), float64(nl) / float64(len(hashes))
		}
	}
}

// jump is the jump consistent hash of Lamping and Veach, "A Fast, Minimal
// Memory, Consistent Hash Algorithm" (2014, arXiv:1406.2294), figure 1, as
// in github.com/dgryski/go-jump, which Thanos (pkg/cacheutil) and grafana
// dskit (cache) use over an xxhash of the key and a sorted server list.
func jump(key uint64, buckets int) int {
	b, j := int64(-1), int64(0)
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

// natCompare orders strings naturally, runs of digits as numbers, as the
// natsort.Sort that Thanos and dskit apply to their server lists.
func natCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := cmp.Compare(len(na), len(nb)); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if c := cmp.Compare(a[0], b[0]); c != 0 {
			return c
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digits(s string) int {
	n := 0
	for n < len(s) && '0' <= s[n] && s[n] <= '9' {
		n++
	}
	return n
}

// sampleHashes returns the xxhash of n keys of the shapes of the
// benchmarks' keys (benchKeySet in bench_test.go), from the seed the report
// has always used, so that the sampled figures stay comparable from run to
// run.
func sampleHashes(n int) []uint64 {
	rng := rand.New(rand.NewPCG(9, 9))
	hs := make([]uint64, n)
	for i := range hs {
		var k string
		switch i % 4 {
		case 0:
			k = fmt.Sprintf("user:%d:profile", 1000000+rng.IntN(9000000))
		case 1:
			k = fmt.Sprintf("session:%016x", rng.Uint64())
		case 2:
			k = fmt.Sprintf("product:%d:price:v%d", 100000+rng.IntN(900000), rng.IntN(10))
		default:
			k = fmt.Sprintf("feed:user:%d:page:%d", 1000000+rng.IntN(9000000), 10+rng.IntN(90))
		}
		hs[i] = xxhash.Sum64String(k)
	}
	return hs
}
