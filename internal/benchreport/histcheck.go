package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// histLine is a summary line of internal/histcheck's TestHistory (see
// Report.Summary): one schedule through one target.
var histLine = regexp.MustCompile(`^\s*(\S+)\s+(client|client-replicated|client-byzone-static|gomemcache)\s+ops=(\d+)\s+stale=(\d+)\s+errors=(\d+)\s+hit=\s*([\d.]+)%.*?\((\d+(?:\.\d+)?)s\)( known-gap)?\s*$`)

// killErrors is the summary's count of the errors after the kills (see
// histcheck's Report.Summary): those a client could have spared the
// application, of all.
var killErrors = regexp.MustCompile(`\skill-errors=(\d+)/(\d+)\s`)

// histRun is one schedule's figures, by target.
type histRun struct {
	schedule string
	known    bool
	by       map[string]histCell
}

type histCell struct {
	ops, stale int
	hit        string
	killErrors string // "spared/all" after the kills, for the kill schedules; else ""
}

// histTargets are the columns, in order.
var histTargets = []string{"client", "client-replicated", "gomemcache"}

// parseHistcheck reads make histcheck-long's output: the summary lines,
// the last of each schedule and target winning (the run's closing block,
// which marks the known gaps).
func parseHistcheck(b []byte) []histRun {
	var runs []histRun
	idx := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		m := histLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		i, ok := idx[m[1]]
		if !ok {
			i = len(runs)
			idx[m[1]] = i
			runs = append(runs, histRun{schedule: m[1], by: map[string]histCell{}})
		}
		ops, _ := strconv.Atoi(m[3])
		stale, _ := strconv.Atoi(m[4])
		c := histCell{ops: ops, stale: stale, hit: m[6] + "%"}
		if k := killErrors.FindStringSubmatch(sc.Text()); k != nil {
			c.killErrors = k[1] + "/" + k[2]
		}
		runs[i].by[m[2]] = c
		runs[i].known = runs[i].known || m[8] != ""
	}
	return runs
}

// serverLine is TestHistory's note of the memcached it ran (see
// internal/histcheck's TestHistory).
var serverLine = regexp.MustCompile(`server: (memcached \S+)`)

// histcheckSection writes the long history runs' tables, one per output
// of make histcheck-long in paths (comma-separated: one run per memcached
// version): operations, stale reads and hit rate per schedule and target,
// the totals of the schedules the Client is judged on, and the known gaps
// apart.
func histcheckSection(w *bytes.Buffer, paths string) error {
	first := true
	for path := range strings.SplitSeq(paths, ",") {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		runs := parseHistcheck(b)
		if len(runs) == 0 {
			return fmt.Errorf("%s: no summary lines of TestHistory", path)
		}
		fi, _ := os.Stat(path)
		if first {
			fmt.Fprintf(w, "## History checker (long run)\n\n")
			fmt.Fprintf(w, "From `make histcheck-long` (internal/histcheck, part of `make bench-e2e`; `make histcheck-report` reruns it and rewrites this section alone), once on Debian's memcached and once on the newest release: every fault schedule through the sharded and the replicated Client and, as the control, gomemcache's own client, each over memcached processes of its own. A read is stale if it returns the value of a write w1 when another write or delete of the key began after w1 ended and was acknowledged before the read began. Known gaps (docs/consistency.md, \"What is not covered\") are reported apart, not counted in the totals.\n\n")
			first = false
		}
		server := "memcached (version not recorded)"
		if m := serverLine.FindSubmatch(b); m != nil {
			server = string(m[1])
		}
		fmt.Fprintf(w, "### %s (%s)\n\n", server, fi.ModTime().UTC().Format("2006-01-02 15:04 MST"))
		histTable(w, runs)
	}
	return nil
}

// histTable writes one run's table and its errors after the kills.
func histTable(w *bytes.Buffer, runs []histRun) {
	header := []string{"schedule"}
	for _, t := range histTargets {
		header = append(header, t+": ops, stale, hit")
	}
	var rows, gaps [][]string
	total := map[string][2]int{}
	for _, r := range runs {
		row := []string{r.schedule}
		for _, t := range histTargets {
			c, ok := r.by[t]
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%s, %s, %s", thousands(c.ops), thousands(c.stale), c.hit))
			if !r.known {
				total[t] = [2]int{total[t][0] + c.ops, total[t][1] + c.stale}
			}
		}
		if r.known {
			row[0] += " (known gap)"
			gaps = append(gaps, row)
		} else {
			rows = append(rows, row)
		}
	}
	sum := []string{"**all of the above**"}
	for _, t := range histTargets {
		sum = append(sum, fmt.Sprintf("**%s, %s**", thousands(total[t][0]), thousands(total[t][1])))
	}
	rows = append(rows, sum)
	table(w, header, slices.Concat(rows, gaps))
	killSentence(w, runs)
	w.WriteString("\n")
}

// killSentence states the errors that reached the application after the
// kills, where the run counted them: the bar for the Client is none but an
// Increment's on a broken connection.
func killSentence(w *bytes.Buffer, runs []histRun) {
	var parts []string
	for _, r := range runs {
		for _, t := range histTargets {
			if c := r.by[t]; c.killErrors != "" {
				parts = append(parts, fmt.Sprintf("%s %s %s", r.schedule, t, c.killErrors))
			}
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "\nErrors that reached the application after the kills (the kill's phases; a client could spare / all: an Increment on a broken connection may have applied, so no client sends it again): %s.\n", strings.Join(parts, ", "))
	}
}

// thousands writes n with commas: 1,313,615.
func thousands(n int) string {
	s := strconv.Itoa(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
