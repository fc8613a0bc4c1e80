package selector

import (
	"testing"

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
			all := new(ServerList)
			require.NoError(t, all.SetServers(addrsOf(ms)...))
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
