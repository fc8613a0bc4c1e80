package selector

// Benchmarks for make bench: PickServer against gomemcache's ServerList in
// the same run, and ring rebuilds. benchSummary turns their output into the
// tables of BENCHMARKS.md (see TestQualityReport).

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// benchKeys is a fixed set of realistic cache keys, 20-25 bytes long,
// cycled by the PickServer benchmarks. Its length is a power of two so that
// cycling costs a mask, not a division.
var benchKeys = benchKeySet(rand.New(rand.NewPCG(1, 2)), 4096)

const benchKeyMask = 4096 - 1

// benchKeySet returns n keys of the shapes applications use.
func benchKeySet(rng *rand.Rand, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = fmt.Sprintf("user:%d:profile", 1000000+rng.IntN(9000000))
		case 1:
			keys[i] = fmt.Sprintf("session:%016x", rng.Uint64())
		case 2:
			keys[i] = fmt.Sprintf("product:%d:price:v%d", 100000+rng.IntN(900000), rng.IntN(10))
		default:
			keys[i] = fmt.Sprintf("feed:user:%d:page:%d", 1000000+rng.IntN(9000000), 10+rng.IntN(90))
		}
	}
	return keys
}

// benchAddrs returns n server addresses 10.0.0.1:11211, 10.0.0.2:11211, ...
// SetServers only parses them; nothing is dialled.
func benchAddrs(n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.%d.%d:11211", i/250, i%250+1)
	}
	return addrs
}

// benchSelectors returns ours and gomemcache's selector over the same n
// servers, called through the interface as memcache.Client calls them.
func benchSelectors(b *testing.B, n int) []struct {
	name string
	sel  memcache.ServerSelector
} {
	ours, theirs := new(ServerList), new(memcache.ServerList)
	if err := ours.SetServers(benchAddrs(n)...); err != nil {
		b.Fatal(err)
	}
	if err := theirs.SetServers(benchAddrs(n)...); err != nil {
		b.Fatal(err)
	}
	return []struct {
		name string
		sel  memcache.ServerSelector
	}{{"ours", ours}, {"gomemcache", theirs}}
}

var benchSizes = []int{3, 10, 100, 1000}

func BenchmarkPickServer(b *testing.B) {
	for _, n := range benchSizes {
		for _, s := range benchSelectors(b, n) {
			b.Run(fmt.Sprintf("servers=%d/impl=%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				var a net.Addr
				for i := 0; i < b.N; i++ {
					a, _ = s.sel.PickServer(benchKeys[i&benchKeyMask])
				}
				if a == nil {
					b.Fatal("no server picked")
				}
			})
		}
	}
}

func BenchmarkPickServerParallel(b *testing.B) {
	for _, n := range benchSizes {
		for _, s := range benchSelectors(b, n) {
			b.Run(fmt.Sprintf("servers=%d/impl=%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				var goroutines atomic.Int64
				b.RunParallel(func(pb *testing.PB) {
					start := int(goroutines.Add(1)) * 1031 // each goroutine starts at another key
					i := start
					var a net.Addr
					for pb.Next() {
						a, _ = s.sel.PickServer(benchKeys[i&benchKeyMask])
						i++
					}
					if i > start && a == nil {
						b.Error("no server picked")
					}
				})
			})
		}
	}
}

// BenchmarkRebuild measures a change of servers: newRing alone, and the
// whole SetServers (parse, canonicalize, build, publish), alternating between
// two sets that differ in one server so that every call rebuilds. It also
// reports snapshot-B, the heap a ServerList holds after SetServers.
func BenchmarkRebuild(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		addrs := benchAddrs(n + 1)
		sets := [2][]string{addrs[:n], addrs[1:]} // one pod replaced
		snapshot := retainedBytes(func() any {
			ss := new(ServerList)
			if err := ss.SetServers(sets[0]...); err != nil {
				b.Fatal(err)
			}
			return ss
		})

		b.Run(fmt.Sprintf("members=%d/op=newRing", n), func(b *testing.B) {
			ms := make([]member, n)
			for i, a := range sets[0] {
				ms[i] = member{id: a, addr: &staticAddr{network: "tcp", str: a}}
			}
			ms = canonical(ms)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if newRing(ms, DefaultPointsPerServer) == nil {
					b.Fatal("nil ring")
				}
			}
		})
		b.Run(fmt.Sprintf("members=%d/op=SetServers", n), func(b *testing.B) {
			ss := new(ServerList)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := ss.SetServers(sets[i%2]...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(snapshot), "snapshot-B")
		})
	}
}

