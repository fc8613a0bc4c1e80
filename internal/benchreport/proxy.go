package main

// The section "Against a proxy tier": go test -bench output of
// BenchmarkProxy (internal/proxybench), Get, Set and GetMulti through this
// library's ServerList, gomemcache's and twemproxy, over real memcached.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// goalProxyOverhead is the most that ours may add to a Get, as a fraction of
// gomemcache's Get; goalClientOverhead, the most that the Client may.
const (
	goalProxyOverhead  = 0.02
	goalClientOverhead = 0.03
)

// The paths of BenchmarkProxy, and its sub-benchmark of all of them in one
// loop.
var proxyPaths = []string{"ours", "client", "gomemcache", "twemproxy"}

const proxyAlternate = "alternate"

var proxyOps = []struct{ name, title string }{
	{"get", "Get"},
	{"set", "Set"},
	{"getmulti", "GetMulti of 100 keys"},
}

// proxyRun is the output of BenchmarkProxy.
type proxyRun struct {
	res         benchResults
	notMeasured map[string]string // path -> why not, from "--- NOT MEASURED:" lines
	config      map[string]string // configuration lines: memcached, nutcracker, server-connections
}

const notMeasuredPrefix = "--- NOT MEASURED: "

// parseProxy reads BenchmarkProxy's output: its benchmark lines, the
// reasons it gave for a path it did not measure, and its configuration
// lines.
func parseProxy(r io.Reader) (proxyRun, error) {
	run := proxyRun{res: benchResults{}, notMeasured: map[string]string{}, config: map[string]string{}}
	var lines bytes.Buffer
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		lines.WriteString(line + "\n")
		if rest, ok := strings.CutPrefix(line, notMeasuredPrefix); ok {
			// BenchmarkProxy/op=get/impl=twemproxy: reason
			name, reason, _ := strings.Cut(rest, ": ")
			_, impl, _ := strings.Cut(name, "/impl=")
			if impl != "" && impl != proxyAlternate {
				run.notMeasured[impl] = reason
			}
			continue
		}
		if k, v, ok := strings.Cut(line, ": "); ok && slices.Contains([]string{"memcached", "nutcracker", "server-connections"}, k) {
			run.config[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return run, err
	}
	return run, parseBench(&lines, run.res)
}

// proxy writes the section from the file of BenchmarkProxy's output and
// returns its goals. A path that was not measured stays in the tables and
// the goals, with the reason.
func proxy(w *bytes.Buffer, file string) ([]goal, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	run, err := parseProxy(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	conf := func(k string) string {
		if v := run.config[k]; v != "" {
			return v
		}
		return "unknown"
	}

	fmt.Fprintf(w, "## Against a proxy tier\n\n")
	fmt.Fprintf(w, "Get, Set and GetMulti of 100 keys through memcache.Client, over 3 real memcached %s servers on 127.0.0.1 (`memcached -l 127.0.0.1 -p PORT -U 0 -m 64 -t 1`) that the benchmark (internal/proxybench) starts and stops, by four paths:\n\n", conf("memcached"))
	fmt.Fprintf(w, "- **ours**: memcache.NewFromSelector over this library's ServerList, SetServers of the 3 addresses;\n")
	fmt.Fprintf(w, "- **client**: this library's Client (failover, handoff, invalidations) over the same kind of ServerList, NewClientFromList;\n")
	fmt.Fprintf(w, "- **gomemcache**: memcache.New of the 3 addresses, its own ServerList;\n")
	fmt.Fprintf(w, "- **twemproxy**: nutcracker %s in front of the same servers (distribution ketama, hash fnv1a_64, auto_eject_hosts false, server_connections %s, preconnect), with memcache.New of the proxy's address as the only server: the hop this library exists to remove.\n\n", conf("nutcracker"), conf("server-connections"))
	fmt.Fprintf(w, "The client is gomemcache in all four, with gomemcache's defaults of 2 idle connections per address (no more than the goroutines) and no pipelining; twemproxy, as in production, pipelines the requests of its client connections on its connections to each server. Values are 100 bytes; the keys are 4096 of the shapes the PickServer benchmarks use, set through each path before the timing so that every Get hits (a miss fails the benchmark); a GetMulti asks for 100 consecutive ones. CPUs is the client's GOMAXPROCS (b.RunParallel, one goroutine per CPU, -cpu 1,2); memcached and nutcracker share the machine's CPUs with it. memcached runs one worker thread (-t 1), so that every path's connections to a server are served by the same thread: with its default of 4 they go to different threads, which on a 2-CPU VM made one path's median up to 3.5 times another's for whole runs (see internal/proxybench/tier.go).\n\n")
	fmt.Fprintf(w, "**Alone** is each path in a benchmark of its own, one after the other in each round: ns/op is wall time per operation (across the goroutines), ops/s = 1e9 / ns/op, and p50 and p99 the latency of one operation as its goroutine saw it (every operation sampled). Seconds apart on a shared machine, their ratios drift by more than the 2%% the goal is about. **Alternating** is all the paths in one loop, one operation through each in turn on the same key, in orders that rotate so that each path follows each other equally often, so the machine's state is the same for all: its ratios of each path's latency (mean, p50, p99) to gomemcache's in the same loop are the comparison the goals use; the median over the rounds of the per-round ratio, with the range over the rounds in brackets. n is the number of rounds.\n\n")
	for _, p := range proxyPaths {
		if why := run.notMeasured[p]; why != "" {
			fmt.Fprintf(w, "**%s was not measured**: %s.\n\n", p, why)
		}
	}

	for _, op := range proxyOps {
		fmt.Fprintf(w, "### %s\n\n", op.title)
		var rows [][]string
		for _, procs := range []int{1, 2} {
			for _, p := range proxyPaths {
				rows = append(rows, run.row(op.name, p, procs))
			}
		}
		table(w, []string{"path", "CPUs", "alone ns/op", "alone ops/s", "alone p50", "alone p99", "alone ns/op ÷ gomemcache", "alternating mean ÷ gomemcache", "alternating p50 ÷ gomemcache", "alternating p99 ÷ gomemcache", "n"}, rows)
	}
	pool := run.poolSection(w)
	return []goal{
		run.overheadGoal("ours", "End to end, ours adds", "over gomemcache's ServerList", goalProxyOverhead),
		run.overheadGoal("client", "End to end, the Client adds", "over gomemcache's own Get with the same kind of selector", goalClientOverhead),
		run.proxyGoal(),
		pool[0], pool[1],
	}, nil
}

func (run proxyRun) name(op, impl string) string {
	return fmt.Sprintf("BenchmarkProxy/op=%s/impl=%s", op, impl)
}

// row is a path's row of an operation's table.
func (run proxyRun) row(op, path string, procs int) []string {
	row := []string{path, strconv.Itoa(procs)}
	alone := run.name(op, path)
	ns, ok := run.res.median(alone, procs, "ns/op")
	if !ok {
		why := "not measured"
		if r := run.notMeasured[path]; r != "" {
			why += " (above)"
		}
		return append(row, why, "-", "-", "-", "-", "-", "-", "-", "0")
	}
	p50, _ := run.res.median(alone, procs, "p50-ns")
	p99, _ := run.res.median(alone, procs, "p99-ns")
	row = append(row, fmtDuration(ns), fmtRate(1e9/ns), fmtDuration(p50), fmtDuration(p99))
	if path == "gomemcache" {
		return append(row, "1", "1", "1", "1", strconv.Itoa(run.res.count(alone, procs)))
	}
	if g, ok := run.res.median(run.name(op, "gomemcache"), procs, "ns/op"); ok {
		row = append(row, fmt.Sprintf("%.3f", ns/g))
	} else {
		row = append(row, "-")
	}
	for _, stat := range []string{"", "-p50", "-p99"} {
		if r, lo, hi, ok := run.ratio(op, path, stat, procs); ok {
			row = append(row, fmt.Sprintf("%.3f (%.3f–%.3f)", r, lo, hi))
		} else {
			row = append(row, "-")
		}
	}
	return append(row, strconv.Itoa(run.res.count(alone, procs)))
}

// ratio returns the median over the rounds of the alternating loop's
// per-round ratio of path's latency statistic ("" the mean, "-p50", "-p99")
// to gomemcache's, and its range.
func (run proxyRun) ratio(op, path, stat string, procs int) (median, lo, hi float64, ok bool) {
	m := run.res[run.name(op, proxyAlternate)][procs]
	num, den := m[path+stat+"-ns"], m["gomemcache"+stat+"-ns"]
	if len(num) == 0 || len(num) != len(den) {
		return 0, 0, 0, false
	}
	rs := make([]float64, len(num))
	for i := range num {
		rs[i] = num[i] / den[i]
	}
	return medianOf(rs), slices.Min(rs), slices.Max(rs), true
}

// overheadGoal checks path against gomemcache on a Get, in the
// alternating loop, at the median (the shift of the whole distribution that
// a cost per operation makes; the mean is also given, as tails from other
// work on the machine make it noisier).
func (run proxyRun) overheadGoal(path, what, than string, bound float64) goal {
	g := goal{goal: fmt.Sprintf("%s < %g%% to a Get %s (real memcached, alternating p50 ratio ≤ %.2f, 1 and 2 CPUs)", what, bound*100, than, 1+bound)}
	for _, p := range []string{path, "gomemcache"} {
		if why := run.notMeasured[p]; why != "" {
			g.measured = "not measured: " + why
			return g
		}
	}
	worst, worstAt := 0.0, 0
	var means []string
	for _, procs := range []int{1, 2} {
		r, _, _, ok := run.ratio("get", path, "-p50", procs)
		mean, _, _, ok2 := run.ratio("get", path, "", procs)
		if !ok || !ok2 {
			g.measured = fmt.Sprintf("not measured: no BenchmarkProxy/op=get/impl=alternate results for %s at %d CPU", path, procs)
			return g
		}
		if r > worst {
			worst, worstAt = r, procs
		}
		means = append(means, fmt.Sprintf("%.3f", mean))
	}
	g.measured = fmt.Sprintf("worst p50 ratio %.3f (%d CPU); mean ratio %s at 1, 2 CPUs", worst, worstAt, strings.Join(means, ", "))
	g.pass = worst <= 1+bound
	return g
}

// The pool goals: a Get on a replicated pool reads one replica, so it costs
// what a sharded one does; a Set goes to the replicas at once, so it costs
// about one round trip (well under the 3 that one after the other would).
const (
	goalPoolGet = 1.05
	goalPoolSet = 2.0
)

// poolSection writes the table of BenchmarkPool (the Client, sharded against
// replicated over the same 3 servers, alternating) and returns its goals.
func (run proxyRun) poolSection(w *bytes.Buffer) [2]goal {
	gs := [2]goal{
		{goal: fmt.Sprintf("A Get on a replicated pool of 3 costs ≤ %.2fx a sharded Get (alternating p50, 1 and 2 CPUs)", goalPoolGet)},
		{goal: fmt.Sprintf("A Set to 3 replicas costs about one round trip: ≤ %.1fx a sharded Set (alternating p50, 1 and 2 CPUs)", goalPoolSet)},
	}
	fmt.Fprintf(w, "### Pools: replicated against sharded\n\n")
	fmt.Fprintf(w, "BenchmarkPool: Get and Set through a Client of a sharded pool and one of a replicated pool (`WithPool(Replicated())`) over the same 3 servers, one operation through each in turn on the same key. A replicated Get reads this client's own replica; a replicated Set writes the 3 replicas at once.\n\n")
	var rows [][]string
	for i, op := range []string{"get", "set"} {
		worst, ok := 0.0, true
		var parts []string
		for _, procs := range []int{1, 2} {
			m := run.res[fmt.Sprintf("BenchmarkPool/op=%s/impl=alternate", op)][procs]
			num, den := m["replicated-p50-ns"], m["sharded-p50-ns"]
			if len(num) == 0 || len(num) != len(den) {
				ok = false
				break
			}
			rs := make([]float64, len(num))
			for j := range num {
				rs[j] = num[j] / den[j]
			}
			r := medianOf(rs)
			worst = max(worst, r)
			parts = append(parts, fmt.Sprintf("%.3f (%d CPU)", r, procs))
			rows = append(rows, []string{op, strconv.Itoa(procs), fmtDuration(medianOf(den)), fmtDuration(medianOf(num)),
				fmt.Sprintf("%.3f (%.3f–%.3f)", r, slices.Min(rs), slices.Max(rs)), strconv.Itoa(len(rs))})
		}
		if !ok {
			gs[i].measured = "not measured: no BenchmarkPool results"
			continue
		}
		gs[i].measured = "p50 ratio " + strings.Join(parts, ", ")
		gs[i].pass = worst <= []float64{goalPoolGet, goalPoolSet}[i]
	}
	table(w, []string{"op", "CPUs", "sharded p50", "replicated p50", "replicated ÷ sharded (range)", "n"}, rows)
	return gs
}

// proxyGoal reports whether the proxy tier was measured, and what it costs.
func (run proxyRun) proxyGoal() goal {
	g := goal{goal: "The proxy tier measured: twemproxy in front of the same servers, against gomemcache (alternating p50 ratio)"}
	if why := run.notMeasured["twemproxy"]; why != "" {
		g.measured = "not measured: " + why
		return g
	}
	var parts []string
	for _, procs := range []int{1, 2} {
		var ops []string
		for _, op := range proxyOps {
			r, _, _, ok := run.ratio(op.name, "twemproxy", "-p50", procs)
			if !ok {
				g.measured = fmt.Sprintf("not measured: no twemproxy figures for %s at %d CPU in the alternating loop", op.title, procs)
				return g
			}
			ops = append(ops, fmt.Sprintf("%s %.2fx", strings.Fields(op.title)[0], r))
		}
		parts = append(parts, fmt.Sprintf("%s (%d CPU)", strings.Join(ops, ", "), procs))
	}
	g.measured, g.pass = strings.Join(parts, "; "), true
	return g
}

func fmtRate(perSecond float64) string {
	switch {
	case perSecond >= 1e6:
		return fmt.Sprintf("%.2fM", perSecond/1e6)
	case perSecond >= 1e3:
		return fmt.Sprintf("%.1fk", perSecond/1e3)
	}
	return fmt.Sprintf("%.0f", perSecond)
}
