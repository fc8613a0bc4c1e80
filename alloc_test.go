package selector

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestClientAllocs checks that the Client's Get and Set allocate no more
// than gomemcache's own over the same server: the gate and the cleanup cost
// nothing on the hot path.
func TestClientAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts vary under the race detector; make unit runs this without it")
	}
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	gm := memcache.NewFromSelector(ss)
	it := &memcache.Item{Key: "alloc-key", Value: []byte("value")}
	require.NoError(t, c.Set(it))
	for name, pair := range map[string][2]func(){
		"Get": {func() { c.Get(it.Key) }, func() { gm.Get(it.Key) }},
		"Set": {func() { c.Set(it) }, func() { gm.Set(it) }},
	} {
		ours, theirs := testing.AllocsPerRun(200, pair[0]), testing.AllocsPerRun(200, pair[1])
		t.Logf("%s: %.1f allocations, gomemcache %.1f", name, ours, theirs)
		require.LessOrEqual(t, ours, theirs, name)
	}
}

// TestGetMultiAllocs checks that the Client's GetMulti of 100 keys over 3
// servers, all hits, allocates no more, in number and in bytes, than
// gomemcache's own over the same servers: the batches are read into one
// result map, without a map or a goroutine per server.
func TestGetMultiAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts vary under the race detector; make unit runs this without it")
	}
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	gm := memcache.NewFromSelector(ss)
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("getmulti-alloc:%d", i)
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: make([]byte, 100)}))
	}
	for name, get := range map[string]func() (map[string]*memcache.Item, error){
		"client":     func() (map[string]*memcache.Item, error) { return c.GetMulti(keys) },
		"gomemcache": func() (map[string]*memcache.Item, error) { return gm.GetMulti(keys) },
	} {
		m, err := get()
		require.NoError(t, err, name)
		require.Len(t, m, len(keys), name)
	}
	run := func(get func([]string) (map[string]*memcache.Item, error)) (allocs, bytes float64) {
		f := func() { get(keys) }
		allocs = testing.AllocsPerRun(100, f)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 100 {
			f()
		}
		runtime.ReadMemStats(&after)
		return allocs, float64(after.TotalAlloc-before.TotalAlloc) / 100
	}
	ours, oursB := run(c.GetMulti)
	theirs, theirsB := run(gm.GetMulti)
	t.Logf("GetMulti of %d keys over 3 servers: %.1f allocations, %.0f bytes; gomemcache %.1f, %.0f", len(keys), ours, oursB, theirs, theirsB)
	require.LessOrEqual(t, ours, theirs, "allocations")
	require.LessOrEqual(t, oursB, theirsB, "bytes")
}
