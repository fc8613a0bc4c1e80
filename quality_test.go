package selector

// Routing quality, measured exactly.
//
// A ring sends a key hash to the first point at or after it, wrapping
// around, so each point owns the arc from the previous point (exclusive) to
// itself (inclusive), and a member's share of the keys is the length of its
// arcs over 2^64. No keys are sampled. Two rings compare the same way: both
// are constant between consecutive points of either ring, so walking the
// merge of their points gives exactly the keys that change owner.
//
// qShares and qDiff are the seam to the ring's internals: the only
// functions here that read its points, besides TestQualityShares, which
// checks them against the real lookup. TestQualityMeasure checks balance and
// movement against the goals at a few sizes. make bench runs it with
// -quality-json=FILE: it then measures at the report's sizes and writes the
// figures, with the scenarios they were measured on, to FILE (see
// internal/quality), from which internal/benchreport writes BENCHMARKS.md.
//
// Identifiers here start with q to stay clear of the ring and selector tests.

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/quality"
)

var qualityJSON = flag.String("quality-json", "", "measure at the report's sizes and write the figures to this JSON `file` for internal/benchreport (make bench)")

// qShares returns each member's exact share of the key space, by id: the
// fraction of the slots it owns, since every slot is the same width.
func qShares(r *ring) map[string]float64 {
	counts := make([]int, len(r.members))
	for s := range uint64(1 << slotBits) {
		o := r.slotOwner(s)
		counts[o]++
	}
	shares := make(map[string]float64, len(counts))
	for i, c := range counts {
		shares[r.members[i].id] = float64(c) / (1 << slotBits)
	}
	return shares
}

// qDiff compares exactly the owner of every key hash under rings a and b,
// slot by slot, and returns the fraction of the keys whose owner changed,
// and of those the fraction that moved between two owners present in both.
// owner names the owner of a member: its id, or the pod behind an IP.
func qDiff(a, b *ring, owner func(member) string) (moved, needless float64) {
	names := func(ms []member) ([]string, map[string]bool) {
		ns, in := make([]string, len(ms)), map[string]bool{}
		for i, m := range ms {
			ns[i] = owner(m)
			in[ns[i]] = true
		}
		return ns, in
	}
	na, inA := names(a.members)
	nb, inB := names(b.members)
	var mv, nl int
	for s := range uint64(1 << slotBits) {
		oa := a.slotOwner(s)
		ob := b.slotOwner(s)
		pa, pb := na[oa], nb[ob]
		if pa != pb {
			mv++
			if inB[pa] && inA[pb] {
				nl++
			}
		}
	}
	return float64(mv) / (1 << slotBits), float64(nl) / (1 << slotBits)
}

func byID(m member) string { return m.id }

// qRing builds the ring that SetServers would build for ids.
func qRing(ids []string, points int) *ring { return newRing(canonical(members(ids...)), points) }

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

// qualitySize is a member count that TestQualityMeasure measures, and how
// much.
type qualitySize struct {
	n        int
	sets     int     // random member sets for the balance figures
	maxPeak  float64 // the goal for the busiest member's share over the mean, averaged over the sets; 0 if none
	removals int     // of one member: every member of a random set in random order, then of another set
	adds     int     // of one new random member, to each set in turn
	restarts int     // of one random StatefulSet pod with a new IP
}

var (
	qTestSizes = []qualitySize{
		{n: 3, sets: 20, maxPeak: 1.05, removals: 6, adds: 6, restarts: 3},
		{n: 10, sets: 20, maxPeak: 1.05, removals: 10, adds: 8, restarts: 3},
		{n: 100, sets: 3, maxPeak: 1.10, removals: 8, adds: 8, restarts: 3},
	}
	// qReportSizes are those of BENCHMARKS.md.
	qReportSizes = []qualitySize{
		{n: 3, sets: 40, maxPeak: 1.05, removals: 21, adds: 20, restarts: 20},
		{n: 10, sets: 40, maxPeak: 1.05, removals: 20, adds: 20, restarts: 20},
		{n: 30, sets: 40, removals: 30, adds: 20, restarts: 20},
		{n: 100, sets: 20, maxPeak: 1.10, removals: 100, adds: 20, restarts: 20},
		{n: 1000, sets: 5, maxPeak: 1.10, removals: 20, adds: 20, restarts: 20},
		{n: 10000, sets: 2, removals: 4, adds: 4, restarts: 4},
	}
)

// qMoveGoal bounds moved/ideal, on average at each size: ideal is 1/N of
// the keys on a removal and 1/(N+1) on an add.
const qMoveGoal = 1.05

