package main

// The section "The Client against gomemcache": go test -bench output of
// BenchmarkClientVsGomemcache (internal/proxybench), the Client against
// gomemcache's own Client, at its best and its default configuration, over
// the same 3 real memcached servers.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// The goals of the Client against gomemcache at its best.
const (
	goalVsLatency    = 1.0 // Get and Set, 1 goroutine: ns/op at most this times gomemcache's
	goalVsThroughput = 2.0 // Get and Set, vsParallel goroutines: ops/s at least this times gomemcache's
	goalVsP99        = 1.0 // and p99 at most this times gomemcache's
	goalVsGetMulti   = 0.7 // GetMulti of 100 keys, 1 goroutine: ns/op at most this times gomemcache's
)

// goalVsConns is the most connections the Client may hold open to one
// server under vsParallel goroutines: internal/meta's Pool limit, which
// the Client's pipelined connections are to use.
const goalVsConns = meta.DefaultMaxConns

const vsBench = "BenchmarkClientVsGomemcache"

// The impls of the benchmark: the Client, gomemcache at its best
// (MaxIdleConns at least the goroutines), gomemcache with its defaults.
const (
	vsClient  = "client"
	vsBest    = "gomemcache-best"
	vsDefault = "gomemcache-default"
)

var vsImpls = []string{vsClient, vsBest, vsDefault}

// vsCase is an operation of the benchmark with its goroutines.
type vsCase struct {
	op, title  string
	goroutines int
}

func (c vsCase) label() string {
	if c.goroutines == 1 {
		return c.title + ", 1 goroutine"
	}
	return fmt.Sprintf("%s, %d goroutines", c.title, c.goroutines)
}

var vsCases = []vsCase{
	{"get", "Get", 1},
	{"set", "Set", 1},
	{"get", "Get", 64},
	{"set", "Set", 64},
	{"getmulti", "GetMulti of 100 keys", 1},
}

// vsResults is the output of BenchmarkClientVsGomemcache.
type vsResults struct {
	res         benchResults
	procs       int               // the GOMAXPROCS of the results used (the largest)
	notMeasured string            // why not, from a "--- NOT MEASURED:" line
	config      map[string]string // configuration lines
}

var vsConfigKeys = []string{"memcached", "goroutines", "gomemcache-best-max-idle-conns", "gomemcache-default-max-idle-conns"}

// parseVs reads BenchmarkClientVsGomemcache's output.
func parseVs(r io.Reader) (vsResults, error) {
	v := vsResults{res: benchResults{}, config: map[string]string{}}
	var lines bytes.Buffer
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		lines.WriteString(line + "\n")
		if rest, ok := strings.CutPrefix(line, notMeasuredPrefix); ok {
			if name, reason, _ := strings.Cut(rest, ": "); strings.HasPrefix(name, vsBench) {
				v.notMeasured = reason
			}
			continue
		}
		if k, val, ok := strings.Cut(line, ": "); ok && slices.Contains(vsConfigKeys, k) {
			v.config[k] = val
		}
	}
	if err := sc.Err(); err != nil {
		return v, err
	}
	if err := parseBench(&lines, v.res); err != nil {
		return v, err
	}
	for name, byProcs := range v.res {
		if strings.HasPrefix(name, vsBench+"/") {
			for p := range byProcs {
				v.procs = max(v.procs, p)
			}
		}
	}
	return v, nil
}

func (v vsResults) name(c vsCase, impl string) string {
	return fmt.Sprintf("%s/op=%s/goroutines=%d/impl=%s", vsBench, c.op, c.goroutines, impl)
}

func (v vsResults) samples(c vsCase, impl, unit string) []float64 {
	return v.res[v.name(c, impl)][v.procs][unit]
}

func (v vsResults) median(c vsCase, impl, unit string) (float64, bool) {
	return v.res.median(v.name(c, impl), v.procs, unit)
}

// ratio returns impl's unit over gomemcache-best's in c: the median of the
// per-round ratios (make bench's rounds run every sub-benchmark once, so
// the i-th samples are of the same round) and their range; with unequal
// counts of samples, the ratio of the medians.
func (v vsResults) ratio(c vsCase, impl, unit string) (median, lo, hi float64, ok bool) {
	num, den := v.samples(c, impl, unit), v.samples(c, vsBest, unit)
	if len(num) == 0 || len(den) == 0 {
		return 0, 0, 0, false
	}
	if len(num) != len(den) {
		r := medianOf(num) / medianOf(den)
		return r, r, r, true
	}
	rs := make([]float64, len(num))
	for i := range num {
		rs[i] = num[i] / den[i]
	}
	return medianOf(rs), slices.Min(rs), slices.Max(rs), true
}

