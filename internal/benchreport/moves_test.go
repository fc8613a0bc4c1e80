package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

const movesOut = `goos: linux
BenchmarkMoves/value=32B/impl=plain-2         	       1	1700000000 ns/op	         3.5 p99-during/before	       600.0 p99-before-µs	58777 keys/s	 1.88 MB/s
BenchmarkMoves/value=32B/impl=max-2           	       1	1900000000 ns/op	         3.5 p99-during/before	       610.0 p99-before-µs	35019 keys/s	 1.12 MB/s
BenchmarkMoves/value=32B/impl=default-2       	       1	2100000000 ns/op	         2.8 p99-during/before	       620.0 p99-before-µs	30632 keys/s	 0.98 MB/s
BenchmarkMoves/value=1KB/impl=plain-2         	       1	1700000000 ns/op	         3.5 p99-during/before	       600.0 p99-before-µs	49104 keys/s	50.3 MB/s
BenchmarkMoves/value=1KB/impl=max-2           	       1	1900000000 ns/op	         4.5 p99-during/before	       610.0 p99-before-µs	30446 keys/s	31.2 MB/s
BenchmarkMoves/value=1KB/impl=default-2       	       1	2100000000 ns/op	         3.3 p99-during/before	       620.0 p99-before-µs	29159 keys/s	29.9 MB/s
BenchmarkMoves/value=16KB/impl=plain-2        	       1	1700000000 ns/op	         4.4 p99-during/before	       600.0 p99-before-µs	11985 keys/s	196.4 MB/s
BenchmarkMoves/value=16KB/impl=max-2          	       1	1900000000 ns/op	         2.8 p99-during/before	       610.0 p99-before-µs	 9882 keys/s	161.9 MB/s
BenchmarkMoves/value=16KB/impl=default-2      	       1	2100000000 ns/op	         2.0 p99-during/before	       620.0 p99-before-µs	 4202 keys/s	68.8 MB/s
PASS
`

func TestMovesSection(t *testing.T) {
	path := t.TempDir() + "/moves.out"
	writeFile(t, path, movesOut)
	var w bytes.Buffer
	gs, err := movesSection(&w, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Moves\n",
		"| 1KB | 49,104 keys/s, 50.3 MB/s | 30,446 keys/s (0.62x), 31.2 MB/s | 29,159 keys/s (0.59x), 29.9 MB/s | 3.5x, 4.5x, 3.3x |",
		"| 16KB | 11,985 keys/s, 196.4 MB/s | 9,882 keys/s (0.82x), 161.9 MB/s | 4,202 keys/s (0.35x), 68.8 MB/s | 4.4x, 2.8x, 2.0x |",
	} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("section lacks %q:\n%s", want, w.String())
		}
	}
	if len(gs) != 2 {
		t.Fatalf("goals: %+v", gs)
	}
	if g := gs[0]; !g.pass || g.measured != "32B 0.60x, 1KB 0.62x" {
		t.Errorf("the fastest mover's goal: %+v", g)
	}
	if g := gs[1]; g.pass || g.measured != "32B 2.8x, 1KB 3.3x, 16KB 2.0x (the plain copy's, 1 KB: 3.5x)" {
		t.Errorf("the readers' p99 goal: %+v", g)
	}
}

func TestMovesSectionEmpty(t *testing.T) {
	path := t.TempDir() + "/moves.out"
	writeFile(t, path, "PASS\n")
	if _, err := movesSection(new(bytes.Buffer), path); err == nil {
		t.Error("no results: no error")
	}
}

func TestReplaceGoals(t *testing.T) {
	doc := "# R\n\n## Goals\n\n| goal | measured | result |\n|---|---|---|\n| A | 1 | PASS |\n| B | 2 | MISS |\n\n## Speed\n\n| x |\n"
	for _, tc := range []struct {
		name string
		gs   []goal
		want string
	}{
		{"replaced", []goal{{"B", "3", true}}, "# R\n\n## Goals\n\n| goal | measured | result |\n|---|---|---|\n| A | 1 | PASS |\n| B | 3 | PASS |\n\n## Speed\n\n| x |\n"},
		{"added", []goal{{"C", "4", false}}, "# R\n\n## Goals\n\n| goal | measured | result |\n|---|---|---|\n| A | 1 | PASS |\n| B | 2 | MISS |\n| C | 4 | MISS |\n\n## Speed\n\n| x |\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(replaceGoals([]byte(doc), tc.gs)); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}
