// Benchreport writes BENCHMARKS.md, the report of make bench, from five
// sources: go test -bench output of the selector package's benchmarks, for
// the speed tables; that of internal/proxybench's BenchmarkProxy, for the
// end-to-end tables against a proxy tier; that of its
// BenchmarkClientVsGomemcache, for the Client against gomemcache's own
// Client (whose goals it also prints, PASS or MISS, on stdout); the ring's
// routing-quality figures, which the package's TestQualityMeasure writes
// with -quality-json (see internal/quality); and, for contrast, the routing
// quality of modulo and jump hashing on the same changes, which it computes
// itself.
//
//	go test -run '^TestQualityMeasure$' . -args -quality-json bench-quality.out
//	go test -run '^$' -bench '^BenchmarkProxy$' -cpu 1,2 ./internal/proxybench > bench-proxy.out
//	go test -run '^$' -bench '^BenchmarkClientVsGomemcache$' -benchmem ./internal/proxybench > bench-client.out
//	go run ./internal/benchreport -quality bench-quality.out -bench bench-pick.out,bench-rebuild.out -proxy bench-proxy.out -client bench-client.out -o BENCHMARKS.md
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/quality"
)

var (
	outFile       = flag.String("o", "BENCHMARKS.md", "write the report to this Markdown `file`")
	qualityFile   = flag.String("quality", "", "the JSON `file` that TestQualityMeasure wrote with -quality-json (required)")
	benchFiles    = flag.String("bench", "", "comma-separated go test -bench output `files` to summarize")
	proxyFile     = flag.String("proxy", "", "go test -bench output `file` of internal/proxybench's BenchmarkProxy to summarize")
	clientFile    = flag.String("client", "", "go test -bench output `file` of internal/proxybench's BenchmarkClientVsGomemcache to summarize; its goals are also printed on stdout")
	benchstatFile = flag.String("benchstat", "", "benchstat output `file` to append, if it exists")
	loadFile      = flag.String("loadavg", "", "a copy of /proc/loadavg taken before the benchmarks, for the header, if it exists")
	movesFile     = flag.String("moves", "", "go test -bench output `file` of BenchmarkMoves to summarize, if it exists")
	e2eFile       = flag.String("e2e", "", "Markdown `file` of figures from the e2e suite (make bench-e2e) to include, if it exists")
	histFile      = flag.String("histcheck", "", "output `files` of make histcheck-long to summarize (comma-separated, one a memcached version), if the first exists")
	leasesFile    = flag.String("leases", "", "the JSON `file` that TestLeaseMeasure wrote with -lease.json, if it exists")
	command       = flag.String("command", "make bench", "the `command` that produced the report, for its header")
	section       = flag.String("section", "", "rewrite only this `section` of the report (-o) in place, from its input: histcheck (-histcheck), moves (-moves; and its goals), e2e (-e2e: its scenarios); the others stay as the run that made them left them")
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("benchreport: ")
	flag.Parse()
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// goal is one goal of the report and how the run did.
type goal struct {
	goal, measured string
	pass           bool
}

func run() error {
	if *section != "" {
		return rewriteSection(*outFile, *section)
	}
	start := time.Now()
	fig, err := readFigures(*qualityFile)
	if err != nil {
		return err
	}

	var body bytes.Buffer
	var goals []goal
	if *benchFiles != "" {
		fmt.Fprintf(&body, "## Speed\n\n")
		g, err := speed(&body, strings.Split(*benchFiles, ","), fig)
		if err != nil {
			return err
		}
		goals = append(goals, g...)
	}
	if *proxyFile != "" {
		g, err := proxy(&body, *proxyFile)
		if err != nil {
			return err
		}
		goals = append(goals, g...)
	}
	if *clientFile != "" {
		g, err := vsGomemcache(&body, *clientFile)
		if err != nil {
			return err
		}
		goals = append(goals, g...)
		for _, g := range g {
			fmt.Printf("%s  %s: %s\n", passMiss(g.pass), g.goal, g.measured)
		}
	}

	if exists(*movesFile) {
		g, err := movesSection(&body, *movesFile)
		if err != nil {
			return err
		}
		goals = append(goals, g...)
	}

	fmt.Fprintf(&body, "## Routing quality\n\n")
	computed := time.Now()
	goals = append(goals, routing(&body, fig)...)
	fmt.Fprintf(&body, "The routing-quality figures took %.0f s to compute.\n\n", fig.Seconds+time.Since(computed).Seconds())

	if fi, err := os.Stat(*e2eFile); err == nil {
		b, err := os.ReadFile(*e2eFile)
		if err != nil {
			return err
		}
		fmt.Fprintf(&body, "## On a real control plane\n\nFrom `make bench-e2e` on %s: the e2e suite's convergence and rolling-restart scenarios, against kube-apiserver, kube-controller-manager and etcd v1.37.2 and real memcached servers on this machine.\n\n%s\n",
			fi.ModTime().UTC().Format("2006-01-02 15:04 MST"), b)
	}

	if first, _, _ := strings.Cut(*histFile, ","); first != "" && exists(first) {
		if err := histcheckSection(&body, *histFile); err != nil {
			return err
		}
	}

	if _, err := os.Stat(*leasesFile); err == nil {
		if err := leasesSection(&body, *leasesFile); err != nil {
			return err
		}
	}

	if b, err := os.ReadFile(*benchstatFile); err == nil && len(b) > 0 {
		fmt.Fprintf(&body, "## benchstat\n\nThe same runs summarized by benchstat: medians with 95%% confidence intervals; the PickServer columns compare ours against gomemcache; the proxy tier's compare gomemcache and twemproxy against ours, each path alone (benchstat has no figures of the alternating loop, which the goals use); the Client's and gomemcache-default's compare against gomemcache-best.\n\n```\n%s```\n", b)
	} else if *benchFiles != "" {
		fmt.Fprintf(&body, "benchstat was not available for this run; the medians above are the report's own.\n")
	}

	var doc bytes.Buffer
	fmt.Fprintf(&doc, "# Benchmarks and routing quality\n\n")
	fmt.Fprintf(&doc, "Generated by `%s` on %s. Do not edit; rerun the command.\n\n", *command, time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&doc, "- CPU: %s\n", cpu())
	fmt.Fprintf(&doc, "- Go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if b, err := os.ReadFile(*loadFile); err == nil && len(strings.Fields(string(b))) >= 3 {
		f := strings.Fields(string(b))
		fmt.Fprintf(&doc, "- Load average (1, 5, 15 min) before the benchmarks: %s. Other work on the machine inflates the timings and depresses the parallel scaling.\n", strings.Join(f[:3], ", "))
	}
	fmt.Fprintf(&doc, "- Ring: %d points per member (DefaultPointsPerServer), xxhash\n\n", fig.Points)
	fmt.Fprintf(&doc, "## Goals\n\n")
	var rows [][]string
	for _, g := range goals {
		rows = append(rows, []string{g.goal, g.measured, passMiss(g.pass)})
	}
	table(&doc, []string{"goal", "measured", "result"}, rows)
	doc.Write(body.Bytes())

	if err := os.WriteFile(*outFile, doc.Bytes(), 0o644); err != nil {
		return err
	}
	log.Printf("wrote %s in %.0f s", *outFile, time.Since(start).Seconds())
	return nil
}

// readFigures reads the file of TestQualityMeasure. A field it does not
// know is an error, so that the test and the report cannot drift apart
// unnoticed.
func readFigures(name string) (quality.Figures, error) {
	var fig quality.Figures
	if name == "" {
		return fig, fmt.Errorf("-quality is required: the file of go test -run '^TestQualityMeasure$' . -args -quality-json FILE")
	}
	f, err := os.Open(name)
	if err != nil {
		return fig, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fig); err != nil {
		return fig, fmt.Errorf("%s: %w", name, err)
	}
	if fig.Points == 0 || len(fig.Movement) == 0 || len(fig.Restart) == 0 {
		return fig, fmt.Errorf("%s: no figures", name)
	}
	return fig, nil
}

// cpu returns the CPU model and the number of logical CPUs from /proc/cpuinfo.
func cpu() string {
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

// table writes a Markdown table followed by a blank line.
func table(w *bytes.Buffer, header []string, rows [][]string) {
	fmt.Fprintf(w, "| %s |\n", strings.Join(header, " | "))
	fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(header)))
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
	fmt.Fprintln(w)
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// exists reports whether path names a file.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