// TestQualityMeasure measures the ring's balance, the keys moved when a
// member comes or goes, and the keys moved when a StatefulSet pod restarts
// with a new IP, and checks them against the goals. With -quality-json it
// measures at the report's sizes, also at ketama's 160 points for contrast,
// and writes the figures: it then checks only the exact properties (no key
// moves needlessly, and what moves is exactly the member's share), and the
// report says how the statistical figures, which vary with the member sets
// drawn, fare against their goals.
func TestQualityMeasure(t *testing.T) {
	start := time.Now()
	sizes, points := qTestSizes, []int{DefaultPointsPerServer}
	report := *qualityJSON != ""
	if report {
		sizes, points = qReportSizes, []int{DefaultPointsPerServer, 160}
	}
	f := quality.Figures{
		Points:   DefaultPointsPerServer,
		PickKeys: quality.PickKeys{Count: len(benchKeys), Example: benchKeys[0]},
		MoveGoal: qMoveGoal,
	}

	ids := newQIDs(10)
	for _, p := range points {
		for _, sz := range sizes {
			t.Run(fmt.Sprintf("balance/points=%d/N=%d", p, sz.n), func(t *testing.T) {
				b := qBalance(ids, sz.n, p, sz.sets)
				if p == DefaultPointsPerServer && sz.maxPeak != 0 {
					b.Goal = sz.maxPeak
					if !report {
						assert.LessOrEqual(t, b.Peak, b.Goal, "exact peak/mean share averaged over %d sets", sz.sets)
					}
				}
				t.Logf("%.1fs: peak/mean %.4f (worst %.4f), min/mean %.4f", time.Since(start).Seconds(), b.Peak, b.WorstPeak, b.Low)
				f.Balance = append(f.Balance, b)
			})
		}
	}
	gen, rng := newQIDs(20), rand.New(rand.NewPCG(20, 1))
	for _, sz := range sizes {
		t.Run(fmt.Sprintf("movement/N=%d", sz.n), func(t *testing.T) {
			m := qMovement(t, sz, gen, rng, !report)
			t.Logf("%.1fs: removal moved %.4f (ideal %.4f), adding moved %.4f (ideal %.4f)",
				time.Since(start).Seconds(), m.Remove.Mean(), 1/float64(sz.n), m.Add.Mean(), 1/float64(sz.n+1))
			f.Movement = append(f.Movement, m)
		})
	}
	gen, rng = newQIDs(30), rand.New(rand.NewPCG(30, 1))
	for _, sz := range sizes {
		t.Run(fmt.Sprintf("restart/N=%d", sz.n), func(t *testing.T) {
			r := qRestart(t, sz, gen, rng)
			t.Logf("%.1fs: moved %.4f, keyed by IP %.4f", time.Since(start).Seconds(), r.Ours.Mean(), r.RingByIP.Mean())
			f.Restart = append(f.Restart, r)
		})
	}
	f.Seconds = time.Since(start).Seconds()

	if *qualityJSON == "" || t.Failed() {
		return
	}
	b, err := json.MarshalIndent(f, "", "\t")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(*qualityJSON, append(b, '\n'), 0o644))
}

// qBalance measures the exact balance of sets random rings of n members.
func qBalance(ids *qIDs, n, points, sets int) quality.Balance {
	b := quality.Balance{N: n, Points: points, Sets: sets, WorstLow: math.Inf(1)}
	mean := 1 / float64(n)
	for range sets {
		shares := slices.Collect(maps.Values(qShares(qRing(ids.list(n), points))))
		peak, low := slices.Max(shares)/mean, slices.Min(shares)/mean
		b.Peak += peak / float64(sets)
		b.Low += low / float64(sets)
		b.WorstPeak, b.WorstLow = max(b.WorstPeak, peak), min(b.WorstLow, low)
	}
	return b
}

// qMovement removes and adds one member at a time at sz.n members, and
// checks that only the keys of the member removed or added move, exactly,
// and, if checkMean, that the moved fraction averages within qMoveGoal of
// the ideal.
func qMovement(t *testing.T, sz qualitySize, gen *qIDs, rng *rand.Rand, checkMean bool) quality.Movement {
	m := quality.Movement{N: sz.n, Sets: make([]quality.Set, max(1, (sz.removals+sz.n-1)/sz.n))}
	for i := range m.Sets {
		m.Sets[i].Members = gen.list(sz.n)
	}
	left := sz.removals
	for i := range m.Sets {
		m.Sets[i].Removed = rng.Perm(sz.n)[:min(left, sz.n)]
		left -= len(m.Sets[i].Removed)
	}
	for a := range sz.adds {
		s := &m.Sets[a%len(m.Sets)]
		s.Added = append(s.Added, gen.next())
	}

	for _, s := range m.Sets {
		base := qRing(s.Members, DefaultPointsPerServer)
		shares := qShares(base)
		for _, k := range s.Removed {
			gone := s.Members[k]
			moved, needless := qDiff(base, qRing(slices.Delete(slices.Clone(s.Members), k, k+1), DefaultPointsPerServer), byID)
			assert.Zero(t, needless, "removing %s: fraction of the keys moved between survivors", gone)
			assert.InDelta(t, shares[gone], moved, 1e-12, "removing %s: moved, against its share", gone)
			m.Remove.Add(moved, needless)
		}
		for _, id := range s.Added {
			after := qRing(append(slices.Clone(s.Members), id), DefaultPointsPerServer)
			moved, needless := qDiff(base, after, byID)
			assert.Zero(t, needless, "adding %s: fraction of the keys moved between old members", id)
			assert.InDelta(t, qShares(after)[id], moved, 1e-12, "adding %s: moved, against its share", id)
			m.Add.Add(moved, needless)
		}
	}
	for _, c := range []struct {
		change string
		ratio  float64
	}{
		{"removal", m.Remove.Mean() * float64(sz.n)},
		{"add", m.Add.Mean() * float64(sz.n+1)},
	} {
		if checkMean {
			assert.LessOrEqual(t, c.ratio, qMoveGoal, "%s: mean moved/ideal", c.change)
			assert.GreaterOrEqual(t, c.ratio, 1/qMoveGoal, "%s: mean moved/ideal", c.change)
		}
	}
	return m
}

