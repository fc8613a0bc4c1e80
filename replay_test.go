package selector

import (
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestCloseReplaysTheLog: a server out for one Client alone (its requests
// time out there) is up for the others. The keys that Client wrote at a
// stand-in meanwhile are logged for the server, to be deleted there when it
// is back; a Client closed before then deletes them as it closes. Lost with
// it, the server's older values would be served to every other client, and
// to the one started in its place (an application pod that rolls: the
// history checker's unseen-change schedule, under load, 71 stale reads in a
// run, each a server out for the Client that the run then replaced).
func TestCloseReplaysTheLog(t *testing.T) {
	ms := startMemcached(t, 2)
	var f faults
	c, ss := newTestClient(t, addrsOf(ms), f.option(), WithFailover(Failover{Timeouts: 1, ProbeFirst: time.Minute, ProbeMax: time.Minute}))
	keys := keysOf(t, ss, ms[0].addr, 50)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v0")}))
	}

	f.set(ms[0].addr, true, 0) // its requests time out, for c alone
	eventually(t, "the server to be out", func() bool {
		c.Get(keys[0])
		return stateOf(c, ms[0].addr).State == ServerOut
	})
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v1")}), "at the stand-in")
	}
	f.set(ms[0].addr, false, 0)
	require.Equal(t, ServerOut, stateOf(c, ms[0].addr).State, "not probed again before Close")
	require.NoError(t, c.Close())

	next, _ := newTestClient(t, addrsOf(ms)) // the Client started in c's place
	for _, k := range keys {
		_, err := direct(ms[0].addr).Get(k)
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s: the value from before the outage is left at its server", k)
		if it, err := next.Get(k); err == nil {
			require.Equal(t, "v1", string(it.Value), k)
		}
	}
}