// vsGomemcache writes the section from the file of the benchmark's output
// and returns its goals.
func vsGomemcache(w *bytes.Buffer, file string) ([]goal, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	v, err := parseVs(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	v.section(w)
	return v.goals(), nil
}

func (v vsResults) conf(k, def string) string {
	if s := v.config[k]; s != "" {
		return s
	}
	return def
}

func (v vsResults) section(w *bytes.Buffer) {
	fmt.Fprintf(w, "## The Client against gomemcache\n\n")
	fmt.Fprintf(w, "BenchmarkClientVsGomemcache (internal/proxybench): this library's Client (NewClientFromList of the 3 addresses, its defaults) against gomemcache's own Client (memcache.New of the same addresses) over the same 3 real memcached %s servers on 127.0.0.1 that the benchmark starts (`-t 1`, as above), in one run. gomemcache is measured twice: **gomemcache-best**, MaxIdleConns %s (at least the goroutines, so that once warm no request waits for a dial), against which the ratios are taken; and **gomemcache-default**, its default MaxIdleConns of %s, beside it. Every client has a 5 s timeout and a new instance per sub-benchmark; the keys and values are those of the proxy tier's benchmarks, set before the timing, so that every Get hits.\n\n",
		v.conf("memcached", "unknown"), v.conf("gomemcache-best-max-idle-conns", "64"), v.conf("gomemcache-default-max-idle-conns", "2"))
	fmt.Fprintf(w, "1 goroutine is b.N calls in turn; %s goroutines is b.N calls split evenly among exactly that many goroutines, whatever GOMAXPROCS (here %d). ns/op is wall time per call across the goroutines and ops/s = b.N / elapsed; p50 and p99 are the latency of one call (every call timed); conns/server is the most connections open to one server at once and dials/server the most dials to one server, from the warm-up on, counted by the client's DialContext (the largest over the rounds and the median, respectively). Ratios are the Client's (and gomemcache-default's) over gomemcache-best's in the same round, the median over the rounds with their range in brackets; n is the number of rounds. The sub-benchmarks of a case run one after the other, seconds apart, in an order that make bench rotates from round to round (-proxy.vs-rotate), so other work on the machine moves the ratios, by a few percent on a quiet one.\n\n",
		v.conf("goroutines", "64"), v.procs)
	if v.notMeasured != "" {
		fmt.Fprintf(w, "**Not measured**: %s.\n\n", v.notMeasured)
	}
	var rows [][]string
	for _, c := range vsCases {
		for _, impl := range vsImpls {
			rows = append(rows, v.row(c, impl))
		}
	}
	table(w, []string{"op", "impl", "ns/op", "ops/s", "p50", "p99", "B/op", "allocs/op", "conns/server", "dials/server", "ns/op ÷ best", "ops/s ÷ best", "p99 ÷ best", "n"}, rows)
}

func (v vsResults) row(c vsCase, impl string) []string {
	row := []string{c.label(), impl}
	ns, ok := v.median(c, impl, "ns/op")
	if !ok {
		return append(row, "not measured", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "0")
	}
	ops, _ := v.median(c, impl, "ops/s")
	p50, _ := v.median(c, impl, "p50-ns")
	p99, _ := v.median(c, impl, "p99-ns")
	bytesOp, _ := v.median(c, impl, "B/op")
	allocs, _ := v.median(c, impl, "allocs/op")
	dials, _ := v.median(c, impl, "dials/server")
	row = append(row, fmtDuration(ns), fmtRate(ops), fmtDuration(p50), fmtDuration(p99),
		fmt.Sprintf("%.0f", bytesOp), fmt.Sprintf("%.0f", allocs), v.maxOf(c, impl, "conns/server"), fmt.Sprintf("%.0f", dials))
	for _, unit := range []string{"ns/op", "ops/s", "p99-ns"} {
		switch r, lo, hi, ok := v.ratio(c, impl, unit); {
		case impl == vsBest:
			row = append(row, "1")
		case ok:
			row = append(row, fmt.Sprintf("%.3f (%.3f–%.3f)", r, lo, hi))
		default:
			row = append(row, "-")
		}
	}
	return append(row, strconv.Itoa(v.res.count(v.name(c, impl), v.procs)))
}

// maxOf returns the largest sample of impl's unit in c, or "-".
func (v vsResults) maxOf(c vsCase, impl, unit string) string {
	s := v.samples(c, impl, unit)
	if len(s) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", slices.Max(s))
}

// vsRatios returns the ratios of unit in cases for impl, formatted, the
// worst of them by worse (which of two is worse), and whether all were
// measured.
func (v vsResults) vsRatios(cases []vsCase, impl, unit string, worse func(a, b float64) bool) (parts []string, worst float64, ok bool) {
	for i, c := range cases {
		r, _, _, ok := v.ratio(c, impl, unit)
		if !ok {
			return nil, 0, false
		}
		if i == 0 || worse(r, worst) {
			worst = r
		}
		parts = append(parts, fmt.Sprintf("%s %.3fx", strings.Fields(c.title)[0], r))
	}
	return parts, worst, true
}

func (v vsResults) goals() []goal {
	serial, parallel, multi := vsCases[:2], vsCases[2:4], vsCases[4:5]
	higher := func(a, b float64) bool { return a > b }
	lower := func(a, b float64) bool { return a < b }
	notMeasured := "not measured"
	if v.notMeasured != "" {
		notMeasured += ": " + v.notMeasured
	} else {
		notMeasured += ": no " + vsBench + " results for the client and gomemcache-best"
	}

	// ratioGoal is a goal on the ratio of unit in cases, against the
	// default beside.
	ratioGoal := func(text string, cases []vsCase, unit string, worse func(a, b float64) bool, pass func(worst float64) bool) goal {
		g := goal{goal: text}
		parts, worst, ok := v.vsRatios(cases, vsClient, unit, worse)
		if !ok {
			g.measured = notMeasured
			return g
		}
		g.measured = strings.Join(parts, ", ")
		if def, _, ok := v.vsRatios(cases, vsDefault, unit, worse); ok {
			g.measured += fmt.Sprintf(" (gomemcache-default: %s)", strings.Join(def, ", "))
		}
		g.pass = pass(worst)
		return g
	}

	goals := []goal{
		ratioGoal(fmt.Sprintf("The Client's Get and Set, 1 goroutine: latency ≤ %.1fx gomemcache's (ns/op against gomemcache-best, MaxIdleConns %s)", goalVsLatency, v.conf("gomemcache-best-max-idle-conns", "64")),
			serial, "ns/op", higher, func(r float64) bool { return r <= goalVsLatency }),
		v.allocGoal(serial),
		ratioGoal(fmt.Sprintf("The Client's Get and Set, %s goroutines over 3 servers: throughput ≥ %gx gomemcache's (ops/s)", v.conf("goroutines", "64"), goalVsThroughput),
			parallel, "ops/s", lower, func(r float64) bool { return r >= goalVsThroughput }),
		ratioGoal(fmt.Sprintf("The Client's Get and Set, %s goroutines over 3 servers: p99 latency ≤ %.1fx gomemcache's", v.conf("goroutines", "64"), goalVsP99),
			parallel, "p99-ns", higher, func(r float64) bool { return r <= goalVsP99 }),
		v.connsGoal(parallel),
		ratioGoal(fmt.Sprintf("The Client's GetMulti of 100 keys over 3 servers, 1 goroutine: ≤ %.1fx gomemcache's time (ns/op)", goalVsGetMulti),
			multi, "ns/op", higher, func(r float64) bool { return r <= goalVsGetMulti }),
	}
	return goals
}

// allocGoal: the Client allocates no more per call than gomemcache-best.
func (v vsResults) allocGoal(cases []vsCase) goal {
	g := goal{goal: "The Client's Get and Set, 1 goroutine: allocations per call ≤ gomemcache's (allocs/op)"}
	var parts []string
	pass := true
	for _, c := range cases {
		ca, ok1 := v.median(c, vsClient, "allocs/op")
		ga, ok2 := v.median(c, vsBest, "allocs/op")
		cb, _ := v.median(c, vsClient, "B/op")
		gb, _ := v.median(c, vsBest, "B/op")
		if !ok1 || !ok2 {
			g.measured = "not measured: no allocs/op (run with -benchmem) for the client and gomemcache-best"
			if v.notMeasured != "" {
				g.measured = "not measured: " + v.notMeasured
			}
			return g
		}
		pass = pass && ca <= ga
		parts = append(parts, fmt.Sprintf("%s %.0f vs %.0f allocs/op (%.0f vs %.0f B/op)", c.title, ca, ga, cb, gb))
	}
	g.measured, g.pass = strings.Join(parts, ", "), pass
	return g
}

// connsGoal: the Client's connections to a server stay within
// goalVsConns, however many goroutines; gomemcache's dials are reported.
func (v vsResults) connsGoal(cases []vsCase) goal {
	g := goal{goal: fmt.Sprintf("The Client's connections per server with %s goroutines: ≤ %d (internal/meta's DefaultMaxConns; gomemcache's dials reported)", v.conf("goroutines", "64"), goalVsConns)}
	var peaks, own, best, def []string
	worst := 0.0
	for _, c := range cases {
		s := v.samples(c, vsClient, "conns/server")
		if len(s) == 0 {
			g.measured = "not measured"
			if v.notMeasured != "" {
				g.measured += ": " + v.notMeasured
			}
			return g
		}
		worst = max(worst, slices.Max(s))
		peaks = append(peaks, fmt.Sprintf("%s %.0f", c.title, slices.Max(s)))
		for impl, out := range map[string]*[]string{vsClient: &own, vsBest: &best, vsDefault: &def} {
			if d, ok := v.median(c, impl, "dials/server"); ok {
				*out = append(*out, fmt.Sprintf("%s %.0f", c.title, d))
			} else {
				*out = append(*out, c.title+" -")
			}
		}
	}
	g.measured = fmt.Sprintf("the Client: at most %s open to one server, dials %s; gomemcache's dials per server: best %s; default %s",
		strings.Join(peaks, ", "), strings.Join(own, ", "), strings.Join(best, ", "), strings.Join(def, ", "))
	g.pass = worst <= goalVsConns
	return g
}
