package main

// The section "Moves": go test -bench output of BenchmarkMoves
// (mover_bench_test.go), the mover against a plain pipelined copy of the
// same keys between the same servers in the same run.

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Moves goals (issue 28).
const (
	goalMovesRatio = 0.5 // the mover at its fastest, keys/s against the plain copy's
	goalMovesP99   = 1.5 // the readers' p99 during a move at the default, against before
)

// movesSizes are BenchmarkMoves' value sizes, in its order, and whether
// the fastest-mover goal holds on it (100,000 keys; 16 KB moves 20,000,
// reported only).
var movesSizes = []struct {
	name string
	goal bool
}{{"32B", true}, {"1KB", true}, {"16KB", false}}

// movesResults are BenchmarkMoves' samples, by benchmark name (see median).
type movesResults benchResults

func parseMoves(b []byte) (movesResults, error) {
	res := benchResults{}
	if err := parseBench(bytes.NewReader(b), res); err != nil {
		return nil, err
	}
	for name := range res {
		if !strings.HasPrefix(name, "BenchmarkMoves/") {
			delete(res, name)
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no BenchmarkMoves results")
	}
	return movesResults(res), nil
}

// samples returns the samples of one case of BenchmarkMoves in unit, at
// whatever GOMAXPROCS it ran.
func (mv movesResults) samples(size, impl, unit string) []float64 {
	var vs []float64
	for _, units := range mv["BenchmarkMoves/value="+size+"/impl="+impl] {
		vs = append(vs, units[unit]...)
	}
	return vs
}

func (mv movesResults) median(size, impl, unit string) (float64, bool) {
	vs := mv.samples(size, impl, unit)
	if len(vs) == 0 {
		return 0, false
	}
	return medianOf(vs), true
}

// movesSection writes the section from the file of BenchmarkMoves' output
// and returns its goals.
func movesSection(w *bytes.Buffer, path string) ([]goal, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	mv, err := parseMoves(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "## Moves\n\n")
	fmt.Fprintf(w, "From BenchmarkMoves (mover_bench_test.go) on %s, run by `make bench` and `make bench-moves`: one Client moves the keys that change owner in a scale-up from 2 to 3 memcached of 1 GB (100,000 keys of 32 B or 1 KB, 20,000 of 16 KB; a third move). plain is the floor, a plain pipelined copy of the same keys between the same servers in the same run (list; read 128 keys pipelined; write them at their new owner; delete them at the source), with none of the mover's guarantees; NoYield is the mover unlimited, default at `Moves`' defaults. The readers are 8 goroutines reading 1,000 other keys through the same Client; their p99 during the move is against theirs just before. Medians of the runs; the mover, the readers and the three memcached share this machine's CPUs.\n\n", fi.ModTime().UTC().Format("2006-01-02 15:04 MST"))
	var rows [][]string
	for _, s := range movesSizes {
		if len(mv.samples(s.name, "plain", "keys/s"))+len(mv.samples(s.name, "max", "keys/s"))+len(mv.samples(s.name, "default", "keys/s")) == 0 {
			continue // not run
		}
		plain, _ := mv.median(s.name, "plain", "keys/s")
		row := []string{s.name}
		for _, impl := range []string{"plain", "max", "default"} {
			k, ok := mv.median(s.name, impl, "keys/s")
			mb, _ := mv.median(s.name, impl, "MB/s")
			switch {
			case !ok:
				row = append(row, "not measured")
			case impl == "plain":
				row = append(row, fmt.Sprintf("%s keys/s, %.1f MB/s", thousands(int(k)), mb))
			default:
				row = append(row, fmt.Sprintf("%s keys/s (%.2fx), %.1f MB/s", thousands(int(k)), k/plain, mb))
			}
		}
		var p99s []string
		for _, impl := range []string{"plain", "max", "default"} {
			if r, ok := mv.median(s.name, impl, "p99-during/before"); ok {
				p99s = append(p99s, fmt.Sprintf("%.1fx", r))
			} else {
				p99s = append(p99s, "-")
			}
		}
		row = append(row, strings.Join(p99s, ", "))
		rows = append(rows, row)
	}
	table(w, []string{"values", "plain copy", "mover, NoYield", "mover, default", "readers' p99 during/before: plain, NoYield, default"}, rows)
	fmt.Fprintf(w, "Each figure is the median of %d benchmark line(s), each of MOVES_TIME scale-ups (-benchtime; 3 by default), whose keys/s and MB/s are over all of them and whose p99 ratio is their median.\n\n", len(mv.samples("1KB", "max", "keys/s")))
	return mv.goals(), nil
}

func (mv movesResults) goals() []goal {
	fastest := goal{goal: fmt.Sprintf("Moves: the mover at its fastest (NoYield) ≥ %.1fx a plain pipelined copy's keys/s, 100,000 keys of 32 B and of 1 KB (BenchmarkMoves)", goalMovesRatio)}
	worst, parts := 0.0, []string(nil)
	for _, s := range movesSizes {
		plain, ok1 := mv.median(s.name, "plain", "keys/s")
		max, ok2 := mv.median(s.name, "max", "keys/s")
		if !s.goal || !ok1 || !ok2 {
			continue
		}
		r := max / plain
		if parts == nil || r < worst {
			worst = r
		}
		parts = append(parts, fmt.Sprintf("%s %.2fx", s.name, r))
	}
	fastest.measured, fastest.pass = "not measured", false
	if parts != nil {
		fastest.measured, fastest.pass = strings.Join(parts, ", "), worst >= goalMovesRatio
	}
	p99 := goal{goal: fmt.Sprintf("Moves: the readers' p99 during a move at the default ≤ %.1fx their p99 before (BenchmarkMoves)", goalMovesP99)}
	var ratios []float64
	parts = nil
	for _, s := range movesSizes {
		if r, ok := mv.median(s.name, "default", "p99-during/before"); ok {
			ratios = append(ratios, r)
			parts = append(parts, fmt.Sprintf("%s %.1fx", s.name, r))
		}
	}
	p99.measured, p99.pass = "not measured", false
	if ratios != nil {
		p99.measured = strings.Join(parts, ", ")
		if plain, ok := mv.median("1KB", "plain", "p99-during/before"); ok {
			p99.measured += fmt.Sprintf(" (the plain copy's, 1 KB: %.1fx)", plain)
		}
		p99.pass = slices.Max(ratios) <= goalMovesP99
	}
	return []goal{fastest, p99}
}

// replaceGoals returns doc with the rows of the Goals table for gs in
// place of those of the same goal, or added at the table's end.
func replaceGoals(doc []byte, gs []goal) []byte {
	start, end := sectionBounds(doc, []byte("## Goals\n"), "\n## ")
	if start < 0 {
		return doc
	}
	part := string(doc[start:end])
	for _, g := range gs {
		row := fmt.Sprintf("| %s | %s | %s |\n", g.goal, g.measured, passMiss(g.pass))
		prefix := "| " + g.goal + " |"
		lines := strings.SplitAfter(part, "\n")
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
		if i < 0 { // after the table's last row
			i = slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "|") })
			for i >= 0 && i < len(lines) && strings.HasPrefix(lines[i], "|") {
				i++
			}
			if i < 0 {
				continue
			}
			lines = slices.Insert(lines, i, row)
		} else {
			lines[i] = row
		}
		part = strings.Join(lines, "")
	}
	out := append([]byte(nil), doc[:start]...)
	out = append(out, part...)
	return append(out, doc[end:]...)
}
