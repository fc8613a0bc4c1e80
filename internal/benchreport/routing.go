package main

// The routing-quality tables: the ring's figures from TestQualityMeasure,
// and the other schemes measured here on the same changes.

import (
	"bytes"
	"fmt"
	"log"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/quality"
)

// sampledKeys is how many keys the jump hashing figures sample.
const sampledKeys = 1 << 20

// routing writes the balance, movement and restart tables, and returns the
// goals they check.
func routing(w *bytes.Buffer, fig quality.Figures) []goal {
	start := time.Now()
	logf := func(format string, args ...any) {
		log.Printf("%6.1fs "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
	goals := balance(w, fig)
	hashes := sampleHashes(sampledKeys)
	goals = append(goals, movement(w, fig, hashes, logf))
	restart(w, fig, hashes, logf)
	return goals
}

// balance writes the exact balance table.
func balance(w *bytes.Buffer, fig quality.Figures) []goal {
	fmt.Fprintf(w, "### Balance: exact key-space shares\n\n")
	fmt.Fprintf(w, "Each member's share of the 64-bit key space, computed from the ring's slot table (the slots a member owns / 2^20: every key hash in a slot goes to its owner), so there is no sampling of keys. Random member sets of addresses 10.x.y.z:11211; mean and worst over the sets. %d points is the default", fig.Points)
	if slices.ContainsFunc(fig.Balance, func(b quality.Balance) bool { return b.Points == 160 }) {
		fmt.Fprintf(w, "; 160 is ketama's, for contrast")
	}
	fmt.Fprintf(w, ".\n\n")
	var rows [][]string
	var goals []goal
	for _, b := range fig.Balance {
		cell := ""
		if b.Goal != 0 {
			cell = fmt.Sprintf("%s (≤ %.2f)", passMiss(b.Peak <= b.Goal), b.Goal)
			goals = append(goals, goal{
				fmt.Sprintf("Exact peak/mean ≤ %.2f at N = %d (mean over %d sets)", b.Goal, b.N, b.Sets),
				fmt.Sprintf("%.3f (worst set %.3f)", b.Peak, b.WorstPeak), b.Peak <= b.Goal})
		}
		rows = append(rows, []string{strconv.Itoa(b.N), strconv.Itoa(b.Points), strconv.Itoa(b.Sets),
			fmt.Sprintf("%.3f", b.Peak), fmt.Sprintf("%.3f", b.WorstPeak),
			fmt.Sprintf("%.3f", b.Low), fmt.Sprintf("%.3f", b.WorstLow), cell})
	}
	table(w, []string{"N", "points", "sets", "peak/mean", "worst peak/mean", "min/mean", "worst min/mean", "goal"}, rows)
	return goals
}

// movement writes the movement table for the ring, modulo and jump hashing.
func movement(w *bytes.Buffer, fig quality.Figures, hashes []uint64, logf func(string, ...any)) goal {
	fmt.Fprintf(w, "### Keys moved when one member is added or removed\n\n")
	fmt.Fprintf(w, "Fraction of the keys that change server, against the ideal 1/(N+1) on add and 1/N on removal; the ratio is moved/ideal (mean, and worst in brackets). Removals take every member of a random set in turn, then of another set; adds add a new random member to each set in turn; the adds and removals columns count them. \"Between survivors\" is the largest fraction of keys moved between two servers present before and after (0 is minimal movement).\n\n")
	ring := fmt.Sprintf("ring, ours (%d points)", fig.Points)
	schemes := []scheme{
		{"modulo, gomemcache ServerList (list order; add appends)", "exact: all 2^32 crc32 values", moduloScheme(nil)},
		{"modulo, seed (Endpoints order, by IP; add at its place)", "exact: all 2^32 crc32 values", moduloScheme(strings.Compare)},
		{"jump + xxhash over sorted IPs (Thanos/dskit dns+)", fmt.Sprintf("%d sampled keys", len(hashes)), jumpScheme(hashes)},
	}
	sts := scheme{"jump + xxhash over StatefulSet hostnames (dnssrvnoa+; add = next ordinal)", fmt.Sprintf("%d sampled keys", len(hashes)), jumpScheme(hashes)}

	type result struct{ add, rem quality.Stats }
	results := map[string][]result{} // scheme -> one per size
	for _, m := range fig.Movement {
		results[ring] = append(results[ring], result{m.Add, m.Remove})
		for _, sc := range schemes {
			var r result
			for _, s := range m.Sets {
				f := sc.prepare(same(s.Members))
				for _, id := range s.Added {
					r.add.Add(f(append(same(s.Members), node{id, id})))
				}
				for _, k := range s.Removed {
					r.rem.Add(f(slices.Delete(same(s.Members), k, k+1)))
				}
			}
			results[sc.name] = append(results[sc.name], r)
			logf("movement: %s, %d members: add %.4f, remove %.4f", sc.name, m.N, r.add.Mean(), r.rem.Mean())
		}

		// A StatefulSet adds the next ordinal; it loses the ordinals that
		// the first set lost.
		hosts := make([]string, m.N+1)
		for i := range hosts {
			hosts[i] = fmt.Sprintf("memcached-%d:11211", i)
		}
		var r result
		f := sts.prepare(same(hosts[:m.N]))
		r.add.Add(f(same(hosts)))
		for _, k := range m.Sets[0].Removed {
			r.rem.Add(f(slices.Delete(same(hosts[:m.N]), k, k+1)))
		}
		results[sts.name] = append(results[sts.name], r)
		logf("movement: %s, %d members: add %.4f, remove %.4f", sts.name, m.N, r.add.Mean(), r.rem.Mean())
	}

	var rows [][]string
	low, high := math.Inf(1), 0.0 // the ring's mean ratios
	for _, sc := range append([]scheme{{name: ring, method: "exact: slot by slot"}}, append(schemes, sts)...) {
		for i, r := range results[sc.name] {
			n := fig.Movement[i].N
			addIdeal, rmIdeal := 1/float64(n+1), 1/float64(n)
			addRatio, rmRatio := r.add.Mean()/addIdeal, r.rem.Mean()/rmIdeal
			if sc.name == ring && n <= movementGoalMax {
				low, high = min(low, addRatio, rmRatio), max(high, addRatio, rmRatio)
			}
			rows = append(rows, []string{sc.name, strconv.Itoa(n),
				fmt.Sprintf("%.4f (%.4f)", r.add.Mean(), r.add.Worst), fmt.Sprintf("%.4f", addIdeal),
				fmt.Sprintf("%s (%s)", ratio(addRatio), ratio(r.add.Worst/addIdeal)), strconv.Itoa(r.add.Count),
				fmt.Sprintf("%.4f (%.4f)", r.rem.Mean(), r.rem.Worst), fmt.Sprintf("%.4f", rmIdeal),
				fmt.Sprintf("%s (%s)", ratio(rmRatio), ratio(r.rem.Worst/rmIdeal)), strconv.Itoa(r.rem.Count),
				fmt.Sprintf("%.4f", max(r.add.Needless, r.rem.Needless)), sc.method})
		}
	}
	table(w, []string{"scheme", "N", "add: moved", "ideal", "ratio", "adds", "remove: moved", "ideal", "ratio", "removals", "between survivors", "method"}, rows)
	return goal{fmt.Sprintf("Moved within %.2fx the ideal on add and on arbitrary removal (ring, mean over the trials at each N up to %d; beyond, the few trials are reported)", fig.MoveGoal, movementGoalMax),
		fmt.Sprintf("mean ratios %.3f to %.3f (N = %d to %d)", low, high, fig.Movement[0].N, movementGoalMax), high <= fig.MoveGoal && low >= 1/fig.MoveGoal}
}

// movementGoalMax is the largest N the movement goal covers: at 10,000
// servers a few trials of removing one say little about the mean, since
// shares vary by a tenth.
const movementGoalMax = 1000

// ratio formats a ratio to the ideal: two decimals near 1, fewer far off.
func ratio(x float64) string {
	if x >= 9.995 { // would print as 10.00
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// restart writes the table of keys moved when a StatefulSet pod restarts
// with a new IP.
func restart(w *bytes.Buffer, fig quality.Figures, hashes []uint64, logf func(string, ...any)) {
	fmt.Fprintf(w, "### Keys moved when a StatefulSet pod restarts with a new IP\n\n")
	fmt.Fprintf(w, "A key moved if its pod changed (the restarted pod's own keys count as moved only if they went to another pod). Mean (worst) over %d restarts of random pods. Ours identifies a StatefulSet pod by hostname:port and dials its current IP, measured through ServerList.update; the other schemes are keyed by IP:port as DNS A records or Endpoints IPs give them. Keyed by IP, a restart is a removal plus an add. Ring and modulo figures are exact, jump figures from %d sampled keys.\n\n", len(fig.Restart[0].Restarts), len(hashes))
	ipNodes := func(pods []quality.Pod) []node {
		ns := make([]node, len(pods))
		for i, p := range pods {
			ns[i] = node{p.IP + ":11211", p.Host}
		}
		return ns
	}
	hostNodes := func(pods []quality.Pod) []node {
		ns := make([]node, len(pods))
		for i, p := range pods {
			ns[i] = node{p.Host + ":11211", p.Host}
		}
		return ns
	}
	others := []struct {
		name  string
		nodes func([]quality.Pod) []node
		f     func([]node) measure
	}{
		{"jump, sorted IPs (dns+)", ipNodes, jumpScheme(hashes)},
		{"jump, sorted hostnames (dnssrvnoa+)", hostNodes, jumpScheme(hashes)},
		{"modulo, seed (Endpoints order, by IP)", ipNodes, moduloScheme(strings.Compare)},
	}
	var rows [][]string
	for _, r := range fig.Restart {
		stats := make([]quality.Stats, len(others))
		for i, o := range others {
			f := o.f(o.nodes(r.Pods))
			for _, rs := range r.Restarts {
				after := slices.Clone(r.Pods)
				after[rs.Pod].IP = rs.IP
				stats[i].Add(f(o.nodes(after)))
			}
		}
		row := []string{strconv.Itoa(r.N)}
		for _, st := range append([]quality.Stats{r.Ours, r.RingByIP}, stats...) {
			row = append(row, fmt.Sprintf("%.4f (%.4f)", st.Mean(), st.Worst))
		}
		rows = append(rows, row)
		logf("restart: %d members: ours %.4f, IP-keyed ring %.4f", r.N, r.Ours.Mean(), r.RingByIP.Mean())
	}
	header := []string{"N", "ours (hostname identity)", "ring keyed by IP"}
	for _, o := range others {
		header = append(header, o.name)
	}
	table(w, header, rows)
}
