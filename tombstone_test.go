package selector

import (
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// A Delete by a Client started after a change (no past rings: it deletes
// at the key's new server alone) holds against the copies of a Client that
// saw the change: its read handoffs and its mover. Without tombstones, 16
// of 16 deleted keys came back.
func TestDeleteByANewClientHolds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moves Moves
	}{
		{"read handoff", Moves{Rate: -1}},
		{"mover", Moves{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 3)
			old, oldList := newTestClient(t, addrsOf(ms[:2]), WithMoves(tc.moves))
			all := listOf(t, addrsOf(ms)...)
			keys := keysOf(t, all, ms[2].addr, 16)
			for _, k := range keys {
				require.NoError(t, old.Set(&memcache.Item{Key: k, Value: []byte("before the change")}))
			}
			require.NoError(t, oldList.SetServers(addrsOf(ms)...))
			eventually(t, "the old client to see the change", func() bool { return len(old.rt.Load().past) > 0 })

			fresh, _ := newTestClient(t, addrsOf(ms))
			for _, k := range keys {
				if err := fresh.Delete(k); err != nil {
					require.ErrorIs(t, err, memcache.ErrCacheMiss, "the key's new server does not hold %s", k)
				}
			}
			if tc.moves.Rate >= 0 {
				movesDone(t, old, 1)
			}
			for _, k := range keys {
				_, err := old.Get(k)
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s, deleted, read by the client that saw the change", k)
				_, err = fresh.Get(k)
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s, deleted, came back for the client that deleted it", k)
			}
		})
	}
}

// BenchmarkDeleteTombstone measures what a tombstone costs a Delete: a
// Client in its handoff window from its start (young) against one past it,
// over one real memcached, sequential requests; and the memory the
// tombstones take there (bytes a tombstone, from memcached's stats).
func BenchmarkDeleteTombstone(b *testing.B) {
	for _, tc := range []struct {
		name  string
		young bool
	}{{"past-window", false}, {"young", true}} {
		b.Run(tc.name, func(b *testing.B) {
			ms := startMemcached(b, 1)
			ss := new(ServerList)
			require.NoError(b, ss.SetServers(ms[0].addr))
			c, err := NewClientFromList(ss, WithMoves(Moves{Rate: -1}))
			require.NoError(b, err)
			defer c.Close()
			if !tc.young {
				c.tombs.born = time.Now().Add(-2 * c.tombs.window)
			}
			before := statOf(b, ms[0].addr, "bytes")
			b.ResetTimer()
			for i := range b.N {
				c.Delete(fmt.Sprint("tomb-", i))
			}
			b.StopTimer()
			b.ReportMetric(float64(statOf(b, ms[0].addr, "bytes")-before)/float64(b.N), "server-bytes/op")
		})
	}
}
