package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vsOut is BenchmarkClientVsGomemcache's output in two rounds, at
// GOMAXPROCS 2, with a Client that meets every goal.
const vsOut = `memcached: 1.6.18
goroutines: 64
gomemcache-best-max-idle-conns: 64
gomemcache-default-max-idle-conns: 2
goos: linux
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=client-2               	   10000	      9000 ns/op	     1 conns/server	     1 dials/server	  111111 ops/s	    30000 p50-ns	   150000 p99-ns	   120 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=gomemcache-best-2      	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    31000 p50-ns	   148000 p99-ns	   252 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=gomemcache-default-2   	   10000	     10100 ns/op	     1 conns/server	     1 dials/server	   99010 ops/s	    31000 p50-ns	   141000 p99-ns	   252 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=client-2               	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    29000 p50-ns	   140000 p99-ns	    48 B/op	   2 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=gomemcache-best-2      	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    29000 p50-ns	   168000 p99-ns	    48 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=gomemcache-default-2   	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    30000 p50-ns	   158000 p99-ns	    48 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=client-2              	   10000	     16000 ns/op	     2 conns/server	     2 dials/server	   62500 ops/s	   900000 p50-ns	  5000000 p99-ns	   130 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=gomemcache-best-2     	   10000	     40000 ns/op	    62 conns/server	    62 dials/server	   25000 ops/s	   940000 p50-ns	  7000000 p99-ns	   282 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=gomemcache-default-2  	   10000	     62000 ns/op	    41 conns/server	   735 dials/server	   16129 ops/s	  3300000 p50-ns	 11000000 p99-ns	  4357 B/op	  18 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=client-2              	   10000	     18000 ns/op	     2 conns/server	     2 dials/server	   55556 ops/s	  1200000 p50-ns	  6000000 p99-ns	    60 B/op	   2 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=gomemcache-best-2     	   10000	     38000 ns/op	    46 conns/server	    46 dials/server	   26316 ops/s	  1300000 p50-ns	 11000000 p99-ns	    63 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=gomemcache-default-2  	   10000	     67000 ns/op	    41 conns/server	   669 dials/server	   14925 ops/s	  3500000 p50-ns	 13000000 p99-ns	  4119 B/op	  16 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=client-2          	   10000	    300000 ns/op	     1 conns/server	     1 dials/server	    3333 ops/s	   290000 p50-ns	   900000 p99-ns	 30000 B/op	 200 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=gomemcache-best-2 	   10000	    460000 ns/op	     1 conns/server	     1 dials/server	    2174 ops/s	   410000 p50-ns	  1400000 p99-ns	 37111 B/op	 347 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=gomemcache-default-2 	   10000	    470000 ns/op	     1 conns/server	     1 dials/server	    2128 ops/s	   400000 p50-ns	  2200000 p99-ns	 37113 B/op	 347 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=client-2               	   10000	      9500 ns/op	     1 conns/server	     1 dials/server	  105263 ops/s	    30000 p50-ns	   150000 p99-ns	   120 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=gomemcache-best-2      	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    31000 p50-ns	   148000 p99-ns	   252 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=1/impl=gomemcache-default-2   	   10000	     10200 ns/op	     1 conns/server	     1 dials/server	   98039 ops/s	    31000 p50-ns	   141000 p99-ns	   252 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=client-2               	   10000	      9800 ns/op	     1 conns/server	     1 dials/server	  102041 ops/s	    29000 p50-ns	   140000 p99-ns	    48 B/op	   2 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=gomemcache-best-2      	   10000	     10000 ns/op	     1 conns/server	     1 dials/server	  100000 ops/s	    29000 p50-ns	   168000 p99-ns	    48 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=1/impl=gomemcache-default-2   	   10000	     10100 ns/op	     1 conns/server	     1 dials/server	   99010 ops/s	    30000 p50-ns	   158000 p99-ns	    48 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=client-2              	   10000	     18000 ns/op	     2 conns/server	     2 dials/server	   55556 ops/s	   900000 p50-ns	  5000000 p99-ns	   130 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=gomemcache-best-2     	   10000	     40000 ns/op	    62 conns/server	    62 dials/server	   25000 ops/s	   940000 p50-ns	  7000000 p99-ns	   282 B/op	   5 allocs/op
BenchmarkClientVsGomemcache/op=get/goroutines=64/impl=gomemcache-default-2  	   10000	     61000 ns/op	    41 conns/server	   735 dials/server	   16393 ops/s	  3300000 p50-ns	 11000000 p99-ns	  4357 B/op	  18 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=client-2              	   10000	     19500 ns/op	     2 conns/server	     2 dials/server	   51282 ops/s	  1200000 p50-ns	  6000000 p99-ns	    60 B/op	   2 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=gomemcache-best-2     	   10000	     38000 ns/op	    46 conns/server	    46 dials/server	   26316 ops/s	  1300000 p50-ns	 11000000 p99-ns	    63 B/op	   3 allocs/op
BenchmarkClientVsGomemcache/op=set/goroutines=64/impl=gomemcache-default-2  	   10000	     66000 ns/op	    41 conns/server	   669 dials/server	   15152 ops/s	  3500000 p50-ns	 13000000 p99-ns	  4119 B/op	  16 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=client-2          	   10000	    310000 ns/op	     1 conns/server	     1 dials/server	    3226 ops/s	   290000 p50-ns	   900000 p99-ns	 30000 B/op	 200 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=gomemcache-best-2 	   10000	    460000 ns/op	     1 conns/server	     1 dials/server	    2174 ops/s	   410000 p50-ns	  1400000 p99-ns	 37111 B/op	 347 allocs/op
BenchmarkClientVsGomemcache/op=getmulti/goroutines=1/impl=gomemcache-default-2 	   10000	    468000 ns/op	     1 conns/server	     1 dials/server	    2137 ops/s	   400000 p50-ns	  2200000 p99-ns	 37113 B/op	 347 allocs/op
PASS
`

