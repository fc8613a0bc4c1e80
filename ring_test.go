package selector

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
	hashring "github.com/kubecache/k8s-memcache-selector/internal/ring"
	"github.com/stretchr/testify/require"
)

// members returns members with the given ids, each dialled at its id.
func members(ids ...string) []member {
	ms := make([]member, len(ids))
	for i, id := range ids {
		ms[i] = member{id: id, addr: &staticAddr{network: "tcp", str: id}}
	}
	return ms
}

func podMembers(n int) []member { return members(podIDs(n)...) }

// podIDs returns the ids memcache-0:11211 to memcache-<n-1>:11211.
func podIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("memcache-%d:11211", i)
	}
	return ids
}

// ownerID returns the id of the member owning key.
func (r *ring) ownerID(key string) string {
	return r.pick(xxhash.Sum64String(key)).id
}

// md5Key is the hash Ketama's ring is read with (see hashring.MD5Key).
func md5Key(key string) uint32 { return hashring.MD5Key(key) }

// ch3 of key over m servers, as mcrouter's Ch3HashFunc: the position of
// its owner on a Ch3 ring without holes.
func ch3Of(key string, m uint32) uint32 {
	pos := make([]int, m)
	for i := range pos {
		pos[i] = i
	}
	return hashring.NewCh3(pos).Owner(hashring.Murmur64A(key))
}

// The glue maps the indexes of internal/ring to the members: the owner
// and successor of a hash are the members at the indexes it gives, and a
// ring rebound to new addresses keeps its table. The ring itself is
// tested in internal/ring.
func TestRingMembers(t *testing.T) {
	ms := canonical(podMembers(10))
	r := newRing(ms, 100)
	for i := range 1000 {
		h := xxhash.Sum64String(fmt.Sprint("key:", i))
		o, s := r.keys.Owners(h)
		first, second := r.owners(h)
		require.Same(t, &r.members[o], first)
		require.Same(t, &r.members[s], second)
		require.Same(t, first, r.pick(h))
		require.Equal(t, r.addrs[r.slotOwner(slotOf(h))], first.addr)
	}
	moved := members(ids(ms)...)
	for i := range moved {
		moved[i].addr = &staticAddr{network: "tcp", str: fmt.Sprintf("10.0.0.%d:11211", i)}
	}
	rebound := r.withMembers(moved)
	require.True(t, rebound.keys.Shares(&r.keys))
	require.Equal(t, r.owner(12345), rebound.owner(12345))
	require.Equal(t, "10.0.0.", rebound.pick(12345).addr.str[:7])
}

func TestRingEmpty(t *testing.T) {
	require.Nil(t, newRing(nil, DefaultPointsPerServer))
	require.False(t, (*ring)(nil).sameIDs(podMembers(1)))
	require.Nil(t, (*ring)(nil).with(nil, 10))
}
