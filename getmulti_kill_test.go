package selector

import (
	"fmt"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// A GetMulti right after one of its servers was killed (SIGKILL) costs
// the application no error: the batch whose connection broke, then whose
// server refused, is sent again to the keys' servers then (a stand-in,
// where they miss). The retry succeeded before, but the first attempt's
// error was returned all the same (the history checker's kill schedules:
// "getmulti: broken pipe", "getmulti: connection refused").
func TestGetMultiAfterKill(t *testing.T) {
	ms := startMemcached(t, 3)
	c, _ := newTestClient(t, addrsOf(ms))
	var keys []string
	for i := range 60 {
		keys = append(keys, fmt.Sprint("gm-", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("v")}))
	}
	for round := range 3 {
		got, err := c.GetMulti(keys) // the connections to every server are open
		require.NoError(t, err)
		require.Len(t, got, len(keys), "round %d, before the kill", round)
		ms[0].kill()
		got, err = c.GetMulti(keys)
		require.NoError(t, err, "round %d: a GetMulti after a kill", round)
		require.Less(t, len(got), len(keys), "the killed server's keys miss")
		ms[0].restart()
		eventually(t, "the server back", func() bool { return stateOf(c, ms[0].addr).State == "up" })
		for _, k := range keys {
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v")}))
		}
	}
}
