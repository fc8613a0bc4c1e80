package selector

// Routing quality, measured exactly where the structure allows.
//
// A ring sends a key hash to the first point at or after it, wrapping
// around, so each point owns the arc from the previous point (exclusive) to
// itself (inclusive), and a member's share of the keys is the length of its
// arcs over 2^64. No keys are sampled. Two rings compare the same way: both
// are constant between consecutive points of either ring, so walking the
// merge of their points gives exactly the keys that change owner.
//
// The Test* functions below are fast correctness checks that always run: they
// fail if the ring's balance or movement regresses. TestQualityReport, run by
// make bench, writes BENCHMARKS.md: these figures for more sizes, modulo and
// jump hashing for contrast, and the benchmark tables of bench_test.go.
//
// Identifiers here start with q to stay clear of the ring and selector tests.

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

var (
	qualityReport    = flag.String("quality-report", "", "write the routing-quality report and the benchmark tables to this Markdown `file` (make bench)")
	qualityBench     = flag.String("quality-bench", "", "comma-separated go test -bench output `files` to summarize in the report")
	qualityBenchstat = flag.String("quality-benchstat", "", "benchstat output `file` to append to the report, if it exists")
	qualityCommand   = flag.String("quality-command", "make bench", "the `command` that produced the report, for its header")
	qualityLoad      = flag.String("quality-loadavg", "", "a copy of /proc/loadavg taken before the benchmarks, for the report's header")
	qualityE2E       = flag.String("quality-e2e", "", "Markdown `file` of figures from the e2e suite (make bench-e2e) to include, if it exists")
)

// qCount counts key hashes exactly: the whole 64-bit space, 2^64 hashes,
// does not fit in a uint64.
type qCount struct{ hi, lo uint64 }

func (c *qCount) add(n uint64) {
	var carry uint64
	c.lo, carry = bits.Add64(c.lo, n, 0)
	c.hi += carry
}

// fraction returns the count as a fraction of the 2^64 key hashes.
func (c qCount) fraction() float64 { return float64(c.hi) + float64(c.lo)/0x1p64 }

// qShares returns each member's exact share of the key space, indexed like
// r.members. Point i owns the arc (hashes[i-1], hashes[i]]; the first point
// also owns the arc past the last one, which the unsigned subtraction wraps
// around zero. Among equal hashes the first point wins (it is the first at or
// after any key), so the others own empty arcs.
func qShares(r *ring) []float64 {
	counts := make([]qCount, len(r.members))
	prev := r.hashes[len(r.hashes)-1]
	for i, h := range r.hashes {
		counts[r.owners[i]].add(h - prev)
		prev = h
	}
	if len(r.hashes) == 1 {
		counts[r.owners[0]] = qCount{hi: 1}
	}
	shares := make([]float64, len(counts))
	for i, c := range counts {
		shares[i] = c.fraction()
	}
	return shares
}

// qPeakMin returns the largest and smallest share over the mean share.
func qPeakMin(shares []float64) (peak, low float64) {
	mean := 1 / float64(len(shares))
	return slices.Max(shares) / mean, slices.Min(shares) / mean
}

// qMoves is what a change of servers did to the key space, in fractions of it.
type qMoves struct {
	moved    float64 // keys whose owner changed
	needless float64 // of those, keys that moved between two owners present both before and after
}

// qDiff compares exactly the owner of every key hash under rings a and b.
// owner names the owner of a member: its id, or the pod behind an IP.
func qDiff(a, b *ring, owner func(member) string) qMoves {
	names := map[string]int{}
	intern := func(ms []member) []int {
		ids := make([]int, len(ms))
		for i, m := range ms {
			name := owner(m)
			if _, ok := names[name]; !ok {
				names[name] = len(names)
			}
			ids[i] = names[name]
		}
		return ids
	}
	oa, ob := intern(a.members), intern(b.members)
	inA, inB := make([]bool, len(names)), make([]bool, len(names))
	for _, o := range oa {
		inA[o] = true
	}
	for _, o := range ob {
		inB[o] = true
	}

	var moved, needless qCount
	ha, hb := a.hashes, b.hashes
	i, j := 0, 0
	prev := max(ha[len(ha)-1], hb[len(hb)-1])
	for i < len(ha) || j < len(hb) {
		var x uint64 // the next point of either ring
		if j == len(hb) || i < len(ha) && ha[i] <= hb[j] {
			x = ha[i]
		} else {
			x = hb[j]
		}
		// The keys in (prev, x] go to the first point at or after x in each
		// ring, or to its first point once past its last.
		pa, pb := oa[a.owners[i%len(ha)]], ob[b.owners[j%len(hb)]]
		if pa != pb {
			moved.add(x - prev)
			if inB[pa] && inA[pb] {
				needless.add(x - prev)
			}
		}
		for i < len(ha) && ha[i] == x {
			i++
		}
		for j < len(hb) && hb[j] == x {
			j++
		}
		prev = x
	}
	return qMoves{moved.fraction(), needless.fraction()}
}