// withMetric returns out with the unit of bench's lines set to vals, the
// i-th line's to vals[i] (the last for any beyond).
func withMetric(t *testing.T, out, bench, unit string, vals ...float64) string {
	t.Helper()
	lines := strings.Split(out, "\n")
	n := 0
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != bench+"-2" {
			continue
		}
		for j := 3; j < len(f); j += 2 {
			if f[j] == unit {
				f[j-1] = strconv.FormatFloat(vals[min(n, len(vals)-1)], 'f', -1, 64)
			}
		}
		lines[i] = strings.Join(f, "\t")
		n++
	}
	require.NotZero(t, n, "no lines of %s", bench)
	return strings.Join(lines, "\n")
}

func TestVsGomemcache(t *testing.T) {
	const b = "BenchmarkClientVsGomemcache/op="
	tests := []struct {
		name string
		out  func(t *testing.T) string
		// The goals in order: latency, allocations, throughput, p99,
		// connections, GetMulti; with a part of each one's measured.
		pass     [6]bool
		measured [6]string
	}{{
		name: "all pass",
		out:  func(*testing.T) string { return vsOut },
		pass: [6]bool{true, true, true, true, true, true},
		measured: [6]string{
			"Get 0.925x, Set 0.990x (gomemcache-default: Get 1.015x, Set 1.005x)",
			"Get 3 vs 5 allocs/op (120 vs 252 B/op), Set 2 vs 3 allocs/op (48 vs 48 B/op)",
			"Get 2.361x, Set 2.030x (gomemcache-default: Get 0.650x, Set 0.571x)",
			"Get 0.714x, Set 0.545x",
			"the Client: at most Get 2, Set 2 open to one server, dials Get 2, Set 2; gomemcache's dials per server: best Get 62, Set 46; default Get 735, Set 669",
			"GetMulti 0.663x (gomemcache-default: GetMulti 1.020x)",
		},
	}, {
		name: "Get 1 goroutine slower than gomemcache",
		out: func(t *testing.T) string {
			return withMetric(t, vsOut, b+"get/goroutines=1/impl=client", "ns/op", 10400, 10600)
		},
		pass:     [6]bool{false, true, true, true, true, true},
		measured: [6]string{"Get 1.050x, Set 0.990x"},
	}, {
		name: "Set allocates more",
		out: func(t *testing.T) string {
			return withMetric(t, vsOut, b+"set/goroutines=1/impl=client", "allocs/op", 4)
		},
		pass:     [6]bool{true, false, true, true, true, true},
		measured: [6]string{1: "Set 4 vs 3 allocs/op"},
	}, {
		name: "Set throughput under 2x, worse p99, connections unbounded",
		out: func(t *testing.T) string {
			out := withMetric(t, vsOut, b+"set/goroutines=64/impl=client", "ops/s", 40000, 45000)
			out = withMetric(t, out, b+"set/goroutines=64/impl=client", "p99-ns", 12000000)
			out = withMetric(t, out, b+"get/goroutines=64/impl=client", "conns/server", 2, 44)
			return withMetric(t, out, b+"get/goroutines=64/impl=client", "dials/server", 2, 658)
		},
		pass:     [6]bool{true, true, false, false, false, true},
		measured: [6]string{2: "Get 2.361x, Set 1.615x", 3: "Set 1.091x", 4: "at most Get 44, Set 2 open to one server, dials Get 330, Set 2"},
	}, {
		name: "GetMulti above 0.7x",
		out: func(t *testing.T) string {
			return withMetric(t, vsOut, b+"getmulti/goroutines=1/impl=client", "ns/op", 330000, 320000)
		},
		pass:     [6]bool{true, true, true, true, true, false},
		measured: [6]string{5: "GetMulti 0.707x"},
	}, {
		name: "not measured",
		out: func(*testing.T) string {
			return "--- NOT MEASURED: BenchmarkClientVsGomemcache: memcached is not installed\nPASS\n"
		},
		measured: [6]string{"not measured: memcached is not installed", "not measured: memcached is not installed", "not measured: memcached is not installed", "not measured: memcached is not installed", "not measured: memcached is not installed", "not measured: memcached is not installed"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "bench-client.out")
			require.NoError(t, os.WriteFile(file, []byte(tt.out(t)), 0o644))
			var w bytes.Buffer
			goals, err := vsGomemcache(&w, file)
			require.NoError(t, err)
			require.Len(t, goals, 6)
			for i, g := range goals {
				assert.Equal(t, tt.pass[i], g.pass, "goal %d: %+v", i, g)
				assert.Contains(t, g.measured, tt.measured[i], "goal %d", i)
			}
			assert.Contains(t, w.String(), "## The Client against gomemcache")
		})
	}
}