// retainedBytes returns how much live heap the value that build returns
// holds, measured across two garbage collections.
func retainedBytes(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// benchResults holds the samples of a go test -bench output:
// benchmark name (without the -cpu suffix) -> GOMAXPROCS -> unit -> values.
type benchResults map[string]map[int]map[string][]float64

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-(\d+))?\s+\d+\s+(.+)$`)

// parseBench reads the benchmark lines of go test -bench output.
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
	vs := slices.Clone(res[name][procs][unit])
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2], true
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, true
}

func (res benchResults) count(name string, procs int) int {
	return len(res[name][procs]["ns/op"])
}

// reportGoal is one performance goal of issue 4 and how the run did.
type reportGoal struct {
	goal, measured string
	pass           bool
}

// Performance goals.
const (
	goalPickRatio      = 0.4  // PickServer time at most this times gomemcache's
	goalParallelSpeed  = 1.8  // throughput with 2 CPUs at least this times that with 1
	goalRebuildSeconds = 0.1  // rebuild at 1000 members
	goalRebuildBytes   = 32e6 // allocated or retained by a rebuild at 1000 members
)

// benchSummary renders the PickServer and rebuild tables from go test -bench
// output files, and checks the performance goals.
func benchSummary(w io.Writer, files []string) ([]reportGoal, error) {
	res := benchResults{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		err = parseBench(f, res)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no benchmark results in %v", files)
	}
	goals := res.pickTable(w)
	goals = append(goals, res.scalingTable(w)...)
	return append(goals, res.rebuildTable(w)...), nil
}

// pickTable compares ours with gomemcache per size, mode and CPU count.
func (res benchResults) pickTable(w io.Writer) []reportGoal {
	fmt.Fprintf(w, "### PickServer: ours against gomemcache's ServerList\n\n")
	fmt.Fprintf(w, "Median of the runs (n = runs per row). make bench runs every benchmark once per round and repeats the rounds, so ours and gomemcache are measured seconds apart and other work on the machine slows both alike. Serial is one goroutine on 1 CPU; parallel is b.RunParallel with one goroutine per CPU (-cpu 1,2), so its ns/op is wall time per operation across all CPUs. Both selectors are called through the memcache.ServerSelector interface, as memcache.Client calls them. Keys: %d fixed keys such as %q, cycled, the same for both; servers 10.0.0.1:11211 and up.\n\n", len(benchKeys), benchKeys[0])
	var rows [][]string
	worstRatio, worstAt := 0.0, ""
	maxAllocs := 0.0
	for _, n := range benchSizes {
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
				if ratio > worstRatio {
					worstRatio, worstAt = ratio, fmt.Sprintf("%d servers, %s, %d CPU", n, mode, procs)
				}
				maxAllocs = max(maxAllocs, oa)
				rows = append(rows, []string{
					strconv.Itoa(n), mode, strconv.Itoa(procs),
					fmt.Sprintf("%.1f", o), fmt.Sprintf("%.1f", g), fmt.Sprintf("%.2f", ratio),
					fmt.Sprintf("%g", oa), fmt.Sprintf("%g", ga),
					strconv.Itoa(min(res.count(ours, procs), res.count(theirs, procs))),
					passMiss(ratio <= goalPickRatio && oa == 0),
				})
			}
		}
	}
	qTable(w, []string{"servers", "mode", "CPUs", "ours ns/op", "gomemcache ns/op", "ours/gomemcache", "ours allocs/op", "gomemcache allocs/op", "n", "goal ≤0.4x, 0 allocs"}, rows)
	if worstAt == "" {
		return nil
	}
	return []reportGoal{
		{"PickServer ≤ 0.4x gomemcache at every size (serial; parallel on 1 and 2 CPUs)",
			fmt.Sprintf("worst %.2fx (%s)", worstRatio, worstAt), worstRatio <= goalPickRatio},
		{"PickServer 0 allocs/op", fmt.Sprintf("max %g allocs/op", maxAllocs), maxAllocs == 0},
	}
}

// scalingTable shows the parallel throughput with 2 CPUs over that with 1.
func (res benchResults) scalingTable(w io.Writer) []reportGoal {
	fmt.Fprintf(w, "### PickServer parallel scaling\n\nSpeedup = ns/op with 1 CPU / ns/op with 2 CPUs (b.RunParallel, -cpu 1,2); 2.0 is perfect.\n\n")
	var rows [][]string
	worst, worstAt := 0.0, ""
	for _, n := range benchSizes {
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
	qTable(w, []string{"servers", "ours 1 CPU ns/op", "ours 2 CPUs ns/op", "ours speedup", "gomemcache 1 CPU ns/op", "gomemcache 2 CPUs ns/op", "gomemcache speedup", "goal ours ≥1.8x"}, rows)
	if worstAt == "" {
		return nil
	}
	return []reportGoal{{"PickServer parallel: 2 CPUs ≥ 1.8x the 1-CPU throughput",
		fmt.Sprintf("worst %.2fx (%s)", worst, worstAt), worst >= goalParallelSpeed}}
}

// rebuildTable shows the cost of a change of servers.
func (res benchResults) rebuildTable(w io.Writer) []reportGoal {
	fmt.Fprintf(w, "### Ring rebuild (%d points per member)\n\n", DefaultPointsPerServer)
	fmt.Fprintf(w, "newRing builds a ring from scratch, as the first sync does. SetServers is the whole change (parse, canonicalize, build, publish) between two sets that differ by one member, as when a pod is replaced: it rebuilds from the previous ring and hashes only the new member's points. Allocated is per call, garbage included; retained is the live heap of a ServerList after SetServers (measured across GCs).\n\n")
	var rows [][]string
	var goals []reportGoal
	for _, n := range []int{10, 100, 1000} {
		name := fmt.Sprintf("BenchmarkRebuild/members=%d/op=SetServers", n)
		procs := 0 // GOMAXPROCS of the run: the machine's
		for p := range res[name] {
			procs = p
		}
		ringNs, ok1 := res.median(fmt.Sprintf("BenchmarkRebuild/members=%d/op=newRing", n), procs, "ns/op")
		setNs, ok2 := res.median(name, procs, "ns/op")
		if !ok1 || !ok2 {
			continue
		}
		ringB, _ := res.median(fmt.Sprintf("BenchmarkRebuild/members=%d/op=newRing", n), procs, "B/op")
		allocB, _ := res.median(name, procs, "B/op")
		allocs, _ := res.median(name, procs, "allocs/op")
		kept, _ := res.median(name, procs, "snapshot-B")
		goal := "" // the goals are for 1000 members
		if n == 1000 {
			slowest, bytes := max(ringNs, setNs), max(ringB, allocB, kept)
			goal = passMiss(slowest < goalRebuildSeconds*1e9 && bytes < goalRebuildBytes)
			goals = []reportGoal{
				{"Rebuild at 1000 members < 100 ms (from scratch, and one pod replaced)",
					fmt.Sprintf("%s, %s", fmtDuration(ringNs), fmtDuration(setNs)), slowest < goalRebuildSeconds*1e9},
				{"Rebuild at 1000 members < 32 MB (allocated and retained)", fmtBytes(bytes), bytes < goalRebuildBytes},
			}
		}
		rows = append(rows, []string{
			strconv.Itoa(n), strconv.Itoa(n * DefaultPointsPerServer),
			fmtDuration(ringNs), fmtBytes(ringB), fmtDuration(setNs),
			fmtBytes(allocB), fmt.Sprintf("%.0f", allocs), fmtBytes(kept),
			strconv.Itoa(res.count(name, procs)),
			goal,
		})
	}
	qTable(w, []string{"members", "points", "newRing", "newRing allocated", "SetServers (one pod replaced)", "SetServers allocated", "SetServers allocs", "retained", "n", "goal <100 ms, <32 MB"}, rows)
	return goals
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
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

// qTable writes a Markdown table followed by a blank line.
func qTable(w io.Writer, header []string, rows [][]string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(header, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(header)))
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}
