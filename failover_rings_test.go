package selector

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestFailoverKeepsWritesOnEveryRing takes one server out (killed) of pools
// of each ring and writes 3,000 keys: every acknowledged Set is read back
// while the server is out. Ketama rebuilds its continuum without the server
// out, as libmemcached does, and that moves about 2.4% of the keys between
// servers that are up (a server's points depend on the number of servers):
// the cleanup after such a write took the key's new server for a stand-in
// of its old one, and deleted the value just written (62-78 of 3,000 lost).
func TestFailoverKeepsWritesOnEveryRing(t *testing.T) {
	const keys = 3000
	for _, tc := range []struct {
		name    string
		hashing func(addrs []string) Hashing
		servers int
	}{
		{"ketama 26 servers", func([]string) Hashing { return Ketama() }, 26},
		{"ketama weights 1 1 2", func(a []string) Hashing { return Ketama().WithWeights(map[string]int{a[2]: 2}) }, 3},
		{"ketama 5 servers", func([]string) Hashing { return Ketama() }, 5},
		{"ch3 26 servers", func([]string) Hashing { return Ch3() }, 26},
		{"ch3 5 servers", func([]string) Hashing { return Ch3() }, 5},
		{"default ring 26 servers", func([]string) Hashing { return Hashing{} }, 26},
		{"default ring 5 servers", func([]string) Hashing { return Hashing{} }, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, tc.servers)
			addrs := addrsOf(ms)
			ss := new(ServerList)
			require.NoError(t, ss.SetHashing(tc.hashing(addrs)))
			require.NoError(t, ss.SetServers(addrs...))
			c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), fastFailover, WithTimeout(300*time.Millisecond))
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })

			ms[0].kill() // weight 1 in the weighted pool
			// Every acknowledged Set is read back. A Set that times out
			// (26 memcached and -race on a loaded machine) is not
			// acknowledged, and not counted.
			acked := make([]bool, keys)
			failed := 0
			for i := range keys {
				err := c.Set(&memcache.Item{Key: fmt.Sprint("k", i), Value: fmt.Append(nil, "v", i)})
				acked[i] = err == nil
				if err != nil {
					failed++
				}
			}
			require.Less(t, failed, keys/100, "Sets failed")
			require.Equal(t, ServerOut, stateOf(c, ms[0].addr).State)
			// A Get that times out (the same load) is tried again: a miss
			// is what loses a write, not a late reply.
			lost := 0
			for i := range keys {
				if !acked[i] {
					continue
				}
				it, err := c.Get(fmt.Sprint("k", i))
				for try := 0; err != nil && !errors.Is(err, memcache.ErrCacheMiss) && try < 5; try++ {
					it, err = c.Get(fmt.Sprint("k", i))
				}
				if errors.Is(err, memcache.ErrCacheMiss) {
					lost++
					continue
				}
				require.NoError(t, err, "Get k%d", i)
				require.Equal(t, fmt.Sprint("v", i), string(it.Value))
			}
			require.Zero(t, lost, "acknowledged Sets not read back, of %d", keys)
		})
	}
}
