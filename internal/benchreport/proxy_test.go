package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxyOut is BenchmarkProxy's output in two rounds, with the paths through
// nutcracker not measured.
const proxyOut = `goos: linux
memcached: 1.6.18
nutcracker: none
server-connections: 1
BenchmarkProxy/op=get/impl=ours         	   37513	      9000 ns/op	      8000 p50-ns	     40000 p99-ns	     251 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=ours-2       	   10000	      6000 ns/op	     12000 p50-ns	    100000 p99-ns	     251 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=gomemcache   	   41868	     10000 ns/op	      8100 p50-ns	     41000 p99-ns	     252 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=gomemcache-2 	   25274	      6100 ns/op	     12100 p50-ns	    110000 p99-ns	     252 B/op	       5 allocs/op
--- NOT MEASURED: BenchmarkProxy/op=get/impl=twemproxy: nutcracker is not installed (apt-get install nutcracker): exec: "nutcracker": executable file not found in $PATH
BenchmarkProxy/op=get/impl=alternate    	   25672	     10000 ns/op	     10000 gomemcache-ns	     9000 gomemcache-p50-ns	     30000 gomemcache-p99-ns	     10100 ours-ns	     9090 ours-p50-ns	     29000 ours-p99-ns	     251 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=alternate-2  	   27157	     13475 ns/op	     20000 gomemcache-ns	    12000 gomemcache-p50-ns	     75000 gomemcache-p99-ns	     20400 ours-ns	    12360 ours-p50-ns	     74000 ours-p99-ns	     252 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=ours         	   37513	      9200 ns/op	      8000 p50-ns	     40000 p99-ns	     251 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=gomemcache   	   41868	     10000 ns/op	      8100 p50-ns	     41000 p99-ns	     252 B/op	       5 allocs/op
--- NOT MEASURED: BenchmarkProxy/op=get/impl=twemproxy: nutcracker is not installed (apt-get install nutcracker): exec: "nutcracker": executable file not found in $PATH
BenchmarkProxy/op=get/impl=alternate    	   25672	     10000 ns/op	     10000 gomemcache-ns	     9000 gomemcache-p50-ns	     30000 gomemcache-p99-ns	      9900 ours-ns	     8910 ours-p50-ns	     29000 ours-p99-ns	     251 B/op	       5 allocs/op
BenchmarkProxy/op=get/impl=alternate-2  	   27157	     13475 ns/op	     20000 gomemcache-ns	    12000 gomemcache-p50-ns	     75000 gomemcache-p99-ns	     20000 ours-ns	    12120 ours-p50-ns	     74000 ours-p99-ns	     252 B/op	       5 allocs/op
PASS
`

func TestParseProxy(t *testing.T) {
	run, err := parseProxy(strings.NewReader(proxyOut))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"memcached": "1.6.18", "nutcracker": "none", "server-connections": "1"}, run.config)
	assert.Equal(t, map[string]string{"twemproxy": `nutcracker is not installed (apt-get install nutcracker): exec: "nutcracker": executable file not found in $PATH`}, run.notMeasured)

	m, ok := run.res.median("BenchmarkProxy/op=get/impl=ours", 1, "ns/op")
	require.True(t, ok)
	assert.Equal(t, 9100.0, m)

	// Per-round ratios 1.01 and 0.99 at 1 CPU; 1.03 and 1.01 at 2.
	r, lo, hi, ok := run.ratio("get", "ours", "-p50", 1)
	require.True(t, ok)
	assert.InDelta(t, 1.00, r, 1e-9)
	assert.InDelta(t, 0.99, lo, 1e-9)
	assert.InDelta(t, 1.01, hi, 1e-9)
	r, _, _, ok = run.ratio("get", "ours", "-p50", 2)
	require.True(t, ok)
	assert.InDelta(t, 1.02, r, 1e-9)
	_, _, _, ok = run.ratio("get", "twemproxy", "-p50", 1)
	assert.False(t, ok, "twemproxy has no alternating figures")
}

