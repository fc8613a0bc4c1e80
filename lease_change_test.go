package selector

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// rawLine sends req, a request of one reply line, to addr on a
// connection of its own, and returns the reply.
func rawLine(t *testing.T, addr, req string) string {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	_, err = fmt.Fprintf(nc, "%s\r\n", req)
	require.NoError(t, err)
	line, err := bufio.NewReader(nc).ReadString('\n')
	require.NoError(t, err)
	return line
}

// rawCAS returns the CAS id of key at addr, placeholder or value (mg k c).
func rawCAS(t *testing.T, addr, key string) uint64 {
	t.Helper()
	line := rawLine(t, addr, "mg "+key+" c")
	for _, f := range strings.Fields(line)[1:] {
		if strings.HasPrefix(f, "c") {
			n, err := strconv.ParseUint(f[1:], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no CAS for %s at %s: %q", key, addr, line)
	return 0
}

// setWithCAS writes value of key at addr so that its CAS id is cas: the
// server's CAS ids count up by one a store, so fillers bring it there.
func setWithCAS(t *testing.T, addr, key, value string, cas uint64) {
	t.Helper()
	mc := direct(addr)
	for i := 0; ; i++ {
		require.NoError(t, mc.Set(&memcache.Item{Key: "filler", Value: []byte("f")}))
		next := rawCAS(t, addr, "filler") + 1
		require.LessOrEqual(t, next, cas, "the server's CAS ids went past the lease's")
		if next == cas {
			break
		}
		for range cas - next - 1 {
			require.NoError(t, mc.Set(&memcache.Item{Key: "filler", Value: []byte("f")}))
		}
	}
	require.NoError(t, mc.Set(&memcache.Item{Key: key, Value: []byte(value)}))
	require.Equal(t, cas, rawCAS(t, addr, key), "the value's CAS is the lease's token")
}

// TestLeaseSetAcrossChange: a GetOrLoad's lease is taken at the key's
// server A; during the load the key's server becomes B (a ring change; A
// out, B its stand-in), where another client writes a newer value whose
// CAS id happens to equal the lease's token (each server counts its own).
// The load's set goes to A only, as mcrouter's lease sets go back to the
// server that issued the lease: B keeps the newer value. Before, the set
// went to B and its CAS matched there: the loaded value, older, replaced
// the newer one.
func TestLeaseSetAcrossChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c *Client, ss *ServerList, ms []*memcached)
	}{
		{"a ring change", func(t *testing.T, c *Client, ss *ServerList, ms []*memcached) {
			require.NoError(t, ss.SetServers(addrsOf(ms)...))
		}},
		{"a failover", func(t *testing.T, c *Client, ss *ServerList, ms []*memcached) {
			ms[0].signal(syscall.SIGSTOP)
			t.Cleanup(func() { ms[0].signal(syscall.SIGCONT) })
			other := keysOf(t, ss, ms[0].addr, 2)[1]
			for i := 0; stateOf(c, ms[0].addr).State == "up"; i++ {
				require.Less(t, i, 50, "A is never taken out")
				c.Get(other)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 2)
			a, b := ms[0].addr, ms[1].addr
			ss := listOf(t, a)
			if tc.name == "a failover" {
				ss = listOf(t, a, b)
			}
			c, err := NewClientFromList(ss, fastFailover, WithMoves(Moves{Rate: -1}))
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			key := keysOf(t, listOf(t, a, b), b, 1)[0] // B's once B is a member
			if tc.name == "a failover" {
				key = keysOf(t, ss, a, 1)[0]
			}
			for range 1000 { // A's CAS ids run ahead of B's
				require.NoError(t, direct(a).Set(&memcache.Item{Key: "filler", Value: []byte("f")}))
			}
			db := newTestDB()
			started, release := db.holdLoads()
			defer release()
			done := make(chan *memcache.Item)
			go func() {
				it, err := c.GetOrLoad(context.Background(), key, LoadOptions{}, db.load)
				if err != nil {
					t.Error(err)
				}
				done <- it
			}()
			<-started
			token := rawCAS(t, a, key) // the lease
			tc.change(t, c, ss, ms)
			require.Eventually(t, func() bool {
				s, newStandIn := c.rt.Load().ownerNow(c.hash(key))
				return s != nil && s.addr.str == b && !newStandIn // its floors taken: the Client stores nothing more at B
			}, 5e9, 5e6, "the key's server is B")
			setWithCAS(t, b, key, "newer", token)

			release()
			it := <-done
			require.Equal(t, key+"-v0", string(it.Value), "the caller gets what it loaded")
			got, err := direct(b).Get(key)
			require.NoError(t, err)
			require.Equal(t, "newer", string(got.Value), "the load's set replaced a newer value at B")
		})
	}
}
