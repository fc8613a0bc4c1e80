package selector

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// newPoolClient returns a Client of pool p over servers in zones: zones[i]
// is the zone of ms[i].
func newPoolClient(t *testing.T, ms []*memcached, zones []string, p Pool, opt ...Option) (*Client, *ServerList) {
	t.Helper()
	members, err := staticMembers(addrsOf(ms))
	require.NoError(t, err)
	for i := range members {
		for j, m := range ms {
			if members[i].addr.str == m.addr {
				members[i].zone = zones[j]
			}
		}
	}
	ss := &ServerList{zoned: true} // as discovery of EndpointSlices makes it
	_, _, err = ss.update(members)
	require.NoError(t, err)
	opt = append([]Option{WithSlog(slog.New(slog.DiscardHandler)), fastFailover, WithTimeout(300 * time.Millisecond), WithPool(p)}, opt...)
	c, err := NewClientFromList(ss, opt...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, ss
}

// holders returns how many of ms hold key.
func holders(ms []*memcached, key string) int {
	n := 0
	for _, m := range ms {
		if _, err := direct(m.addr).Get(key); err == nil {
			n++
		}
	}
	return n
}

// TestReplicatedPool: every server holds every key; two of three servers
// killed, every key is still read, with no error, and writes go on.
func TestReplicatedPool(t *testing.T) {
	ms := startMemcached(t, 3)
	c, _ := newPoolClient(t, ms, []string{"", "", ""}, Replicated())
	var keys []string
	for i := range 100 {
		keys = append(keys, fmt.Sprint("r", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("v1")}))
	}
	for _, k := range keys {
		require.Equal(t, 3, holders(ms, k), "replicas of %s", k)
	}
	ms[0].kill()
	ms[1].kill()
	for _, k := range keys {
		it, err := c.Get(k)
		require.NoError(t, err, k)
		require.Equal(t, "v1", string(it.Value))
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v2")}))
	}
	require.NoError(t, c.Delete(keys[0]))
	_, err := c.Get(keys[0])
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
}

// TestReplicatedNoStaleRead: a replica that missed overwrites and deletes
// while it hung never serves the old values when it returns.
func TestReplicatedNoStaleRead(t *testing.T) {
	ms := startMemcached(t, 2)
	c, _ := newPoolClient(t, ms, []string{"", ""}, Replicated())
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprint("s", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("old")}))
	}
	ms[0].signal(syscall.SIGSTOP)
	for i, k := range keys {
		if i%2 == 0 {
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}), k)
		} else {
			require.NoError(t, c.Delete(k), k)
		}
	}
	ms[0].signal(syscall.SIGCONT)
	for _, g := range c.pool.view.Load().all {
		eventually(t, "the replica to be back", func() bool {
			return stateOf(g.c, ms[0].addr).State != ServerOut // "" in the other replica's group
		})
	}
	// Until the keys logged for it are deleted there, the read gate does
	// not serve them (TestReturnUnderSteadyWrites); once they are, no
	// replica holds an old value.
	for _, k := range keys {
		if it, err := c.Get(k); err == nil {
			require.Equal(t, "new", string(it.Value), k)
		}
	}
	eventually(t, "the replica's invalidations deleted", func() bool {
		for _, s := range c.Stats().Servers {
			if s.Invalidations != 0 {
				return false
			}
		}
		return true
	})
	for _, m := range ms { // each replica alone
		for i, k := range keys {
			it, err := direct(m.addr).Get(k)
			if i%2 == 0 && err == nil {
				require.Equal(t, "new", string(it.Value), "%s at %s", k, m)
			} else if i%2 == 1 {
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s at %s (the one that hung: %s; %+v)", k, m, ms[0], c.Stats())
			}
		}
	}
}

