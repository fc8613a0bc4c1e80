package selector

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	hashring "github.com/kubecache/k8s-memcache-selector/internal/ring"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pickAll returns the server of each of n keys.
func pickAll(t *testing.T, ss *ServerList, n int) map[string]string {
	t.Helper()
	got := make(map[string]string, n)
	for i := range n {
		k := fmt.Sprint("key-", i)
		a, err := ss.PickServer(k)
		require.NoError(t, err)
		got[k] = a.String()
	}
	return got
}

// TestHashingModes: each mode maps keys as its reference function does,
// moves only what it must when servers change, and PickServer allocates
// nothing.
func TestHashingModes(t *testing.T) {
	addrs := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211"}
	for _, tc := range []struct {
		name string
		h    Hashing
		want func(key string) string // the reference mapping over addrs
	}{
		{"ketama", Ketama(), func(key string) string {
			c := hashring.NewKetama([]string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211"}, make([]uint32, 4), listOrder(4))
			return addrs[c.Owner(uint64(md5Key(key)))]
		}},
		{"ch3", Ch3(), func(key string) string { return addrs[ch3Of(key, 4)] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := new(ServerList)
			require.NoError(t, ss.SetHashing(tc.h))
			require.NoError(t, ss.SetServers(addrs...))
			before := pickAll(t, ss, 2000)
			for k, a := range before {
				require.Equal(t, tc.want(k), a, k)
			}
			allocs := testing.AllocsPerRun(1000, func() { ss.PickServer("a-key-of-some-length:12345") })
			require.Zero(t, allocs, "PickServer allocations")

			// A fifth server at the end takes only keys from the others.
			require.NoError(t, ss.SetServers(append(addrs, "10.0.0.5:11211")...))
			moved := 0
			for k, a := range pickAll(t, ss, 2000) {
				if a != before[k] {
					require.Equal(t, "10.0.0.5:11211", a, "key %s moved between servers that stayed", k)
					moved++
				}
			}
			assert.InDelta(t, 2000/5, moved, 100, "keys moved to the fifth server")
		})
	}
}

// TestCh3Order: Ch3 places SetServers' servers in the order given, and a
// list's order is its mapping.
func TestCh3Order(t *testing.T) {
	a, b := new(ServerList), new(ServerList)
	require.NoError(t, a.SetHashing(Ch3()))
	require.NoError(t, b.SetHashing(Ch3()))
	require.NoError(t, a.SetServers("10.0.0.1:11211", "10.0.0.2:11211"))
	require.NoError(t, b.SetServers("10.0.0.2:11211", "10.0.0.1:11211"))
	for i := range 100 {
		k := fmt.Sprint("k", i)
		x, _ := a.PickServer(k)
		y, _ := b.PickServer(k)
		require.NotEqual(t, x.String(), y.String(), "%s: the order given decides the index", k)
	}
}

// TestSetServersReorder: SetServers with the same servers in another order
// gives Ch3 the new order, key for key as a fresh list of that order (it
// kept the first order once: the update saw the same members and returned
// early), and Ketama too, whose equal points go by the order (see
// TestKetamaTies). Where nothing can change, nothing is rebuilt: the same
// list again in every mode, and another order on the library's own ring,
// which is the same for a set in any order.
func TestSetServersReorder(t *testing.T) {
	abc := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	cba := []string{"10.0.0.3:11211", "10.0.0.2:11211", "10.0.0.1:11211"}
	list := func(h Hashing, servers []string) *ServerList {
		ss := new(ServerList)
		require.NoError(t, ss.SetHashing(h))
		require.NoError(t, ss.SetServers(servers...))
		return ss
	}
	for _, tc := range []struct {
		name      string
		h         Hashing
		reordered bool // whether another order is another ring
	}{{"own ring", Hashing{}, false}, {"ketama", Ketama(), true}, {"ch3", Ch3(), true}} {
		t.Run(tc.name, func(t *testing.T) {
			ss := list(tc.h, abc)
			r := ss.ring.Load()
			require.NoError(t, ss.SetServers(abc...))
			require.Same(t, r, ss.ring.Load(), "the same list again rebuilt the ring")

			require.NoError(t, ss.SetServers(cba...))
			if !tc.reordered {
				require.Same(t, r, ss.ring.Load(), "another order rebuilt the ring")
			}
			require.Equal(t, pickAll(t, list(tc.h, cba), 2000), pickAll(t, ss, 2000), "the mapping after another order")
			if tc.reordered {
				r = ss.ring.Load()
				require.NoError(t, ss.SetServers(cba...))
				require.Same(t, r, ss.ring.Load(), "the same list again rebuilt the ring")
				require.NoError(t, ss.SetServers(abc...))
				require.Equal(t, pickAll(t, list(tc.h, abc), 2000), pickAll(t, ss, 2000), "the mapping back in the first order")
			}
		})
	}
}

// TestHashingDiscovery: discovered servers under Ketama are named by
// ip:port, or with ByHostname by their pods' DNS names; under Ch3 they are
// placed by their pods' ordinals, and a pod not ready leaves a hole whose
// keys spread over the others while every other key stays.
func TestHashingDiscovery(t *testing.T) {
	pods := func(ips ...string) *fakeSlice {
		var eps []fakeEndpoint
		for i, ip := range ips {
			if ip != "" {
				name := fmt.Sprint("memcache-", i)
				eps = append(eps, ep(ip).pod(name, name))
			}
		}
		return v4("memcache-a", eps...)
	}
	t.Run("ketama by address", func(t *testing.T) {
		f := newFakeAPI(t)
		f.put(pods("10.0.0.1", "10.0.0.2", "10.0.0.3"))
		ss := start(t, f, WithHashing(Ketama()))
		ref := new(ServerList)
		require.NoError(t, ref.SetHashing(Ketama()))
		require.NoError(t, ref.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"))
		require.Equal(t, pickAll(t, ref, 1000), pickAll(t, ss, 1000))
	})
	t.Run("ketama by IPv6 address", func(t *testing.T) {
		// The points of [fd00::1]:11211 are those of "fd00::1-i", as
		// libmemcached and twemproxy name it (see TestInteropNames).
		f := newFakeAPI(t)
		var eps []fakeEndpoint
		for i := range 3 {
			name := fmt.Sprint("memcache-", i)
			eps = append(eps, ep(fmt.Sprint("fd00::", i+1)).pod(name, name))
		}
		f.put(slice("memcache-a", "IPv6", memcachePort, eps...))
		ss := start(t, f, WithHashing(Ketama()))
		ref := refKetama([]string{"fd00::1", "fd00::2", "fd00::3"})
		for k, a := range pickAll(t, ss, 4000) {
			require.Equal(t, fmt.Sprintf("[fd00::%d]:11211", ref(k)+1), a, k)
		}
	})
	t.Run("ketama by hostname", func(t *testing.T) {
		f := newFakeAPI(t)
		f.put(pods("10.0.0.1", "10.0.0.2", "10.0.0.3"))
		ss := start(t, f, WithHashing(Ketama().ByHostname("memcache.default.svc.cluster.local")))
		names := []string{"memcache-0.memcache.default.svc.cluster.local:11211", "memcache-1.memcache.default.svc.cluster.local:11211", "memcache-2.memcache.default.svc.cluster.local:11211"}
		c := hashring.NewKetama(names, make([]uint32, 3), listOrder(3))
		for k, a := range pickAll(t, ss, 1000) {
			require.Equal(t, fmt.Sprintf("10.0.0.%d:11211", c.Owner(uint64(md5Key(k)))+1), a, k)
		}
	})
	t.Run("ch3 by ordinal, with a hole", func(t *testing.T) {
		f := newFakeAPI(t)
		f.put(pods("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"))
		ss := start(t, f, WithHashing(Ch3()))
		before := pickAll(t, ss, 2000)
		for k, a := range before {
			require.Equal(t, fmt.Sprintf("10.0.0.%d:11211", ch3Of(k, 4)+1), a, k)
		}
		f.waitWatch(1).apply("MODIFIED", pods("10.0.0.1", "", "10.0.0.3", "10.0.0.4"))
		waitServers(t, ss, hostports("10.0.0.1", "10.0.0.3", "10.0.0.4")...)
		spread := map[string]int{}
		for k, a := range pickAll(t, ss, 2000) {
			if before[k] == "10.0.0.2:11211" {
				spread[a]++
			} else {
				require.Equal(t, before[k], a, "%s moved off a server that stayed", k)
			}
		}
		require.Len(t, spread, 3, "the hole's keys spread over the others")
	})
	t.Run("errors", func(t *testing.T) {
		f := newFakeAPI(t)
		f.put(v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
		rec := &recLogger{t: t}
		ss := start(t, f, WithHashing(Ch3()), WithLogger(rec))
		require.Empty(t, ss.Servers(), "servers without ordinals are refused")
		eventually(t, "the error logged", func() bool { return rec.has("has no ordinal") })
	})
}

// TestSetHashingErrors: a Hashing that cannot work, or one set too late,
// is an error that says why.
func TestSetHashingErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Hashing
		want string
	}{
		{"weights for ch3", Ch3().WithWeights(map[string]int{"a:1": 2}), "WithWeights is for Ketama"},
		{"hostnames for the own ring", Hashing{}.ByHostname("x"), "ByHostname and WithWeights are for Ketama or Ch3"},
		{"a zero weight", Ketama().WithWeights(map[string]int{"10.0.0.1:11211": 0}), "weighs 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, new(ServerList).SetHashing(tc.h), tc.want)
		})
	}
	ss := new(ServerList)
	require.NoError(t, ss.SetServers("10.0.0.1:11211"))
	require.ErrorContains(t, ss.SetHashing(Ketama()), "has servers already")
}

