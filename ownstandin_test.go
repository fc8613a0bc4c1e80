package selector

import (
	"errors"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestWriteKeptAtItsStandIn: a write that a stand-in took while the key's
// server was coming back (it answered its probe, and the routing to it was
// being built) stays at the stand-in, which serves the key until that
// routing is used. Its cleanup deleted it there: with a stand-in
// expiration longer than the handoff window, a write's cleanup deleted the
// stand-in's copy as soon as the key's server could be read. The write was
// lost while the stand-in still served the key, and a copy of an older
// value from a former stand-in could land there in its place (the history
// checker's two-out under load: an Increment and a Set of one key, the
// Set's value deleted by its own cleanup, the Increment's older value
// copied back and served). The drain of the server's log, which runs as
// soon as it is up, did the same.
func TestWriteKeptAtItsStandIn(t *testing.T) {
	ms := startMemcached(t, 2)
	var f faults
	c, ss := newTestClient(t, addrsOf(ms), f.option(),
		WithFailover(Failover{Timeouts: 1, ProbeFirst: time.Minute, ProbeMax: time.Minute, StandInExpiration: time.Minute}),
		WithHandoff(Handoff{Window: 10 * time.Second}))
	home := ms[0].addr
	key := keysOf(t, ss, home, 1)[0]
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}))

	f.set(home, true, 0)
	eventually(t, "the key's server to be out", func() bool {
		c.Get(key)
		return stateOf(c, home).State == ServerOut
	})
	f.set(home, false, 0)
	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v2")}), "at the stand-in")

	// It answered its probe: up, and readable, before the routing that
	// sends its keys back to it is published (see Client.recover).
	serverOf(c, home).state.Store(int32(up))
	// Its log is drained (see Client.drain): the key is deleted there, and
	// kept at the stand-in, whose copy is the key's value still.
	c.drain(serverOf(c, home), nil)
	eventually(t, "the key deleted at its server", func() bool {
		_, err := direct(home).Get(key)
		return errors.Is(err, memcache.ErrCacheMiss)
	})
	it, err := c.Get(key)
	require.NoError(t, err, "the stand-in keeps the write it took, through the drain")
	require.Equal(t, "v2", string(it.Value))

	require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v3")}), "at the stand-in still")
	it, err = c.Get(key)
	require.NoError(t, err, "the stand-in keeps the write it took")
	require.Equal(t, "v3", string(it.Value))
	_, err = direct(home).Get(key)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the key's server forgot its older value")
}
