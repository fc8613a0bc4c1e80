package selector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// A GetOrLoad that starts after this Client's own write of the key (a
// Set; a database update and Invalidate; a Delete) does not join a
// load that was in flight before the write, which returns the value it
// loaded then: it returns the write's value, or loads anew. The callers
// that joined before the write may return the older value.
func TestGetOrLoadAfterOwnWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(c *Client, db *testDB, key string)
		want  string // what the GetOrLoad after the write returns
	}{
		{"Set", func(c *Client, _ *testDB, key string) {
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("written")}))
		}, "written"},
		{"update and Invalidate", func(c *Client, db *testDB, key string) {
			db.update(key)
			require.NoError(t, c.Invalidate(context.Background(), key))
		}, "hot-v1"},
		{"update and Delete", func(c *Client, db *testDB, key string) {
			db.update(key)
			if err := c.Delete(key); err != nil {
				require.ErrorIs(t, err, memcache.ErrCacheMiss)
			}
		}, "hot-v1"},
	} {
		for _, pool := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pool %v", tc.name, pool), func(t *testing.T) {
				ms := startMemcached(t, 2)
				c, _ := newTestClient(t, addrsOf(ms))
				if pool {
					c, _ = newPoolClient(t, ms, []string{"", ""}, Replicated())
				}
				db := newTestDB()
				started, release := db.holdLoads()
				defer release()
				first := make(chan string, 1)
				go func() {
					it, err := c.GetOrLoad(context.Background(), "hot", LoadOptions{}, db.load)
					if err != nil {
						first <- err.Error()
						return
					}
					first <- string(it.Value)
				}()
				<-started // the first load runs, and has read hot-v0
				tc.write(c, db, "hot")
				after := make(chan string, 1)
				go func() {
					it, err := c.GetOrLoad(context.Background(), "hot", LoadOptions{}, func(ctx context.Context, key string) (*memcache.Item, error) {
						return &memcache.Item{Key: key, Value: []byte(db.value(key))}, nil
					})
					if err != nil {
						after <- err.Error()
						return
					}
					after <- string(it.Value)
				}()
				select {
				case got := <-after:
					require.Equal(t, tc.want, got, "a GetOrLoad after the write")
				case <-time.After(5 * time.Second):
					t.Fatal("a GetOrLoad after the write waited for the load that began before it")
				}
				release()
				require.Equal(t, "hot-v0", <-first, "the call that began before the write")
			})
		}
	}
}