// TestClientHashingModes: a Client of each mode writes each key where the
// mode puts it, and fails over from a dead server as it does on the
// library's ring: no error, and the keys of the servers that stay where
// they were.
func TestClientHashingModes(t *testing.T) {
	for name, h := range map[string]Hashing{"ketama": Ketama(), "ch3": Ch3()} {
		t.Run(name, func(t *testing.T) {
			ms := startMemcached(t, 3)
			ss := new(ServerList)
			require.NoError(t, ss.SetHashing(h))
			require.NoError(t, ss.SetServers(addrsOf(ms)...))
			// A timeout of 2 s, not 300 ms: a handoff's reads and copy under
			// -race on a loaded machine timed out (the kill below is
			// refused connections, seen at once).
			c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), fastFailover, WithTimeout(2*time.Second))
			require.NoError(t, err)
			defer c.Close()
			owner := map[string]string{}
			for i := range 300 {
				k := fmt.Sprint("m", i)
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
				a, _ := ss.PickServer(k)
				owner[k] = a.String()
				_, err := direct(a.String()).Get(k)
				require.NoError(t, err, "%s not at %s, its server under the mode", k, a)
			}
			// A fourth server: the keys that move to it are handed off, read
			// where they were, so every one is still found.
			extra := startMemcached(t, 1)[0]
			require.NoError(t, ss.SetServers(append(addrsOf(ms), extra.addr)...))
			eventually(t, "the Client to follow", func() bool { return c.rt.Load().base == ss.ring.Load() })
			moved := 0
			for k := range owner {
				if a, _ := ss.PickServer(k); a.String() == extra.addr {
					moved++
					it, err := c.Get(k)
					require.NoError(t, err, "%s, moved to the new server, not handed off", k)
					require.Equal(t, k, string(it.Value))
				}
			}
			require.NotZero(t, moved, "keys moved to the new server")
			require.NoError(t, ss.SetServers(addrsOf(ms)...))
			eventually(t, "the Client to follow", func() bool { return c.rt.Load().base == ss.ring.Load() })

			ms[0].kill()
			for k, a := range owner {
				it, err := c.Get(k)
				if a == ms[0].addr {
					require.True(t, err == nil || errors.Is(err, memcache.ErrCacheMiss), "%s: %v", k, err)
					require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}), k)
					continue
				}
				require.NoError(t, err, "%s at %s, which stayed", k, a)
				require.Equal(t, k, string(it.Value))
			}
		})
	}
}

