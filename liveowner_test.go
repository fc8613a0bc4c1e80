package selector

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestDeleteWhileItsStandInGoesOut: a key's server is out, and its stand-in
// takes a write; then the stand-in goes out too (timeouts on a loaded
// machine), and a Delete goes to the next server before the routing
// without the stand-in is built (see routing.ownerNow). The stand-in held
// the key until then: it must forget it before it serves it again, or a
// handoff reads it there as a former server. Its value was read back after
// the acknowledged Delete (histcheck two-out on 1.6.45 under heavy load: an
// Increment of the deleted value).
func TestDeleteWhileItsStandInGoesOut(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms), WithTimeout(time.Second),
		WithHandoff(Handoff{Window: 10 * time.Second}))
	home := ms[0]
	key := keysOf(t, ss, home.addr, 1)[0]
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}))

	hangUntilOut(t, c, home, key)
	defer home.signal(syscall.SIGCONT)
	h := c.hash(key)
	eventually(t, "the routing without the key's server", func() bool {
		s := c.rt.Load().liveOwner(h)
		return s != nil && s.addr.str != home.addr
	})
	standIn := c.rt.Load().liveOwner(h)
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v2")}), "at the stand-in")

	// Out for the Client, and the routing not rebuilt yet: the Delete goes
	// to the next server (the refresh that follows is held off).
	c.refreshing.Lock()
	standIn.state.Store(int32(down))
	err := c.Delete(key)
	standIn.state.Store(int32(up))
	c.refreshing.Unlock()
	if !errors.Is(err, memcache.ErrCacheMiss) {
		require.NoError(t, err)
	}
	_, err = c.Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the stand-in's value, read after the Delete")
}

// TestEachStandInCleaned: a key's server is out, its stand-in takes a
// write, goes out too, and the next stand-in takes a Delete (past the
// handoff window, so that no past ring has the first stand-in). When the
// key's server returns, both stand-ins have the key deleted: the log kept
// the last stand-in only, and the first kept its copy, to serve it when it
// stood in again (histcheck two-out on 1.6.45 under load: a value read 3 s
// after its Delete).
func TestEachStandInCleaned(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms), // two of three out
		WithFailover(Failover{ProbeFirst: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond, MaxOut: 0.7}),
		WithHandoff(Handoff{Window: 100 * time.Millisecond}), WithMoves(Moves{Rate: -1}))
	home := ms[0]
	key := keysOf(t, ss, home.addr, 1)[0]
	h := c.hash(key)
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v0")}))
	standInOf := func(not ...string) *memcached {
		var m *memcached
		eventually(t, "the routing without "+fmt.Sprint(not), func() bool {
			s := c.rt.Load().liveOwner(h)
			if s == nil || slices.Contains(not, s.addr.str) {
				return false
			}
			for _, x := range ms {
				if x.addr == s.addr.str {
					m = x
				}
			}
			return true
		})
		return m
	}

	hangUntilOut(t, c, home, key)
	defer home.signal(syscall.SIGCONT)
	first := standInOf(home.addr)
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}), "at the first stand-in")
	hangUntilOut(t, c, first, key)
	defer first.signal(syscall.SIGCONT)
	standInOf(home.addr, first.addr)
	time.Sleep(300 * time.Millisecond) // past the window: no past ring has the first
	require.NoError(t, c.Delete(key), "at the next")

	// The key's server returns first: the first stand-in never owns the
	// key again, so no floor of its own keeps its copy from being read.
	home.signal(syscall.SIGCONT)
	eventually(t, "the key's server back, and its log drained", func() bool {
		c.Get(key)
		st := stateOf(c, home.addr)
		return st.State == ServerUp && st.Invalidations == 0
	})
	first.signal(syscall.SIGCONT)
	eventually(t, "the first stand-in back, and its log drained", func() bool {
		st := stateOf(c, first.addr)
		return st.State == ServerUp && st.Invalidations == 0
	})
	_, err := direct(first.addr).Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the first stand-in's copy, left after the Delete")
	_, err = c.Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
}
