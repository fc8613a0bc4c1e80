package selector

import (
	"context"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// Every copy path keeps an item's expiration exactly, relative or
// absolute. memcached reads an expiration above 30 days as a unix time: a
// copy that sent the remaining seconds of a value 60 days from expiring
// expired at once, after its source was deleted.
func TestCopiesKeepExpirations(t *testing.T) {
	const day = 24 * 3600
	for _, exp := range []struct {
		name string
		exp  func() int32 // the item's Expiration, as a gomemcache user sets it
		ttl  int          // what is left of it, in seconds
	}{
		{"relative, 1 hour", func() int32 { return 3600 }, 3600},
		{"absolute, 60 days ahead", func() int32 { return int32(time.Now().Unix()) + 60*day }, 60 * day},
	} {
		for _, path := range []struct {
			name string
			copy func(t *testing.T, it *memcache.Item) (holder string)
		}{
			{"handoff", func(t *testing.T, it *memcache.Item) string {
				c, at := setBeforeScaleUp(t, it)
				_, err := c.Get(it.Key)
				require.NoError(t, err)
				return at
			}},
			{"GetOrLoad's handoff", func(t *testing.T, it *memcache.Item) string {
				c, at := setBeforeScaleUp(t, it)
				_, err := c.GetOrLoad(context.Background(), it.Key, LoadOptions{}, func(context.Context, string) (*memcache.Item, error) {
					t.Fatal("loaded: the value was not handed off")
					return nil, nil
				})
				require.NoError(t, err)
				return at
			}},
			{"move", func(t *testing.T, it *memcache.Item) string {
				ms := startMemcached(t, 3)
				c, ss := newTestClient(t, addrsOf(ms[:2]))
				it.Key = keysOf(t, listOf(t, addrsOf(ms)...), ms[2].addr, 1)[0]
				require.NoError(t, c.Set(it))
				require.NoError(t, ss.SetServers(addrsOf(ms)...))
				require.Equal(t, 1, movesDone(t, c, 1).Moved)
				return ms[2].addr
			}},
			{"pool repair", func(t *testing.T, it *memcache.Item) string {
				ms := startMemcached(t, 2)
				c, _ := newPoolClient(t, ms, []string{"", ""}, Replicated().WithMissFailover())
				it.Key = "repaired"
				// A replica lost it (evicted, or restarted empty): a read
				// that misses there first, then hits, repairs it. Which
				// replica a client reads first is its own order.
				for _, lost := range ms {
					require.NoError(t, c.Set(it))
					require.NoError(t, direct(lost.addr).Delete(it.Key))
					_, err := c.Get(it.Key)
					require.NoError(t, err)
					if holders(ms, it.Key) == 2 {
						return lost.addr
					}
				}
				t.Fatal("no read repaired the replica that lost the key")
				return ""
			}},
		} {
			t.Run(exp.name+"/"+path.name, func(t *testing.T) {
				it := &memcache.Item{Value: []byte("v"), Expiration: exp.exp()}
				at := path.copy(t, it)
				require.InDelta(t, exp.ttl, metaTTL(t, at, it.Key), 5, "the copy's remaining expiration")
			})
		}
	}
}

// setBeforeScaleUp sets it, under a key that the third of 3 servers owns,
// through a Client of the first two with moves off, then scales the Client
// up to all 3: a read of the key hands it off to the address it returns.
func setBeforeScaleUp(t *testing.T, it *memcache.Item) (*Client, string) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]), WithMoves(Moves{Rate: -1}))
	it.Key = keysOf(t, listOf(t, addrsOf(ms)...), ms[2].addr, 1)[0]
	require.NoError(t, c.Set(it))
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see the new server", func() bool { return len(c.rt.Load().baseSrv) == 3 })
	return c, ms[2].addr
}
