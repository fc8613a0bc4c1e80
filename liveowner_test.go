package selector

import (
	"errors"
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