// qIDs hands out distinct random server addresses such as "10.23.4.187:11211".
type qIDs struct {
	rng  *rand.Rand
	used map[string]bool
}

func newQIDs(seed uint64) *qIDs {
	return &qIDs{rng: rand.New(rand.NewPCG(seed, 7)), used: map[string]bool{}}
}

func (g *qIDs) next() string {
	for {
		id := fmt.Sprintf("10.%d.%d.%d:11211", g.rng.IntN(256), g.rng.IntN(256), 1+g.rng.IntN(254))
		if !g.used[id] {
			g.used[id] = true
			return id
		}
	}
}

func (g *qIDs) list(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = g.next()
	}
	return ids
}

// qRing builds the ring that SetServers would build for ids.
func qRing(ids []string, points int) *ring {
	ms := make([]member, len(ids))
	for i, id := range ids {
		ms[i] = member{id: id, addr: &staticAddr{network: "tcp", str: id}}
	}
	return newRing(canonical(ms), points)
}

func byID(m member) string { return m.id }

// qBalance returns the mean over sets random member sets of n members of the
// exact peak/mean and min/mean shares, and the worst of each.
func qBalance(ids *qIDs, n, points, sets int) (peak, worstPeak, low, worstLow float64) {
	worstLow = math.Inf(1)
	for range sets {
		p, l := qPeakMin(qShares(qRing(ids.list(n), points)))
		peak += p / float64(sets)
		low += l / float64(sets)
		worstPeak, worstLow = max(worstPeak, p), min(worstLow, l)
	}
	return peak, worstPeak, low, worstLow
}

// TestQualityBalance checks the exact key-space balance of the ring at the
// default points against the goals: peak/mean at most 1.05 up to 10 members
// and 1.10 at 100, averaged over random member sets.
func TestQualityBalance(t *testing.T) {
	ids := newQIDs(1)
	for _, tc := range []struct {
		n, sets int
		maxPeak float64
	}{
		{3, 20, 1.05},
		{10, 20, 1.05},
		{100, 3, 1.10},
	} {
		peak, worst, low, _ := qBalance(ids, tc.n, DefaultPointsPerServer, tc.sets)
		t.Logf("%d members, %d points: peak/mean %.4f (worst %.4f), min/mean %.4f", tc.n, DefaultPointsPerServer, peak, worst, low)
		if peak > tc.maxPeak {
			t.Errorf("%d members: exact peak/mean share %.4f averaged over %d sets, want at most %.2f", tc.n, peak, tc.sets, tc.maxPeak)
		}
	}
}