func TestWithHashingErrors(t *testing.T) {
	f := newFakeAPI(t)
	_, err := newServerList(t, f, "memcache:11211", WithHashing(Ch3().WithWeights(map[string]int{"x:1": 2})))
	require.ErrorContains(t, err, "WithHashing: WithWeights is for Ketama")
	_, err = newServerList(t, f, "memcache:11211", WithHashing(Ketama()), WithPointsPerServer(100))
	require.ErrorContains(t, err, "WithPointsPerServer is for the library's own ring")
}

// TestZonedPoolKetama: the rings of a pool's groups have the list's mode:
// in each zone, a key is where Ketama over that zone's servers puts it.
func TestZonedPoolKetama(t *testing.T) {
	ms := startMemcached(t, 4)
	members, err := staticMembers(addrsOf(ms))
	require.NoError(t, err)
	zone := map[string]string{ms[0].addr: "a", ms[1].addr: "a", ms[2].addr: "b", ms[3].addr: "b"}
	for i := range members {
		members[i].zone = zone[members[i].addr.str]
	}
	ss := &ServerList{hashing: Ketama(), zoned: true}
	_, _, err = ss.update(members)
	require.NoError(t, err)
	c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithPool(ByZone("a")))
	require.NoError(t, err)
	defer c.Close()
	for _, pair := range [][]*memcached{ms[:2], ms[2:]} {
		ref := new(ServerList)
		require.NoError(t, ref.SetHashing(Ketama()))
		require.NoError(t, ref.SetServers(addrsOf(pair)...))
		for i := range 100 {
			k := fmt.Sprint("zk", i)
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
			a, _ := ref.PickServer(k)
			_, err := direct(a.String()).Get(k)
			require.NoError(t, err, "%s not at %s, Ketama's server in its zone", k, a)
		}
	}
}