// qRestart restarts one random pod of a StatefulSet of sz.n pods at a time
// with a new IP, through ServerList.update, and checks that no key moves and
// that the pod is dialled at its new IP. For contrast it measures a ring
// keyed by IP, as DNS A records or Endpoints IPs would give.
func qRestart(t *testing.T, sz qualitySize, gen *qIDs, rng *rand.Rand) quality.Restart {
	r := quality.Restart{N: sz.n, Pods: make([]quality.Pod, sz.n)}
	for i := range r.Pods {
		r.Pods[i] = quality.Pod{Host: fmt.Sprintf("memcached-%d", i), IP: strings.TrimSuffix(gen.next(), ":11211")}
	}
	ss := new(ServerList)
	ss.update(qPodMembers(t, r.Pods))
	base := ss.ring.Load()
	byIP := qRing(qPodIPs(r.Pods), DefaultPointsPerServer)
	for range sz.restarts {
		after := slices.Clone(r.Pods)
		k := rng.IntN(sz.n)
		after[k].IP = strings.TrimSuffix(gen.next(), ":11211")
		r.Restarts = append(r.Restarts, quality.PodRestart{Pod: k, IP: after[k].IP})

		ss.update(qPodMembers(t, after))
		now := ss.ring.Load()
		moved, needless := qDiff(base, now, byID)
		assert.Zero(t, moved, "restart of %s at %s: fraction of the keys moved", after[k].Host, after[k].IP)
		i := slices.IndexFunc(now.members, func(m member) bool { return m.id == after[k].Host+":11211" })
		require.GreaterOrEqual(t, i, 0, "%s is not a member", after[k].Host)
		assert.Equal(t, after[k].IP+":11211", now.members[i].addr.String(), "%s dials", after[k].Host)
		r.Ours.Add(moved, needless)

		pod := map[string]string{} // ip:port -> host, before and after
		for _, p := range slices.Concat(r.Pods, after) {
			pod[p.IP+":11211"] = p.Host
		}
		r.RingByIP.Add(qDiff(byIP, qRing(qPodIPs(after), DefaultPointsPerServer), func(m member) string { return pod[m.id] }))
	}
	return r
}

// qPodMembers returns the members the watcher makes of pods: identity
// hostname:port, dialled at ip:port (internal/discovery's tests pin that
// rule).
func qPodMembers(t *testing.T, pods []quality.Pod) []member {
	ms := make([]member, len(pods))
	for i, p := range pods {
		ap, err := netip.ParseAddrPort(net.JoinHostPort(p.IP, "11211"))
		require.NoError(t, err, "pod IP %s", p.IP)
		ms[i] = member{id: p.Host + ":11211", addr: &staticAddr{network: "tcp", str: ap.String()}}
	}
	return ms
}

func qPodIPs(pods []quality.Pod) []string {
	ids := make([]string, len(pods))
	for i, p := range pods {
		ids[i] = p.IP + ":11211"
	}
	return ids
}

// TestQualityShares checks the exact shares against the real lookup: they
// sum to one, both ends of every arc are picked as its owner, and sampled
// keys through PickServer land in proportion to the shares.
func TestQualityShares(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers(newQIDs(2).list(10)...))
	r := ss.ring.Load()
	shares := qShares(r)
	var sum float64
	for _, s := range shares {
		sum += s
	}
	require.InDelta(t, 1, sum, 1e-12, "sum of the shares")

	for _, slot := range []uint64{0, 1, 12345, 1<<slotBits - 1} {
		o := r.slotOwner(slot)
		want := &r.members[o]
		require.Same(t, want, r.pick(slot<<(64-slotBits)), "pick of the first hash of slot %d", slot)
		require.Same(t, want, r.pick((slot+1)<<(64-slotBits)-1), "pick of the last hash of slot %d", slot)
	}

	const keys = 200000
	counts := map[string]int{}
	for i := range keys {
		a, err := ss.PickServer(fmt.Sprintf("key:%d", i))
		require.NoError(t, err)
		counts[a.String()]++
	}
	for _, m := range r.members {
		share := shares[m.id]
		sigma := math.Sqrt(share * (1 - share) / keys)
		assert.InDelta(t, share, float64(counts[m.addr.String()])/keys, 5*sigma, "%s: fraction of the sampled keys, against its exact share (5 sigma)", m.id)
	}
}