// TestZonedPool: each key on one server in each zone, reads in the
// client's zone; the zone lost, reads go on from the other with no error;
// with miss failover, a zone that returns empty warms from the other.
func TestZonedPool(t *testing.T) {
	ms := startMemcached(t, 4)
	zones := []string{"a", "a", "b", "b"}
	c, _ := newPoolClient(t, ms, zones, ByZone("a").WithMissFailover())
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprint("z", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte(keys[i])}))
	}
	for _, k := range keys {
		require.Equal(t, 1, holders(ms[:2], k), "copies of %s in zone a", k)
		require.Equal(t, 1, holders(ms[2:], k), "copies of %s in zone b", k)
	}
	// Reads stay in zone a: with zone b stopped, they still take no time.
	ms[2].signal(syscall.SIGSTOP)
	ms[3].signal(syscall.SIGSTOP)
	start := time.Now()
	for _, k := range keys {
		_, err := c.Get(k)
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), 300*time.Millisecond, "reads left the client's zone")
	ms[2].signal(syscall.SIGCONT)
	ms[3].signal(syscall.SIGCONT)

	// Zone a restarts empty: every read is served from zone b and
	// repairs zone a.
	ms[0].restart()
	ms[1].restart()
	for _, k := range keys {
		it, err := c.Get(k)
		require.NoError(t, err, k)
		require.Equal(t, k, string(it.Value))
	}
	for _, k := range keys {
		require.Equal(t, 1, holders(ms[:2], k), "%s not repaired in zone a", k)
	}
}

// TestPoolPrimaryOps: Add, Increment and Append decide on the primary group
// and leave every replica alike; CompareAndSwap is refused.
func TestPoolPrimaryOps(t *testing.T) {
	ms := startMemcached(t, 3)
	c, _ := newPoolClient(t, ms, []string{"", "", ""}, Replicated())
	require.NoError(t, c.Add(&memcache.Item{Key: "n", Value: []byte("10")}))
	require.ErrorIs(t, c.Add(&memcache.Item{Key: "n", Value: []byte("20")}), memcache.ErrNotStored)
	v, err := c.Increment("n", 5)
	require.NoError(t, err)
	require.EqualValues(t, 15, v)
	for _, m := range ms {
		it, err := direct(m.addr).Get("n")
		require.NoError(t, err)
		require.Equal(t, "15", string(it.Value), "counter at %s", m)
	}
	require.NoError(t, c.Set(&memcache.Item{Key: "s", Value: []byte("a")}))
	require.NoError(t, c.Append(&memcache.Item{Key: "s", Value: []byte("b")}))
	for _, m := range ms {
		if it, err := direct(m.addr).Get("s"); err == nil {
			require.Equal(t, "ab", string(it.Value), "appended value at %s", m)
		}
	}
	it, err := c.Get("n")
	require.NoError(t, err)
	require.ErrorIs(t, c.CompareAndSwap(it), ErrPoolCAS)
	_, err = c.GetMulti([]string{"n", "s", "none"})
	require.NoError(t, err)
}

func TestByZoneNeedsAZone(t *testing.T) {
	t.Setenv(zoneEnv, "")
	_, err := NewClientFromList(&ServerList{zoned: true}, WithPool(ByZone("")))
	require.ErrorContains(t, err, zoneEnv+" is not set")
}

// TestPoolsRefuseWhatCannotApply: options that cannot apply are errors that
// name the fix, not warnings.
func TestPoolsRefuseWhatCannotApply(t *testing.T) {
	var fixed ServerList
	require.NoError(t, fixed.SetServers("127.0.0.1:11211"))
	for _, tc := range []struct {
		name string
		opt  Option
		want string
	}{
		{"ByZone on a fixed list", WithPool(ByZone("a")), "ByZone needs the zones of a Service's EndpointSlices, and this list of servers has none (filled with SetServers, or discovered by DNS or from Endpoints): give NewClient the Service's address, or use Replicated()"},
		{"WithMissFailover on the sharded pool", WithPool(Pool{}.WithMissFailover()), "WithMissFailover is for a pool with copies of each key, and the zero Pool has one: use Replicated(), ByZone or AcrossServices with it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClientFromList(&fixed, tc.opt)
			if err == nil {
				c.Close()
			}
			require.ErrorContains(t, err, tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "selector: "), err.Error())
		})
	}
}

// slowHits delays a get's hit ("VALUE ...") by delay once memcached has
// answered: the window between a replica's answer and the pool's repair.
type slowHits struct {
	net.Conn
	delay time.Duration
	on    *atomic.Bool
}

