package selector

import (
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// The tests of moves in the field: servers shared with other applications
// and their keys, keys this library could not have written.

// A gomemcache application (crc32 over the same servers) shares them with
// a Client that scales up: every one of its keys stays where it put it.
// Without Moves.Prefix, the mover sees the foreign keys and moves nothing
// (one warning; the Client's keys move when read); with it, the Client's
// keys move and the others stay.
func TestMovesLeaveOtherApplications(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
	}{
		{"no prefix: servers refused", ""},
		{"Moves.Prefix", "app:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 4)
			log := &lineLog{}
			c, ss := newTestClient(t, addrsOf(ms[:3]), WithSlog(log.logger()), WithMoves(Moves{Prefix: tc.prefix}))
			other := memcache.New(addrsOf(ms[:3])...)
			const n = 3000
			for i := range n {
				require.NoError(t, other.Set(&memcache.Item{Key: fmt.Sprint("other-", i), Value: []byte("o")}))
				require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("app:", i), Value: []byte("a")}))
			}
			require.NoError(t, ss.SetServers(addrsOf(ms)...))
			st := movesDone(t, c, 1)
			for i := range n {
				_, err := other.Get(fmt.Sprint("other-", i))
				require.NoError(t, err, "the other application's other-%d moved away from where it put it", i)
			}
			if tc.prefix == "" {
				require.Equal(t, 3, st.Refused, "each old server is shared")
				require.Zero(t, st.Moved)
				require.Equal(t, 3, log.count("another application"), "one warning a server")
			} else {
				owned := 0
				for i := range n {
					k := fmt.Sprint("app:", i)
					if a, _ := ss.PickServer(k); a.String() == ms[3].addr {
						owned++
						_, err := direct(ms[3].addr).Get(k)
						require.NoError(t, err, "%s moved to its owner", k)
					}
				}
				require.Equal(t, owned, st.Moved)
				require.Zero(t, st.Refused)
				require.Equal(t, n, st.Foreign, "the other application's keys, counted")
			}
			for i := range n {
				_, err := c.Get(fmt.Sprint("app:", i))
				require.NoError(t, err, "app:%d, moved or handed off", i)
			}
		})
	}
}

// A key this library could not have written (a space, through the meta
// protocol's base64 keys) is skipped and counted; the rest of its
// server's keys move.
func TestMovesSkipInvalidKeys(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]))
	const n = 100
	for i := range n {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("k-", i), Value: []byte("v")}))
	}
	for _, m := range ms[:2] {
		require.Equal(t, "HD", rawCommand(t, m.addr, "ms YSBi 1 b\r\nx\r\n"), "the key \"a b\" stored in base64")
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	st := movesDone(t, c, 1)
	owned := 0
	for i := range n {
		if a, _ := ss.PickServer(fmt.Sprint("k-", i)); a.String() == ms[2].addr {
			owned++
		}
	}
	require.Equal(t, owned, st.Moved, "every key of the new server moved")
	require.Equal(t, 2, st.Foreign, "the key with a space at each old server, skipped")
	require.Equal(t, 2, st.Sources)
	for _, m := range ms[:2] {
		require.Contains(t, rawCommand(t, m.addr, "mg YSBi b v\r\n"), "VA 1", "the foreign key stays")
	}
}

// A set of members that repeats is moved again: a pod NotReady, then
// Ready, twice. Claims were named by the members alone, and the second
// flap found both servers' claims finished: 86 of 200 keys found.
func TestMovesFlapTwice(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms))
	const n = 200
	for i := range n {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("flap-", i), Value: []byte("v")}))
	}
	rounds := 0
	for flap := range 2 {
		for _, set := range [][]*memcached{ms[:1], ms} {
			require.NoError(t, ss.SetServers(addrsOf(set)...))
			rounds++
			st := movesDone(t, c, rounds)
			t.Logf("flap %d, %d servers: %+v", flap, len(set), st)
			// A repeat is told from the change before by the age of the
			// claim, to the second of the server's clock.
			time.Sleep(2500 * time.Millisecond)
		}
	}
	require.NoError(t, ss.SetServers(addrsOf(ms[:1])...))
	// A member back in the ring starts a round of its own once it
	// answers, so the round count says little here: wait for the keys.
	missing := func() (left int) {
		for i := range n {
			// A copy's placeholder, which a classic get reads as an empty
			// value, is not the key yet.
			if it, err := direct(ms[0].addr).Get(fmt.Sprint("flap-", i)); err != nil || string(it.Value) != "v" {
				left++
			}
		}
		return left
	}
	require.Eventually(t, func() bool { return missing() == 0 }, time.Minute, 100*time.Millisecond,
		"the keys moved to the server that stays")
	ms[1].kill()
	for i := range n {
		_, err := direct(ms[0].addr).Get(fmt.Sprint("flap-", i))
		require.NoError(t, err, "flap-%d not moved to the server that stays", i)
	}
}
