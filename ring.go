package selector

import (
	"fmt"
	"net"
	"slices"

	hashring "github.com/kubecache/k8s-memcache-selector/internal/ring"
)

// DefaultPointsPerServer is the number of points each member gets on the ring
// when WithPointsPerServer is not used. It is part of the key mapping: every
// process that shares a cache must use the same value.
//
// The busiest member's share of the key space exceeds the mean by about 3%
// at 10 members, 4% at 100 and 8-9% at 1000 (see BENCHMARKS.md); more points
// balance better, and rebuild and update more slowly (3000 rather than 2500
// brought 1000 members under 1.10).
const DefaultPointsPerServer = 3000

// ring is a ServerList's ring: the consistent-hash ring of internal/ring
// (the slot table, Ketama or Ch3), which maps a hash to a member index, and
// the members those indexes stand for, with their addresses. It is
// immutable. internal/ring knows the members only as it is given them:
// ids for the library's own ring, names and weights for Ketama, positions
// for Ch3; this file is the glue that describes the root's members to it.
type ring struct {
	members []member      // sorted by id, no duplicate ids
	addrs   []*staticAddr // the members' addresses, by member index: what PickServer reads, 8 bytes a member
	servers []net.Addr    // the members' distinct addresses, sorted
	// keys maps hashes to member indexes. It is held by value, not behind a
	// pointer, so that PickServer reads the slot table as it did when the
	// table was a field of ring: no load more before the table's.
	keys hashring.Ring
	alt  *Hashing // for Ketama and Ch3, how keys are hashed; nil on the library's own ring
}

// The ring's bounds, which options and SetServers check, and its slots,
// which the Client's records of moves and losses are kept by.
const (
	slotBits      = hashring.SlotBits
	maxPoints     = hashring.MaxPoints
	maxMembers    = hashring.MaxMembers
	maxRingPoints = hashring.MaxRingPoints
)

// maxMembersFor returns the most members a ring of the given points per
// member takes.
func maxMembersFor(points int) int { return hashring.MaxMembersFor(points) }

func slotOf(h uint64) uint64 { return hashring.Slot(h) }

// newRing builds the library's own ring over ms with the given points per
// member. ms must be sorted by id without duplicate ids (see canonical),
// and at most maxMembersFor(points). It returns nil for an empty member
// set, which PickServer reports as ErrNoServers.
func newRing(ms []member, points int) *ring {
	if len(ms) == 0 {
		return nil
	}
	return bind(hashring.New(ids(ms), points), nil, ms)
}

// bind returns the ring of ms whose hashes k maps to their indexes.
func bind(k *hashring.Ring, alt *Hashing, ms []member) *ring {
	r := &ring{keys: *k, alt: alt}
	r.setMembers(ms)
	return r
}

// ids returns the ids of ms, in order: what the library's own ring draws
// their points from.
func ids(ms []member) []string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = m.id
	}
	return s
}

// owner returns the index of the member that owns hash h.
func (r *ring) owner(h uint64) uint32 { return r.keys.Owner(h) }

// slotOwner returns the index of the member that owns slot s, on the
// library's own ring.
func (r *ring) slotOwner(s uint64) uint32 { return r.keys.SlotOwner(s) }

// pick returns the member that owns hash h.
func (r *ring) pick(h uint64) *member {
	return &r.members[r.keys.Owner(h)]
}

// owners returns the member that owns hash h and its successor, the member
// that would own h if the owner left; with one member, both are it.
func (r *ring) owners(h uint64) (owner, succ *member) {
	o, s := r.keys.Owners(h)
	return &r.members[o], &r.members[s]
}

// candidates appends to dst the indexes of up to n distinct members for
// hash h, in the order a key of h would fail over (see
// hashring.Ring.Candidates). It allocates nothing when dst has room.
func (r *ring) candidates(h uint64, n int, dst []uint32) []uint32 {
	return r.keys.Candidates(h, n, dst)
}

// bytes is about the memory r takes: its members' addresses, and its slot
// table, or its Ketama continuum or Ch3 positions.
func (r *ring) bytes() int { return 8*len(r.members) + r.keys.Bytes() }

// sameIDs reports whether r has exactly the member ids of ms, in which case
// r's table can be reused and only the addresses need rebinding.
func (r *ring) sameIDs(ms []member) bool {
	return r != nil && slices.EqualFunc(r.members, ms, func(a, b member) bool { return a.id == b.id })
}

// withMembers returns a ring with r's table and the members ms, which must
// have the same ids as r's members (sameIDs). It is how a pod that keeps its
// identity but gets a new IP is rebound without rehashing.
func (r *ring) withMembers(ms []member) *ring {
	c := *r
	c.setMembers(ms)
	return &c
}

// with returns newRing(ms, points), built from r (which may be nil) when
// that costs less (see hashring.Ring.With). ms must be sorted by id
// without duplicate ids (see canonical).
func (r *ring) with(ms []member, points int) *ring {
	var k *hashring.Ring
	if r != nil {
		k = &r.keys
	}
	if k = k.With(ids(ms), points); k == nil {
		return nil
	}
	return bind(k, nil, ms)
}

// newAltRing returns the ring of h, Ketama or Ch3, over ms (sorted by id,
// see canonical), or an error naming a member that h cannot place; nil for
// no members.
func newAltRing(h Hashing, ms []member) (*ring, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	var k *hashring.Ring
	switch h.mode {
	case ketamaMode:
		names := make([]string, len(ms))
		weights := make([]uint32, len(ms))
		for i, m := range ms {
			name, err := h.name(m)
			if err != nil {
				return nil, err
			}
			names[i], weights[i] = name, h.weights[name]
		}
		k = hashring.NewKetama(names, weights, ketamaRanks(ms, names))
	case ch3Mode:
		pos := make([]int, len(ms))
		at := make(map[int]string, len(ms))
		for i, m := range ms {
			p := m.order
			if !m.static {
				var err error
				if p, err = ordinal(m); err != nil {
					return nil, err
				}
			}
			if other, ok := at[p]; ok {
				return nil, fmt.Errorf("servers %s and %s are both at index %d of Ch3's order", other, m.addr.str, p)
			}
			at[p], pos[i] = m.addr.str, p
		}
		k = hashring.NewCh3(pos)
	}
	return bind(k, &h, ms), nil
}

// ketamaRanks returns the rank of each of ms, named names, among equal
// points (see hashring.NewKetama): the other clients' list order. For
// servers given to SetServers it is the order given, as libmemcached and
// php-memcached keep the list they are given. A discovered server has no
// such order, and they rank as twemproxy ranks its servers (see
// hashring.KetamaRanks).
func ketamaRanks(ms []member, names []string) []int {
	if len(ms) > 0 && ms[0].static {
		rank := make([]int, len(ms))
		for i, m := range ms {
			rank[i] = m.order
		}
		return rank
	}
	return hashring.KetamaRanks(names)
}

// subset returns the ring of ms, some of r's members: the Client's ring
// without the servers out for it. On the library's own ring it is an
// incremental change of r; on an alt ring, that of the other clients: for
// Ketama the continuum of the servers left, as libmemcached's and
// twemproxy's ejection rebuild it, for Ch3 r's order with holes where the
// servers out were, as mcrouter keeps its list and fails over.
func (r *ring) subset(ms []member, old *ring) *ring {
	if r.alt != nil {
		s, _ := newAltRing(*r.alt, ms) // members r placed already
		return s
	}
	if old != nil {
		return old.with(ms, r.keys.Points())
	}
	return newRing(ms, r.keys.Points())
}