func TestProxySection(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bench-proxy.out")
	require.NoError(t, os.WriteFile(file, []byte(proxyOut), 0o644))
	var w bytes.Buffer
	goals, err := proxy(&w, file)
	require.NoError(t, err)
	out := w.String()

	require.Len(t, goals, 5)
	assert.Contains(t, goals[3].measured, "not measured: no BenchmarkPool results")
	assert.True(t, goals[0].pass, "a 2%% overhead at the median passes: %+v", goals[0])
	assert.Contains(t, goals[0].measured, "worst p50 ratio 1.020 (2 CPU)")
	assert.False(t, goals[1].pass, "the Client was not measured")
	assert.Contains(t, goals[1].measured, "not measured: no BenchmarkProxy/op=get/impl=alternate results for client")
	assert.False(t, goals[2].pass, "the proxy tier was not measured")
	assert.Contains(t, goals[2].measured, "not measured: nutcracker is not installed")

	assert.Contains(t, out, "**twemproxy was not measured**: nutcracker is not installed")
	for _, op := range []string{"### Get", "### Set", "### GetMulti of 100 keys"} {
		assert.Contains(t, out, op)
	}
	assert.Contains(t, out, "| ours | 1 | 9.1 µs | 109.9k | 8.0 µs | 40.0 µs | 0.910 | 1.000 (0.990–1.010) | 1.000 (0.990–1.010) | 0.967 (0.967–0.967) | 2 |")
	assert.Contains(t, out, "| twemproxy | 1 | not measured (above) |")
	assert.Contains(t, out, "| ours | 1 | not measured |", "Set has no results in this output")

	// Over 2% at the median is a miss.
	bad := strings.ReplaceAll(proxyOut, "12360 ours-p50-ns", "12400 ours-p50-ns")
	bad = strings.ReplaceAll(bad, "12120 ours-p50-ns", "12400 ours-p50-ns")
	require.NoError(t, os.WriteFile(file, []byte(bad), 0o644))
	goals, err = proxy(&bytes.Buffer{}, file)
	require.NoError(t, err)
	assert.False(t, goals[0].pass, "%+v", goals[0])
}

func TestPoolSection(t *testing.T) {
	out := `BenchmarkPool/op=get/impl=alternate         	    5000	     30389 ns/op	     25337 replicated-ns	     12000 replicated-p50-ns	     95245 replicated-p99-ns	     35435 sharded-ns	     12000 sharded-p50-ns	    100795 sharded-p99-ns
BenchmarkPool/op=get/impl=alternate-2       	    5000	     25977 ns/op	     51483 replicated-ns	     50000 replicated-p50-ns	    126027 replicated-p99-ns	     52400 sharded-ns	     49000 sharded-p50-ns	    134065 sharded-p99-ns
BenchmarkPool/op=set/impl=alternate         	    5000	     65218 ns/op	     78801 replicated-ns	     77000 replicated-p50-ns	    160154 replicated-p99-ns	     51630 sharded-ns	     55000 sharded-p50-ns	    106104 sharded-p99-ns
BenchmarkPool/op=set/impl=alternate-2       	    5000	     41358 ns/op	    104388 replicated-ns	    130000 replicated-p50-ns	    205910 replicated-p99-ns	     60987 sharded-ns	     57000 sharded-p50-ns	    144592 sharded-p99-ns
`
	run, err := parseProxy(strings.NewReader(out))
	require.NoError(t, err)
	var w bytes.Buffer
	gs := run.poolSection(&w)
	assert.True(t, gs[0].pass, "%+v", gs[0])
	assert.Contains(t, gs[0].measured, "1.000 (1 CPU), 1.020 (2 CPU)")
	assert.False(t, gs[1].pass, "a Set at 2.28x one round trip misses: %+v", gs[1])
	assert.Contains(t, w.String(), "| set | 1 | 55.0 µs | 77.0 µs | 1.400 (1.400–1.400) | 1 |")
}