// TestQualityShares checks the exact method against the real lookup: the
// shares sum to one, every arc's two ends are picked as its owner, and
// sampled keys through PickServer land in proportion to the shares.
func TestQualityShares(t *testing.T) {
	ids := newQIDs(2).list(10)
	var ss ServerList
	if err := ss.SetServers(ids...); err != nil {
		t.Fatal(err)
	}
	r := ss.ring.Load()
	shares := qShares(r)
	var sum float64
	for _, s := range shares {
		sum += s
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Fatalf("shares sum to %v, want 1", sum)
	}

	prev := r.hashes[len(r.hashes)-1]
	for i, h := range r.hashes {
		if h == prev && i > 0 {
			continue // a tied point owns nothing
		}
		want := &r.members[r.owners[i]]
		if got := r.pick(h); got != want {
			t.Fatalf("pick(%#x), the end of point %d's arc, = %s, want %s", h, i, got.id, want.id)
		}
		if got := r.pick(prev + 1); got != want {
			t.Fatalf("pick(%#x), the start of point %d's arc, = %s, want %s", prev+1, i, got.id, want.id)
		}
		prev = h
	}

	const keys = 200000
	counts := map[string]int{}
	for i := range keys {
		a, err := ss.PickServer(fmt.Sprintf("key:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		counts[a.String()]++
	}
	for i, m := range r.members {
		got := float64(counts[m.addr.String()]) / keys
		sigma := math.Sqrt(shares[i] * (1 - shares[i]) / keys)
		if math.Abs(got-shares[i]) > 5*sigma {
			t.Errorf("%s: %.5f of sampled keys, exact share %.5f (more than 5 sigma apart)", m.id, got, shares[i])
		}
	}
}

// TestQualityMovement checks, exactly, that removing any member moves only
// its keys and adding one moves keys only to it, and that the moved fraction
// averages within 5% of the ideal 1/N and 1/(N+1).
func TestQualityMovement(t *testing.T) {
	gen := newQIDs(3)
	for _, tc := range []struct{ n, removals, adds int }{
		{10, 10, 8},
		{100, 8, 8},
	} {
		ids := gen.list(tc.n)
		base := qRing(ids, DefaultPointsPerServer)
		shares := qShares(base)

		var removed float64
		for _, k := range rand.New(rand.NewPCG(uint64(tc.n), 1)).Perm(tc.n)[:tc.removals] {
			gone := base.members[k].id
			after := qRing(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == gone }), DefaultPointsPerServer)
			mv := qDiff(base, after, byID)
			if mv.needless != 0 {
				t.Errorf("%d members, removing %s: %.3g of the keys moved between survivors, want 0", tc.n, gone, mv.needless)
			}
			if math.Abs(mv.moved-shares[k]) > 1e-12 {
				t.Errorf("%d members, removing %s: moved %.6f, want its share %.6f", tc.n, gone, mv.moved, shares[k])
			}
			removed += mv.moved / float64(tc.removals)
		}
		if ratio := removed * float64(tc.n); ratio > 1.05 || ratio < 1/1.05 {
			t.Errorf("%d members: removal moved %.4f on average, %.3fx the ideal 1/N", tc.n, removed, ratio)
		}

		var added float64
		for range tc.adds {
			id := gen.next()
			after := qRing(append(slices.Clone(ids), id), DefaultPointsPerServer)
			mv := qDiff(base, after, byID)
			if mv.needless != 0 {
				t.Errorf("%d members, adding %s: %.3g of the keys moved between old members, want 0", tc.n, id, mv.needless)
			}
			added += mv.moved / float64(tc.adds)
		}
		if ratio := added * float64(tc.n+1); ratio > 1.05 || ratio < 1/1.05 {
			t.Errorf("%d members: adding moved %.4f on average, %.3fx the ideal 1/(N+1)", tc.n, added, ratio)
		}
		t.Logf("%d members: removal moved %.4f (ideal %.4f), adding moved %.4f (ideal %.4f)", tc.n, removed, 1/float64(tc.n), added, 1/float64(tc.n+1))
	}
}

// TestQualityRestart checks through ServerList.update that a StatefulSet
// pod which restarts with a new IP keeps exactly its keys, now at the new IP.
func TestQualityRestart(t *testing.T) {
	ss := new(ServerList)
	pods := qPods(10, newQIDs(4))
	ss.update(qPodMembers(pods))
	before := ss.ring.Load()
	pods[3].ip = "10.99.99.99"
	ss.update(qPodMembers(pods))
	after := ss.ring.Load()
	if mv := qDiff(before, after, byID); mv.moved != 0 {
		t.Errorf("a pod restart with a new IP moved %.4f of the keys, want 0", mv.moved)
	}
	for _, m := range after.members {
		if m.id == "memcached-3:11211" && m.addr.String() != "10.99.99.99:11211" {
			t.Errorf("restarted pod dials %s, want 10.99.99.99:11211", m.addr)
		}
	}
}

// TestQualityModulo checks the exact modulo count against gomemcache's own
// ServerList on sampled keys.
func TestQualityModulo(t *testing.T) {
	ids := newQIDs(5).list(11)
	before, after := ids[:10], slices.Delete(slices.Clone(ids[:10]), 4, 5)
	exact := qModuloMoves(before, after).moved

	const keys = 100000
	var a, b memcache.ServerList
	if err := a.SetServers(before...); err != nil {
		t.Fatal(err)
	}
	if err := b.SetServers(after...); err != nil {
		t.Fatal(err)
	}
	moved := 0
	for i := range keys {
		k := fmt.Sprintf("key:%d", i)
		x, _ := a.PickServer(k)
		y, _ := b.PickServer(k)
		if x.String() != y.String() {
			moved++
		}
	}
	got := float64(moved) / keys
	if sigma := math.Sqrt(exact * (1 - exact) / keys); math.Abs(got-exact) > 5*sigma {
		t.Errorf("gomemcache moved %.4f of sampled keys, exact count says %.4f", got, exact)
	}
}