func TestVsGomemcacheSection(t *testing.T) {
	v, err := parseVs(strings.NewReader(vsOut))
	require.NoError(t, err)
	assert.Equal(t, 2, v.procs)
	assert.Equal(t, "1.6.18", v.config["memcached"])
	var w bytes.Buffer
	v.section(&w)
	out := w.String()
	assert.Contains(t, out, "MaxIdleConns 64 (at least the goroutines")
	assert.Contains(t, out, "default MaxIdleConns of 2")
	for _, row := range []string{
		"| Get, 1 goroutine | client | 9.2 µs | 108.2k | 30.0 µs | 150.0 µs | 120 | 3 | 1 | 1 | 0.925 (0.900–0.950) | 1.082 (1.053–1.111) | 1.014 (1.014–1.014) | 2 |",
		"| Get, 1 goroutine | gomemcache-best | 10.0 µs | 100.0k | 31.0 µs | 148.0 µs | 252 | 5 | 1 | 1 | 1 | 1 | 1 | 2 |",
		"| Get, 64 goroutines | gomemcache-default | 61.5 µs | 16.3k | 3.3 ms | 11.0 ms | 4357 | 18 | 41 | 735 |",
		"| GetMulti of 100 keys, 1 goroutine | client | 305.0 µs |",
	} {
		assert.Contains(t, out, row)
	}
	assert.Equal(t, 1, strings.Count(out, "| op | impl |"))

	// Without results, the rows say so.
	v, err = parseVs(strings.NewReader("PASS\n"))
	require.NoError(t, err)
	w.Reset()
	v.section(&w)
	assert.Contains(t, w.String(), "| Set, 64 goroutines | client | not measured |")
}
