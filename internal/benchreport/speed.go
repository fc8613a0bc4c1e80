package main

// The speed tables: medians of go test -bench output of BenchmarkPickServer,
// BenchmarkPickServerParallel and BenchmarkRebuild (bench_test.go).

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kubecache/k8s-memcache-selector/internal/quality"
)

// Performance goals.
const (
	goalPickRatio      = 0.30  // PickServer time at most this times gomemcache's, up to goalPickLarge servers
	goalPickLarge      = 1000  // beyond which the goal is goalPickRatioLarge
	goalPickRatioLarge = 0.5   //
	goalParallelSpeed  = 1.8   // throughput with 2 CPUs at least this times that with 1
	goalRebuildMembers = 1000  // the rebuild goals are at this many members
	goalRebuildSeconds = 0.030 // rebuild time
	goalRebuildBytes   = 4e6   // retained by the ring
)

// pickGoal returns the PickServer goal at n servers.
func pickGoal(n int) float64 {
	if n > goalPickLarge {
		return goalPickRatioLarge
	}
	return goalPickRatio
}

// benchResults holds the samples of go test -bench output:
// benchmark name (without the -cpu suffix) -> GOMAXPROCS -> unit -> values.
type benchResults map[string]map[int]map[string][]float64

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-(\d+))?\s+\d+\s+(.+)$`)

// parseBench reads the benchmark lines of go test -bench output into res.
func parseBench(r io.Reader, res benchResults) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		procs := 1
		if m[2] != "" {
			procs, _ = strconv.Atoi(m[2])
		}
		if res[m[1]] == nil {
			res[m[1]] = map[int]map[string][]float64{}
		}
		if res[m[1]][procs] == nil {
			res[m[1]][procs] = map[string][]float64{}
		}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("bad benchmark line %q: %v", sc.Text(), err)
			}
			res[m[1]][procs][f[i+1]] = append(res[m[1]][procs][f[i+1]], v)
		}
	}
	return sc.Err()
}

// median returns the median of the samples of a benchmark in a unit, and
// false if there are none.
func (res benchResults) median(name string, procs int, unit string) (float64, bool) {
	vs := res[name][procs][unit]
	if len(vs) == 0 {
		return 0, false
	}
	return medianOf(vs), true
}

// medianOf returns the median of vs, which must not be empty.
func medianOf(vs []float64) float64 {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

func (res benchResults) count(name string, procs int) int {
	return len(res[name][procs]["ns/op"])
}

// sizes returns, in order, the values of param in the names of the results
// of the benchmarks: 3 and 10 for BenchmarkPickServer/servers=3/impl=ours
// and BenchmarkPickServer/servers=10/impl=ours.
func (res benchResults) sizes(param string, benchmarks ...string) []int {
	var ns []int
	for name := range res {
		for _, b := range benchmarks {
			rest, ok := strings.CutPrefix(name, b+"/"+param+"=")
			if !ok {
				continue
			}
			v, _, _ := strings.Cut(rest, "/")
			if n, err := strconv.Atoi(v); err == nil && !slices.Contains(ns, n) {
				ns = append(ns, n)
			}
		}
	}
	slices.Sort(ns)
	return ns
}

// speed writes the PickServer and rebuild tables from go test -bench output
// files, and checks the performance goals.
func speed(w *bytes.Buffer, files []string, fig quality.Figures) ([]goal, error) {
	res := benchResults{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		err = parseBench(f, res)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no benchmark results in %v", files)
	}
	goals := res.pickTable(w, fig.PickKeys)
	goals = append(goals, res.scalingTable(w)...)
	return append(goals, res.rebuildTable(w, fig.Points)...), nil
}

// pickTable compares ours with gomemcache per size, mode and CPU count.
func (res benchResults) pickTable(w *bytes.Buffer, keys quality.PickKeys) []goal {
	fmt.Fprintf(w, "### PickServer: ours against gomemcache's ServerList\n\n")
	fmt.Fprintf(w, "Median of the runs (n = runs per row). make bench runs every benchmark once per round and repeats the rounds, so ours and gomemcache are measured seconds apart and other work on the machine slows both alike. Serial is one goroutine on 1 CPU; parallel is b.RunParallel with one goroutine per CPU (-cpu 1,2), so its ns/op is wall time per operation across all CPUs. Both selectors are called through the memcache.ServerSelector interface, as memcache.Client calls them. Keys: %d fixed keys such as %q, cycled, the same for both; servers 10.0.0.1:11211 and up.\n\n", keys.Count, keys.Example)
	var rows [][]string
	worstRatio, worstAt, worstGoal := 0.0, "", 0.0
	maxAllocs := 0.0
	for _, n := range res.sizes("servers", "BenchmarkPickServer", "BenchmarkPickServerParallel") {
		for _, mode := range []string{"serial", "parallel"} {
			bench := "BenchmarkPickServer"
			if mode == "parallel" {
				bench += "Parallel"
			}
			for _, procs := range []int{1, 2} {
				ours := fmt.Sprintf("%s/servers=%d/impl=ours", bench, n)
				theirs := fmt.Sprintf("%s/servers=%d/impl=gomemcache", bench, n)
				o, ok1 := res.median(ours, procs, "ns/op")
				g, ok2 := res.median(theirs, procs, "ns/op")
				if !ok1 || !ok2 {
					continue
				}
				oa, _ := res.median(ours, procs, "allocs/op")
				ga, _ := res.median(theirs, procs, "allocs/op")
				ratio := o / g
				if ratio/pickGoal(n) > worstRatio/max(worstGoal, 1e-9) {
					worstRatio, worstAt, worstGoal = ratio, fmt.Sprintf("%d servers, %s, %d CPU", n, mode, procs), pickGoal(n)
				}
				maxAllocs = max(maxAllocs, oa)
				rows = append(rows, []string{
					strconv.Itoa(n), mode, strconv.Itoa(procs),
					fmt.Sprintf("%.1f", o), fmt.Sprintf("%.1f", g), fmt.Sprintf("%.2f", ratio),
					fmt.Sprintf("%g", oa), fmt.Sprintf("%g", ga),
					strconv.Itoa(min(res.count(ours, procs), res.count(theirs, procs))),
					fmt.Sprintf("%s (≤ %gx)", passMiss(ratio <= pickGoal(n) && oa == 0), pickGoal(n)),
				})
			}
		}
	}
	table(w, []string{"servers", "mode", "CPUs", "ours ns/op", "gomemcache ns/op", "ours/gomemcache", "ours allocs/op", "gomemcache allocs/op", "n", "goal, and 0 allocs"}, rows)
	if worstAt == "" {
		return nil
	}
	return []goal{
		{fmt.Sprintf("PickServer ≤ %gx gomemcache up to %d servers and ≤ %gx beyond (serial; parallel on 1 and 2 CPUs)", goalPickRatio, goalPickLarge, goalPickRatioLarge),
			fmt.Sprintf("worst against its goal %.2fx (%s)", worstRatio, worstAt), worstRatio <= worstGoal},
		{"PickServer 0 allocs/op", fmt.Sprintf("max %g allocs/op", maxAllocs), maxAllocs == 0},
	}
}

// scalingTable shows the parallel throughput with 2 CPUs over that with 1.
func (res benchResults) scalingTable(w *bytes.Buffer) []goal {
	fmt.Fprintf(w, "### PickServer parallel scaling\n\nSpeedup = ns/op with 1 CPU / ns/op with 2 CPUs (b.RunParallel, -cpu 1,2); 2.0 is perfect.\n\n")
	var rows [][]string
	worst, worstAt := 0.0, ""
	for _, n := range res.sizes("servers", "BenchmarkPickServerParallel") {
		row := []string{strconv.Itoa(n)}
		var ours float64
		for _, impl := range []string{"ours", "gomemcache"} {
			name := fmt.Sprintf("BenchmarkPickServerParallel/servers=%d/impl=%s", n, impl)
			one, ok1 := res.median(name, 1, "ns/op")
			two, ok2 := res.median(name, 2, "ns/op")
			if !ok1 || !ok2 {
				row = append(row, "-", "-", "-")
				continue
			}
			row = append(row, fmt.Sprintf("%.1f", one), fmt.Sprintf("%.1f", two), fmt.Sprintf("%.2f", one/two))
			if impl == "ours" {
				ours = one / two
				if worstAt == "" || ours < worst {
					worst, worstAt = ours, fmt.Sprintf("%d servers", n)
				}
			}
		}
		rows = append(rows, append(row, passMiss(ours >= goalParallelSpeed)))
	}
	table(w, []string{"servers", "ours 1 CPU ns/op", "ours 2 CPUs ns/op", "ours speedup", "gomemcache 1 CPU ns/op", "gomemcache 2 CPUs ns/op", "gomemcache speedup", fmt.Sprintf("goal ours ≥%gx", goalParallelSpeed)}, rows)
	if worstAt == "" {
		return nil
	}
	return []goal{{fmt.Sprintf("PickServer parallel: 2 CPUs ≥ %gx the 1-CPU throughput", goalParallelSpeed),
		fmt.Sprintf("worst %.2fx (%s)", worst, worstAt), worst >= goalParallelSpeed}}
}

// rebuildTable shows the cost of a change of servers.
func (res benchResults) rebuildTable(w *bytes.Buffer, points int) []goal {
	fmt.Fprintf(w, "### Ring rebuild (%d points per member)\n\n", points)
	fmt.Fprintf(w, "newRing builds a ring from scratch, as every change does. SetServers is the whole change (parse, canonicalize, build, publish) between two sets that differ by one member, as when a pod is replaced. The build runs on one goroutine; CPUs is the run's GOMAXPROCS, which the garbage collector uses. Allocated is per call, garbage included; retained is the live heap of a ServerList after SetServers (measured across GCs): the ring's slot table and its members.\n\n")
	limits := fmt.Sprintf("<%g ms, retained ≤%g MB", goalRebuildSeconds*1e3, goalRebuildBytes/1e6)
	var rows [][]string
	var goals []goal
	for _, n := range res.sizes("members", "BenchmarkRebuild") {
		ring := fmt.Sprintf("BenchmarkRebuild/members=%d/op=newRing", n)
		set := fmt.Sprintf("BenchmarkRebuild/members=%d/op=SetServers", n)
		procs := 0 // GOMAXPROCS of the run: the machine's
		for p := range res[set] {
			procs = p
		}
		ringNs, ok1 := res.median(ring, procs, "ns/op")
		setNs, ok2 := res.median(set, procs, "ns/op")
		if !ok1 || !ok2 {
			continue
		}
		ringB, _ := res.median(ring, procs, "B/op")
		allocB, _ := res.median(set, procs, "B/op")
		allocs, _ := res.median(set, procs, "allocs/op")
		kept, _ := res.median(set, procs, "snapshot-B")
		pass := ""
		switch {
		case n == goalRebuildMembers:
			slowest := max(ringNs, setNs)
			pass = passMiss(slowest < goalRebuildSeconds*1e9 && kept <= goalRebuildBytes)
			goals = append(goals,
				goal{fmt.Sprintf("Rebuild at %d members < %g ms (from scratch, and one pod replaced; %d CPUs)", n, goalRebuildSeconds*1e3, procs),
					fmt.Sprintf("%s, %s", fmtDuration(ringNs), fmtDuration(setNs)), slowest < goalRebuildSeconds*1e9},
				goal{fmt.Sprintf("Ring memory at %d members ≤ %g MB (retained)", n, goalRebuildBytes/1e6),
					fmtBytes(kept), kept <= goalRebuildBytes})
		case n > goalRebuildMembers:
			goals = append(goals, goal{fmt.Sprintf("Ring memory bounded at %d members (retained; reported)", n), fmtBytes(kept), true})
		}
		rows = append(rows, []string{
			strconv.Itoa(n), strconv.Itoa(n * points), strconv.Itoa(procs),
			fmtDuration(ringNs), fmtBytes(ringB), fmtDuration(setNs),
			fmtBytes(allocB), fmt.Sprintf("%.0f", allocs), fmtBytes(kept),
			strconv.Itoa(res.count(set, procs)),
			pass,
		})
	}
	table(w, []string{"members", "points", "CPUs", "newRing", "newRing allocated", "SetServers (one pod replaced)", "SetServers allocated", "SetServers allocs", "retained", "n", "goal " + limits}, rows)
	return goals
}

func fmtDuration(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.1f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB", b/1e6)
	case b >= 1e3:
		return fmt.Sprintf("%.1f kB", b/1e3)
	}
	return fmt.Sprintf("%.0f B", b)
}
