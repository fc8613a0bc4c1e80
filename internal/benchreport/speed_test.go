package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBench(t *testing.T) {
	const out = `goos: linux
BenchmarkPickServer/servers=3/impl=ours         	84152770	        13.40 ns/op	       0 B/op	       0 allocs/op
BenchmarkPickServer/servers=3/impl=ours         	84152770	        14.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkPickServer/servers=3/impl=ours         	84152770	        90.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkPickServerParallel/servers=10/impl=ours-2   	100	         8.70 ns/op
BenchmarkRebuild/members=1000/op=SetServers-2   	  22	  51300000 ns/op	  30400000 snapshot-B	30400000 B/op	    9044 allocs/op
PASS
`
	res := benchResults{}
	require.NoError(t, parseBench(strings.NewReader(out), res))

	m, ok := res.median("BenchmarkPickServer/servers=3/impl=ours", 1, "ns/op")
	require.True(t, ok)
	assert.Equal(t, 14.0, m)
	assert.Equal(t, 3, res.count("BenchmarkPickServer/servers=3/impl=ours", 1))

	m, ok = res.median("BenchmarkPickServerParallel/servers=10/impl=ours", 2, "ns/op")
	require.True(t, ok)
	assert.Equal(t, 8.7, m)
	_, ok = res.median("BenchmarkPickServerParallel/servers=10/impl=ours", 1, "ns/op")
	assert.False(t, ok, "there is no 1-CPU run")

	m, ok = res.median("BenchmarkRebuild/members=1000/op=SetServers", 2, "snapshot-B")
	require.True(t, ok)
	assert.Equal(t, 30400000.0, m)

	assert.Equal(t, []int{3, 10}, res.sizes("servers", "BenchmarkPickServer", "BenchmarkPickServerParallel"))
	assert.Equal(t, []int{1000}, res.sizes("members", "BenchmarkRebuild"))

	assert.Error(t, parseBench(strings.NewReader("BenchmarkX 10 abc ns/op\n"), benchResults{}))
}

func TestMedianEven(t *testing.T) {
	res := benchResults{"B": {1: {"ns/op": {4, 1, 3, 2}}}}
	m, ok := res.median("B", 1, "ns/op")
	require.True(t, ok)
	assert.Equal(t, 2.5, m)
}