func (c slowHits) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if s := string(b[:n]); c.on.Load() && (strings.HasPrefix(s, "VALUE ") || strings.HasPrefix(s, "VA ")) {
		time.Sleep(c.delay)
	}
	return n, err
}

// TestRepairNeverUndoesADelete: a Get that misses at one replica and hits
// at the other copies the hit back with add; a Delete that succeeds between
// that hit and the add must not be undone. Each client reads the replicas
// in an order of its own, so the attempts alternate which replica lost the
// key, and half of them read it there first. Before the fix, 3 to 7 of 8
// attempts read the deleted value back.
func TestRepairNeverUndoesADelete(t *testing.T) {
	ms := startMemcached(t, 2)
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			var on atomic.Bool
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return slowHits{c, 300 * time.Millisecond, &on}, nil
			}
			ss := new(ServerList)
			require.NoError(t, ss.SetServers(addrsOf(ms)...))
			c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithPool(Replicated().WithMissFailover()), WithDialContext(dial))
			require.NoError(t, err)
			defer c.Close()
			key := fmt.Sprint("k-", i)
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v1")}))
			require.NoError(t, direct(ms[i%2].addr).Delete(key)) // one replica lost it (evicted, or restarted empty)
			on.Store(true)
			got := make(chan struct{})
			go func() { c.Get(key); close(got) }()
			time.Sleep(100 * time.Millisecond) // the replica holding the key has answered; its hit is on its way
			on.Store(false)
			require.NoError(t, c.Delete(key))
			<-got
			_, err = c.Get(key)
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "a deleted value read back")
		})
	}
}

// ByZone of a zone that no server is in is one warning naming the zone and
// the zones seen, and another when the zones seen change; none while the
// zone has servers.
func TestByZoneMissingWarns(t *testing.T) {
	ss := &ServerList{zoned: true}
	setZones := func(zones ...string) {
		t.Helper()
		var addrs []string
		for i := range zones {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", 20001+i))
		}
		ms, err := staticMembers(addrs)
		require.NoError(t, err)
		for i := range ms {
			ms[i].zone = zones[i]
		}
		_, _, err = ss.update(ms)
		require.NoError(t, err)
	}
	warning := func(zones string) string {
		return `ByZone("zone-typo"): no server of the Service is in that zone, so every read leaves it: the zones of its endpoints are ` + zones + "; give one of them"
	}
	setZones("zone-a", "zone-b")
	log := &recLogger{t: t}
	c, err := NewClientFromList(ss, WithLogger(log), WithPool(ByZone("zone-typo")))
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, 1, log.count(warning(`"zone-a", "zone-b"`)), "the warning, at once")

	groupSize := func(zone string) int {
		for _, g := range c.pool.view.Load().all {
			if g.name == zone {
				return len(g.list.Servers())
			}
		}
		return 0
	}
	setZones("zone-a", "zone-b", "zone-b")
	eventually(t, "the new server", func() bool { return groupSize("zone-b") == 2 })
	require.Equal(t, 1, log.count("ByZone("), "warned again with the same zones")

	setZones("zone-a", "")
	eventually(t, "the warning for the new zones", func() bool {
		return log.count(warning(`"", "zone-a"`+` ("" is an endpoint whose node has no topology.kubernetes.io/zone label)`)) == 1
	})

	log = &recLogger{t: t}
	own, err := NewClientFromList(ss, WithLogger(log), WithPool(ByZone("zone-a")))
	require.NoError(t, err)
	defer own.Close()
	require.Zero(t, log.count("ByZone("), "a warning for a zone that has servers")
}

// poolGroupOf returns the group of c's replicated pool whose server is addr.
func poolGroupOf(t *testing.T, c *Client, addr string) *Client {
	t.Helper()
	var found *Client
	eventually(t, "the pod's group", func() bool {
		c.pool.mu.Lock()
		defer c.pool.mu.Unlock()
		g := c.pool.groups[addr]
		if g == nil {
			return false
		}
		found = g.c
		return true
	})
	return found
}

