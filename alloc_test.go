package selector

import (
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