// TestQualityJump checks the natural order of server lists and the jump
// hash's defining property: going from n to n+1 buckets, a key stays or
// moves to the new bucket n.
func TestQualityJump(t *testing.T) {
	names := []string{"memcached-10:11211", "memcached-9:11211", "memcached-1:11211", "memcached-0:11211"}
	slices.SortFunc(names, qNatCompare)
	if want := []string{"memcached-0:11211", "memcached-1:11211", "memcached-9:11211", "memcached-10:11211"}; !slices.Equal(names, want) {
		t.Errorf("natural order %v, want %v", names, want)
	}

	for k := range uint64(2000) {
		h := xxhash.Sum64String(fmt.Sprint(k))
		prev := qJump(h, 1)
		if prev != 0 {
			t.Fatalf("jump(%#x, 1) = %d, want 0", h, prev)
		}
		for n := 2; n <= 50; n++ {
			b := qJump(h, n)
			if b != prev && b != n-1 {
				t.Fatalf("jump(%#x, %d) = %d, was %d with %d buckets", h, n, b, prev, n-1)
			}
			prev = b
		}
	}
}

// qJump is the jump consistent hash of Lamping and Veach, "A Fast, Minimal
// Memory, Consistent Hash Algorithm" (2014, arXiv:1406.2294), figure 1, as
// in github.com/dgryski/go-jump, which Thanos (pkg/cacheutil) and grafana
// dskit (cache) use over an xxhash of the key and a sorted server list.
func qJump(key uint64, buckets int) int {
	b, j := int64(-1), int64(0)
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

// qModuloMoves counts exactly, over all 2^32 crc32 values, the keys that
// modulo hashing (gomemcache: servers[crc32(key) % len]) sends to another
// server when the list changes from before to after. It assumes the keys'
// checksums are uniform over the 2^32 values. h%len(before) and
// h%len(after) repeat with period lcm(len(before), len(after)), so one period
// is counted and weighted by how often it occurs below 2^32.
func qModuloMoves(before, after []string) qMoves {
	inBefore, inAfter := map[string]bool{}, map[string]bool{}
	for _, s := range before {
		inBefore[s] = true
	}
	for _, s := range after {
		inAfter[s] = true
	}
	n1, n2 := len(before), len(after)
	period := n1 / qGCD(n1, n2) * n2
	full, rest := (1<<32)/period, (1<<32)%period
	var moved, needless int
	for r := range period {
		x, y := before[r%n1], after[r%n2]
		if x == y {
			continue
		}
		w := full
		if r < rest {
			w++
		}
		moved += w
		if inAfter[x] && inBefore[y] {
			needless += w
		}
	}
	return qMoves{float64(moved) / (1 << 32), float64(needless) / (1 << 32)}
}

func qGCD(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// qNatCompare orders strings naturally, runs of digits as numbers, as the
// natsort.Sort that Thanos and dskit apply to their server lists.
func qNatCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := qDigits(a), qDigits(b)
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

func qDigits(s string) int {
	n := 0
	for n < len(s) && '0' <= s[n] && s[n] <= '9' {
		n++
	}
	return n
}

// qNode is a server as a routing scheme sees it: key is what the scheme
// hashes or sorts (ip:port, or a pod's hostname:port); pod is the server
// behind it, which decides whether a key moved.
type qNode struct{ key, pod string }

func qSame(ids []string) []qNode {
	ns := make([]qNode, len(ids))
	for i, id := range ids {
		ns[i] = qNode{id, id}
	}
	return ns
}

// qScheme is a routing scheme in the movement tables. prepare takes the
// servers before a change, in discovery order, and returns a function that
// measures the change to another list. Each scheme orders lists as its
// library does.
type qScheme struct {
	name, method string
	prepare      func(before []qNode) func(after []qNode) qMoves
}

// qRingScheme is a ring at the given points, keyed by the nodes' keys.
func qRingScheme(points int) func([]qNode) func([]qNode) qMoves {
	return func(before []qNode) func([]qNode) qMoves {
		a := qRing(qKeys(before), points)
		return func(after []qNode) qMoves {
			pods := map[string]string{}
			for _, n := range slices.Concat(before, after) {
				pods[n.key] = n.pod
			}
			b := qRing(qKeys(after), points)
			return qDiff(a, b, func(m member) string { return pods[m.id] })
		}
	}
}

func qKeys(ns []qNode) []string {
	keys := make([]string, len(ns))
	for i, n := range ns {
		keys[i] = n.key
	}
	return keys
}

// qPodsInOrder returns the pods of ns in the order of their keys: as given
// (order == nil), or sorted by order.
func qPodsInOrder(ns []qNode, order func(a, b string) int) []string {
	ns = slices.Clone(ns)
	if order != nil {
		slices.SortFunc(ns, func(a, b qNode) int { return order(a.key, b.key) })
	}
	pods := make([]string, len(ns))
	for i, n := range ns {
		pods[i] = n.pod
	}
	return pods
}

// qModuloScheme is crc32 % N over the list as given (order == nil) or sorted.
func qModuloScheme(order func(a, b string) int) func([]qNode) func([]qNode) qMoves {
	return func(before []qNode) func([]qNode) qMoves {
		a := qPodsInOrder(before, order)
		return func(after []qNode) qMoves {
			return qModuloMoves(a, qPodsInOrder(after, order))
		}
	}
}

// qJumpScheme is jump hashing of the xxhash of each sampled key over the
// list in natural order, as Thanos and dskit do.
func qJumpScheme(hashes []uint64) func([]qNode) func([]qNode) qMoves {
	return func(before []qNode) func([]qNode) qMoves {
		pods := map[string]int{} // pod -> number, to compare owners cheaply
		intern := func(ns []qNode) []int {
			ids := make([]int, len(ns))
			for i, p := range qPodsInOrder(ns, qNatCompare) {
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
			owners[i] = a[qJump(h, len(a))]
		}
		return func(after []qNode) qMoves {
			b := intern(after)
			inA, inB := make([]bool, len(pods)), make([]bool, len(pods))
			for _, p := range a {
				inA[p] = true
			}
			for _, p := range b {
				inB[p] = true
			}
			var moved, needless int
			for i, h := range hashes {
				x, y := owners[i], b[qJump(h, len(b))]
				if x != y {
					moved++
					if inB[x] && inA[y] {
						needless++
					}
				}
			}
			return qMoves{float64(moved) / float64(len(hashes)), float64(needless) / float64(len(hashes))}
		}
	}
}

// qSampleHashes returns the xxhash of n distinct keys shaped like benchKeys.
func qSampleHashes(n int) []uint64 {
	hs := make([]uint64, n)
	for i, k := range benchKeySet(rand.New(rand.NewPCG(9, 9)), n) {
		hs[i] = xxhash.Sum64String(k)
	}
	return hs
}

// qPod is a StatefulSet pod: a stable hostname, a changing IP.
type qPod struct{ host, ip string }

func qPods(n int, ids *qIDs) []qPod {
	pods := make([]qPod, n)
	for i := range pods {
		pods[i] = qPod{fmt.Sprintf("memcached-%d", i), strings.TrimSuffix(ids.next(), ":11211")}
	}
	return pods
}

// qPodMembers returns the members the watcher makes of pods: identity
// hostname:port, dialled at ip:port.
func qPodMembers(pods []qPod) []member {
	ms := make([]member, len(pods))
	for i, p := range pods {
		m, ok := newMember(p.ip, 11211, p.host)
		if !ok {
			panic("bad pod IP " + p.ip)
		}
		ms[i] = m
	}
	return ms
}

// qCase is one server list and the changes measured from it.
type qCase struct {
	before         []qNode
	adds, removals [][]qNode
}

// qStats aggregates the moved fractions of several changes.
type qStats struct {
	n                    int
	sum, worst, needless float64
}

func (s *qStats) add(m qMoves) {
	s.n++
	s.sum += m.moved
	s.worst = max(s.worst, m.moved)
	s.needless = max(s.needless, m.needless)
}

func (s qStats) mean() float64 { return s.sum / float64(s.n) }

// qSizes are the member counts of the report.
var qSizes = []int{3, 10, 30, 100, 1000}

// qBalanceSets is how many random member sets the report's balance figures
// average over at each size.
func qBalanceSets(n int) int {
	switch {
	case n <= 30:
		return 40
	case n <= 100:
		return 20
	}
	return 5
}

// qMovementCases returns the changes measured at n members: at least 20
// removals (every member of ceil(20/n) random sets up to 100 members, 20
// random members of one set beyond), 20 adds of a new random member, and
// the same on StatefulSet hostnames (adding ordinal n, removing any ordinal).
func qMovementCases(n int, gen *qIDs, rng *rand.Rand) (ipCases []qCase, stsCase qCase) {
	sets := max(1, (20+n-1)/n)
	for range sets {
		c := qCase{before: qSame(gen.list(n))}
		ipCases = append(ipCases, c)
	}
	removals := func(c *qCase) {
		victims := rng.Perm(n)
		if n > 100 {
			victims = victims[:20]
		}
		for _, k := range victims {
			c.removals = append(c.removals, slices.Delete(slices.Clone(c.before), k, k+1))
		}
	}
	for i := range ipCases {
		removals(&ipCases[i])
	}
	for a := range 20 {
		c := &ipCases[a%len(ipCases)]
		id := gen.next()
		c.adds = append(c.adds, append(slices.Clone(c.before), qNode{id, id}))
	}

	hosts := make([]string, n+1)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("memcached-%d:11211", i)
	}
	stsCase = qCase{before: qSame(hosts[:n]), adds: [][]qNode{qSame(hosts)}}
	removals(&stsCase)
	return ipCases, stsCase
}

// qSection is part of the report's body.
type qSection struct {
	w     io.Writer
	goals []reportGoal
	t     *testing.T
	start time.Time
}

func (s *qSection) logf(format string, args ...any) {
	s.t.Logf("%6.1fs "+format, append([]any{time.Since(s.start).Seconds()}, args...)...)
}

// qBalanceGoal returns the goal for the exact peak/mean share at n members
// at the default points, if there is one.
func qBalanceGoal(n int) (limit float64, ok bool) {
	switch {
	case n <= 10:
		return 1.05, true
	case n == 100:
		return 1.10, true
	}
	return 0, false
}

// balance writes the exact balance table.
func (s *qSection) balance() {
	fmt.Fprintf(s.w, "### Balance: exact key-space shares\n\n")
	fmt.Fprintf(s.w, "Each member's share of the 64-bit key space, computed from the ring's sorted points (arc lengths / 2^64), so there is no sampling noise. Random member sets of addresses 10.x.y.z:11211; mean and worst over the sets. %d points is the default; 160 is ketama's, for contrast.\n\n", DefaultPointsPerServer)
	var rows [][]string
	ids := newQIDs(10)
	for _, points := range []int{DefaultPointsPerServer, 160} {
		for _, n := range qSizes {
			sets := qBalanceSets(n)
			peak, worstPeak, low, worstLow := qBalance(ids, n, points, sets)
			goal := ""
			if limit, ok := qBalanceGoal(n); ok && points == DefaultPointsPerServer {
				goal = fmt.Sprintf("%s (≤ %.2f)", passMiss(peak <= limit), limit)
				s.goals = append(s.goals, reportGoal{
					fmt.Sprintf("Exact peak/mean ≤ %.2f at N = %d (mean over %d sets)", limit, n, sets),
					fmt.Sprintf("%.3f (worst set %.3f)", peak, worstPeak), peak <= limit})
			}
			rows = append(rows, []string{strconv.Itoa(n), strconv.Itoa(points), strconv.Itoa(sets),
				fmt.Sprintf("%.3f", peak), fmt.Sprintf("%.3f", worstPeak),
				fmt.Sprintf("%.3f", low), fmt.Sprintf("%.3f", worstLow), goal})
			s.logf("balance: %d members, %d points: peak/mean %.3f", n, points, peak)
		}
	}
	qTable(s.w, []string{"N", "points", "sets", "peak/mean", "worst peak/mean", "min/mean", "worst min/mean", "goal"}, rows)
}

// movement writes the movement table for the ring, modulo and jump hashing.
func (s *qSection) movement(hashes []uint64) {
	fmt.Fprintf(s.w, "### Keys moved when one member is added or removed\n\n")
	fmt.Fprintf(s.w, "Fraction of the keys that change server, against the ideal 1/(N+1) on add and 1/N on removal; the ratio is moved/ideal (mean, and worst in brackets). Removals: every member of ⌈20/N⌉ random sets up to N = 100, 20 random members at N = 1000; adds: 20 new random members. \"Between survivors\" is the largest fraction of keys moved between two servers present before and after (0 is minimal movement).\n\n")
	schemes := []qScheme{
		{fmt.Sprintf("ring, ours (%d points)", DefaultPointsPerServer), "exact: merged arcs", qRingScheme(DefaultPointsPerServer)},
		{"modulo, gomemcache ServerList (list order; add appends)", "exact: all 2^32 crc32 values", qModuloScheme(nil)},
		{"modulo, seed (Endpoints order, by IP; add at its place)", "exact: all 2^32 crc32 values", qModuloScheme(strings.Compare)},
		{"jump + xxhash over sorted IPs (Thanos/dskit dns+)", fmt.Sprintf("%d sampled keys", len(hashes)), qJumpScheme(hashes)},
	}
	stsJump := qScheme{"jump + xxhash over StatefulSet hostnames (dnssrvnoa+; add = next ordinal)", fmt.Sprintf("%d sampled keys", len(hashes)), qJumpScheme(hashes)}

	gen, rng := newQIDs(20), rand.New(rand.NewPCG(20, 1))
	type result struct {
		scheme   qScheme
		n        int
		add, rem qStats
	}
	var results []result
	for _, n := range qSizes {
		ipCases, stsCase := qMovementCases(n, gen, rng)
		measure := func(sc qScheme, cases []qCase) {
			r := result{scheme: sc, n: n}
			for _, c := range cases {
				f := sc.prepare(c.before)
				for _, after := range c.adds {
					r.add.add(f(after))
				}
				for _, after := range c.removals {
					r.rem.add(f(after))
				}
			}
			results = append(results, r)
			s.logf("movement: %s, %d members: add %.4f, remove %.4f", sc.name, n, r.add.mean(), r.rem.mean())
		}
		for _, sc := range schemes {
			measure(sc, ipCases)
		}
		measure(stsJump, []qCase{stsCase})
	}

	var rows [][]string
	lowRatio, highRatio := math.Inf(1), 0.0 // the ring's mean ratios
	for _, sc := range append(schemes, stsJump) {
		for _, r := range results {
			if r.scheme.name != sc.name {
				continue
			}
			addIdeal, rmIdeal := 1/float64(r.n+1), 1/float64(r.n)
			addRatio, rmRatio := r.add.mean()/addIdeal, r.rem.mean()/rmIdeal
			if r.scheme.name == schemes[0].name {
				lowRatio = min(lowRatio, addRatio, rmRatio)
				highRatio = max(highRatio, addRatio, rmRatio)
			}
			rows = append(rows, []string{sc.name, strconv.Itoa(r.n),
				fmt.Sprintf("%.4f (%.4f)", r.add.mean(), r.add.worst), fmt.Sprintf("%.4f", addIdeal),
				fmt.Sprintf("%s (%s)", qRatio(addRatio), qRatio(r.add.worst/addIdeal)), strconv.Itoa(r.add.n),
				fmt.Sprintf("%.4f (%.4f)", r.rem.mean(), r.rem.worst), fmt.Sprintf("%.4f", rmIdeal),
				fmt.Sprintf("%s (%s)", qRatio(rmRatio), qRatio(r.rem.worst/rmIdeal)), strconv.Itoa(r.rem.n),
				fmt.Sprintf("%.4f", max(r.add.needless, r.rem.needless)), sc.method})
		}
	}
	qTable(s.w, []string{"scheme", "N", "add: moved", "ideal", "ratio", "adds", "remove: moved", "ideal", "ratio", "removals", "between survivors", "method"}, rows)
	s.goals = append(s.goals, reportGoal{"Moved within 1.05x the ideal on add and on arbitrary removal (ring, mean over the trials at each N)",
		fmt.Sprintf("mean ratios %.3f to %.3f (N = 3 to 1000)", lowRatio, highRatio), highRatio <= 1.05 && lowRatio >= 1/1.05})
}

// qRatio formats a ratio to the ideal: two decimals near 1, fewer far off.
func qRatio(x float64) string {
	if x >= 9.995 { // would print as 10.00
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// restart writes the table of keys moved when a StatefulSet pod restarts
// with a new IP.
func (s *qSection) restart(hashes []uint64) {
	fmt.Fprintf(s.w, "### Keys moved when a StatefulSet pod restarts with a new IP\n\n")
	fmt.Fprintf(s.w, "A key moved if its pod changed (the restarted pod's own keys count as moved only if they went to another pod). Mean (worst) over 20 restarts of random pods. Ours identifies a StatefulSet pod by hostname:port and dials its current IP, measured through ServerList.update; the other schemes are keyed by IP:port as DNS A records or Endpoints IPs give them. Keyed by IP, a restart is a removal plus an add. Ring and modulo figures are exact, jump figures from %d sampled keys.\n\n", len(hashes))
	gen, rng := newQIDs(30), rand.New(rand.NewPCG(30, 1))
	ipNodes := func(pods []qPod) []qNode {
		ns := make([]qNode, len(pods))
		for i, p := range pods {
			ns[i] = qNode{p.ip + ":11211", p.host}
		}
		return ns
	}
	hostNodes := func(pods []qPod) []qNode {
		ns := make([]qNode, len(pods))
		for i, p := range pods {
			ns[i] = qNode{p.host + ":11211", p.host}
		}
		return ns
	}
	others := []struct {
		name  string
		nodes func([]qPod) []qNode
		f     func([]qNode) func([]qNode) qMoves
	}{
		{"ring keyed by IP", ipNodes, qRingScheme(DefaultPointsPerServer)},
		{"jump, sorted IPs (dns+)", ipNodes, qJumpScheme(hashes)},
		{"jump, sorted hostnames (dnssrvnoa+)", hostNodes, qJumpScheme(hashes)},
		{"modulo, seed (Endpoints order, by IP)", ipNodes, qModuloScheme(strings.Compare)},
	}
	var rows [][]string
	for _, n := range qSizes {
		pods := qPods(n, gen)
		ss := new(ServerList)
		ss.update(qPodMembers(pods))
		base := ss.ring.Load()
		measures := make([]func([]qNode) qMoves, len(others))
		for i, o := range others {
			measures[i] = o.f(o.nodes(pods))
		}
		ours := qStats{}
		stats := make([]qStats, len(others))
		for range 20 {
			after := slices.Clone(pods)
			k := rng.IntN(n)
			after[k].ip = strings.TrimSuffix(gen.next(), ":11211")
			ss.update(qPodMembers(after))
			ours.add(qDiff(base, ss.ring.Load(), byID))
			for i, o := range others {
				stats[i].add(measures[i](o.nodes(after)))
			}
		}
		row := []string{strconv.Itoa(n), fmt.Sprintf("%.4f (%.4f)", ours.mean(), ours.worst)}
		for _, st := range stats {
			row = append(row, fmt.Sprintf("%.4f (%.4f)", st.mean(), st.worst))
		}
		rows = append(rows, row)
		s.logf("restart: %d members: ours %.4f, IP-keyed ring %.4f", n, ours.mean(), stats[0].mean())
	}
	header := []string{"N", "ours (hostname identity)"}
	for _, o := range others {
		header = append(header, o.name)
	}
	qTable(s.w, header, rows)
}

// TestQualityReport writes BENCHMARKS.md: run by make bench, skipped
// otherwise.
func TestQualityReport(t *testing.T) {
	if *qualityReport == "" {
		t.Skip("writes the report only with -quality-report=FILE (make bench)")
	}
	start := time.Now()
	var body bytes.Buffer
	var goals []reportGoal

	if *qualityBench != "" {
		fmt.Fprintf(&body, "## Speed\n\n")
		g, err := benchSummary(&body, strings.Split(*qualityBench, ","))
		if err != nil {
			t.Fatal(err)
		}
		goals = append(goals, g...)
	}

	fmt.Fprintf(&body, "## Routing quality\n\n")
	s := &qSection{w: &body, t: t, start: start}
	s.balance()
	hashes := qSampleHashes(1 << 20)
	s.movement(hashes)
	s.restart(hashes)
	goals = append(goals, s.goals...)
	fmt.Fprintf(&body, "The routing-quality figures took %.0f s to compute.\n\n", time.Since(start).Seconds())

	if fi, err := os.Stat(*qualityE2E); err == nil {
		b, err := os.ReadFile(*qualityE2E)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&body, "## On a real control plane\n\nFrom `make bench-e2e` on %s: the e2e suite's convergence and rolling-restart scenarios, against kube-apiserver, kube-controller-manager and etcd v1.37.2 and real memcached servers on this machine.\n\n%s\n",
			fi.ModTime().UTC().Format("2006-01-02 15:04 MST"), b)
	}

	if b, err := os.ReadFile(*qualityBenchstat); err == nil && len(b) > 0 {
		fmt.Fprintf(&body, "## benchstat\n\nThe same runs summarized by benchstat: medians with 95%% confidence intervals; the PickServer columns compare ours against gomemcache.\n\n```\n%s```\n", b)
	} else if *qualityBench != "" {
		fmt.Fprintf(&body, "benchstat was not available for this run; the medians above are the report's own.\n")
	}

	var doc bytes.Buffer
	fmt.Fprintf(&doc, "# Benchmarks and routing quality\n\n")
	fmt.Fprintf(&doc, "Generated by `%s` on %s. Do not edit; rerun the command.\n\n", *qualityCommand, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&doc, "- CPU: %s\n", qCPU())
	fmt.Fprintf(&doc, "- Go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if b, err := os.ReadFile(*qualityLoad); err == nil && len(strings.Fields(string(b))) >= 3 {
		f := strings.Fields(string(b))
		fmt.Fprintf(&doc, "- Load average (1, 5, 15 min) before the benchmarks: %s. Other work on the machine inflates the timings and depresses the parallel scaling.\n", strings.Join(f[:3], ", "))
	}
	fmt.Fprintf(&doc, "- Ring: %d points per member (DefaultPointsPerServer), xxhash\n\n", DefaultPointsPerServer)
	fmt.Fprintf(&doc, "## Goals\n\n")
	var rows [][]string
	for _, g := range goals {
		rows = append(rows, []string{g.goal, g.measured, passMiss(g.pass)})
	}
	qTable(&doc, []string{"goal", "measured", "result"}, rows)
	doc.Write(body.Bytes())

	if err := os.WriteFile(*qualityReport, doc.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s in %.0f s", *qualityReport, time.Since(start).Seconds())
}

// qCPU returns the CPU model and the number of logical CPUs from /proc/cpuinfo.
func qCPU() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return fmt.Sprintf("unknown (%d logical CPUs)", runtime.NumCPU())
	}
	model, n := "unknown", 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		switch strings.TrimSpace(k) {
		case "processor":
			n++
		case "model name":
			if ok {
				model = strings.TrimSpace(v)
			}
		}
	}
	return fmt.Sprintf("%s, %d logical CPUs (/proc/cpuinfo)", model, n)
}
