package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A piece of make histcheck-long's output: per-subtest reports, then the
// closing block, which marks the known gaps.
const histOut = `=== RUN   TestHistory/none/client
    histcheck_test.go:85: 
        none               client                ops=153758  stale=0     errors=0     hit= 80.5% unknown=0 seed=5 (20.7s)
          start 258ms, fill 178ms, close 2ms
        none               gomemcache            ops=153625  stale=0     errors=0     hit= 81.3% unknown=0 seed=5 (20.6s)
        move-back          client                ops=1000    stale=2     errors=0     hit= 79.4% unknown=0 seed=6 (21.6s)
        move-back          gomemcache            ops=72081   stale=1684  errors=6     hit= 80.1% unknown=0 seed=6 (21.6s)
    histcheck_test.go:94: seed 5
        none               client                ops=153758  stale=0     errors=0     hit= 80.5% unknown=0 seed=5 (20.7s)
        none               client-replicated     ops=91024   stale=0     errors=0     hit= 79.0% unknown=0 seed=5 (20.7s)
        none               gomemcache            ops=153625  stale=0     errors=0     hit= 81.3% unknown=0 seed=5 (20.6s)
        move-back          client                ops=1000    stale=2     errors=0     hit= 79.4% unknown=0 seed=6 (21.6s)
        move-back          gomemcache            ops=72081   stale=1684  errors=6     hit= 80.1% unknown=0 seed=6 (21.6s)
        kill-fast          client                ops=5005    stale=0     errors=3     hit= 60.1% unknown=0 kill-errors=1/3 seed=8 (2.1s)
        unseen-change      client                ops=123097  stale=238   errors=19    hit= 77.8% unknown=0 seed=7 (22.7s) known-gap
        unseen-change      gomemcache            ops=132182  stale=2833  errors=6     hit= 79.4% unknown=0 seed=7 (22.5s) known-gap
`

func TestHistcheckSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "histcheck-long.out")
	require.NoError(t, os.WriteFile(path, []byte(histOut), 0o644))
	var b bytes.Buffer
	require.NoError(t, histcheckSection(&b, path))
	out := b.String()
	for _, want := range []string{
		"| none | 153,758, 0, 80.5% | 91,024, 0, 79.0% | 153,625, 0, 81.3% |",
		"| move-back | 1,000, 2, 79.4% | - | 72,081, 1,684, 80.1% |",
		"| **all of the above** | **159,763, 2** | **91,024, 0** | **225,706, 1,684** |",
		"| unseen-change (known gap) | 123,097, 238, 77.8% | - | 132,182, 2,833, 79.4% |",
		"| kill-fast | 5,005, 0, 60.1% | - | - |",
		"after the kills (the kill's phases; a client could spare / all: an Increment on a broken connection may have applied, so no client sends it again): kill-fast client 1/3.",
	} {
		require.Contains(t, out, want)
	}
	require.Less(t, strings.Index(out, "all of the above"), strings.Index(out, "unseen-change"), "the known gaps come after the totals, which leave them out")
	require.Equal(t, 1, strings.Count(out, "| none |"), "a schedule once, however often its line is printed")

	require.NoError(t, os.WriteFile(path, []byte("no summary here\n"), 0o644))
	require.ErrorContains(t, histcheckSection(&b, path), "no summary lines")
}

// TestHistcheckSectionPerServer: one table per run, each headed by the
// memcached version its run noted, under one heading.
func TestHistcheckSectionPerServer(t *testing.T) {
	dir := t.TempDir()
	old, newest := filepath.Join(dir, "histcheck-long.out"), filepath.Join(dir, "histcheck-long-newest.out")
	require.NoError(t, os.WriteFile(old, []byte("    histcheck_test.go:80: server: memcached 1.6.18\n"+histOut), 0o644))
	require.NoError(t, os.WriteFile(newest, []byte("    histcheck_test.go:80: server: memcached 1.6.45\n"+histOut), 0o644))
	var b bytes.Buffer
	require.NoError(t, histcheckSection(&b, old+","+newest))
	out := b.String()
	require.Equal(t, 1, strings.Count(out, "## History checker (long run)"))
	i, j := strings.Index(out, "### memcached 1.6.18 ("), strings.Index(out, "### memcached 1.6.45 (")
	require.True(t, i >= 0 && j > i, "a table per version, in the order given:\n%s", out)
	require.Equal(t, 2, strings.Count(out, "| **all of the above** | **159,763, 2** |"))

	require.ErrorContains(t, histcheckSection(&b, old+","+filepath.Join(dir, "missing.out")), "missing.out")
}