// TestPoolPodBackAfterWritesWhileGone: a replicated pool's pod that leaves
// and comes back serves none of its values that the pool's writes and
// deletes overtook while it was gone.
func TestPoolPodBackAfterWritesWhileGone(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newPoolClient(t, ms, []string{"", ""}, Replicated())
	for _, k := range []string{"w", "d"} {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v1")}))
	}
	require.Equal(t, 2, holders(ms, "w"))
	require.NoError(t, ss.SetServers(ms[0].addr))
	eventually(t, "the pod to leave", func() bool { return stateOf(c, ms[1].addr).State == "gone" })
	require.NoError(t, c.Set(&memcache.Item{Key: "w", Value: []byte("v2")}))
	require.NoError(t, c.Delete("d"))
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	g := poolGroupOf(t, c, ms[1].addr)
	eventually(t, "the pod to be back", func() bool { return stateOf(g, ms[1].addr).State == "up" })
	if it, err := g.Get("w"); err == nil {
		require.Equal(t, "v2", string(it.Value), "the pod served a value a write overtook while it was gone")
	}
	_, err := g.Get("d")
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the pod served a value deleted while it was gone")
}

// TestPoolPodJoinsANewClient: a client started while a replicated pool's
// pod was gone, whose clients then had all closed before they saw it leave
// (application pods roll), sees it join: none of its values from before
// is served, as the client's delete did not reach it.
func TestPoolPodJoinsANewClient(t *testing.T) {
	ms := startMemcached(t, 2)
	old, _ := newPoolClient(t, ms, []string{"", ""}, Replicated())
	require.NoError(t, old.Set(&memcache.Item{Key: "d", Value: []byte("v1")}))
	require.NoError(t, old.Set(&memcache.Item{Key: "n", Value: []byte("5")}))
	require.Equal(t, 2, holders(ms, "d"))
	old.Close()
	c, ss := newPoolClient(t, ms[:1], []string{""}, Replicated())
	require.NoError(t, c.Delete("d"))
	require.NoError(t, c.Delete("n"))
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	g := poolGroupOf(t, c, ms[1].addr)
	eventually(t, "the pod to be up", func() bool { return stateOf(g, ms[1].addr).State == "up" })
	for range 10 {
		_, err := c.Get("d")
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "a value deleted before the pod joined was served")
	}
	_, err := g.Get("d")
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the pod served a value deleted before it joined")
	_, err = c.Increment("n", 1)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "a counter deleted before the pod joined was incremented")
	require.NoError(t, c.Set(&memcache.Item{Key: "d", Value: []byte("v2")}))
	// The write waited for the pod's floor (see awaitFloor): served at once.
	it, err := g.Get("d")
	require.NoError(t, err, "a write after the pod joined")
	require.Equal(t, "v2", string(it.Value))
}

// TestPoolPodBackAfterANewClientsWrites: a replicated pool's pod leaves
// and comes back; meanwhile a client started after it left (which never
// knew it) writes and deletes its keys on the others. The pod serves none
// of its values from before.
func TestPoolPodBackAfterANewClientsWrites(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newPoolClient(t, ms, []string{"", ""}, Replicated())
	for _, k := range []string{"w", "d"} {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v1")}))
	}
	require.Equal(t, 2, holders(ms, "w"))
	require.NoError(t, ss.SetServers(ms[0].addr))
	g := poolGroupOf(t, c, ms[1].addr)
	eventually(t, "the pod to leave", func() bool { return stateOf(c, ms[1].addr).State == "gone" })
	newer, _ := newPoolClient(t, ms[:1], []string{""}, Replicated())
	require.NoError(t, newer.Set(&memcache.Item{Key: "w", Value: []byte("v2")}))
	require.NoError(t, newer.Delete("d"))
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the pod to be back", func() bool { return stateOf(g, ms[1].addr).State == "up" })
	for range 10 {
		if it, err := c.Get("w"); err == nil {
			require.Equal(t, "v2", string(it.Value), "a value the newer client overwrote was served")
		}
		_, err := c.Get("d")
		require.ErrorIs(t, err, memcache.ErrCacheMiss, "a value the newer client deleted was served")
	}
	_, err := g.Get("w")
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "the pod served its value from before it left")
}
