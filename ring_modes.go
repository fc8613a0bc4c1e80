package selector

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// A ring of Ketama or Ch3 (see Hashing) is a ring whose alt is set: its
// members and servers as on the library's own ring, and the other client's
// structure in place of the slot table.
type altRing struct {
	h    Hashing
	cont *continuum // Ketama
	ch3  *ch3Ring   // Ch3
}

// newAltRing returns the ring of h over ms (sorted by id, see canonical),
// or an error naming a member that h cannot place; nil for no members.
func newAltRing(h Hashing, ms []member) (*ring, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	r := &ring{alt: &altRing{h: h}}
	r.setMembers(ms)
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
		r.alt.cont = newContinuum(names, weights, ketamaRanks(ms, names))
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
		r.alt.ch3 = newCh3(pos)
	}
	return r, nil
}

// ketamaRanks returns the rank of each of ms, named names, among equal
// points (see newContinuum): the other clients' list order. For servers
// given to SetServers it is the order given, as libmemcached and
// php-memcached keep the list they are given. A discovered server has no
// such order, and they rank as twemproxy ranks its servers whatever its
// configuration's order: by the name it hashes (see ketamaHost), shorter
// first, then byte by byte (conf_validate_server in nc_conf.c sorts its
// servers with string_compare, and keeps them so).
func ketamaRanks(ms []member, names []string) []int {
	rank := make([]int, len(ms))
	if len(ms) > 0 && ms[0].static {
		for i, m := range ms {
			rank[i] = m.order
		}
		return rank
	}
	hosts := make([]string, len(ms))
	byName := make([]int, len(ms))
	for i, name := range names {
		hosts[i], byName[i] = ketamaHost(name), i
	}
	slices.SortStableFunc(byName, func(a, b int) int {
		return cmp.Or(cmp.Compare(len(hosts[a]), len(hosts[b])), strings.Compare(hosts[a], hosts[b]))
	})
	for r, i := range byName {
		rank[i] = r
	}
	return rank
}

// owner returns the index of the member that owns hash h.
func (r *ring) owner(h uint64) uint32 {
	switch {
	case r.alt == nil:
		return r.table.owner(slotOf(h))
	case r.alt.cont != nil:
		return r.alt.cont.owner(h)
	}
	return r.alt.ch3.owner(h)
}

// altCandidates is candidates for an alt ring: the owner, then for Ketama
// the members of the points after h's along the continuum (where its keys
// go when the owner is left out, with equal weights exactly), for Ch3 those
// of the tries after the first.
func (r *ring) altCandidates(h uint64, n int, dst []uint32) []uint32 {
	n = min(n, len(r.members))
	start := len(dst)
	add := func(m uint32) {
		if len(dst)-start < n && !slices.Contains(dst[start:], m) {
			dst = append(dst, m)
		}
	}
	if c := r.alt.cont; c != nil {
		for i, j := c.at(uint32(h)), 0; j < len(c.value) && len(dst)-start < n; i, j = c.next(i), j+1 {
			add(c.member[i])
		}
		return dst
	}
	c := r.alt.ch3
	add(c.owner(h))
	for i := 1; i <= furcMaxTries && len(dst)-start < n; i++ {
		if m := c.at[c.probe(h, i)]; m >= 0 {
			add(uint32(m))
		}
	}
	for p := 0; p < len(c.at) && len(dst)-start < n; p++ {
		if m := c.at[p]; m >= 0 {
			add(uint32(m))
		}
	}
	return dst
}

// subset returns the ring of ms, some of r's members: the Client's ring
// without the servers out for it. On the library's own ring it is an
// incremental change of r; on an alt ring, that of the other clients: for
// Ketama the continuum of the servers left, as libmemcached's and
// twemproxy's ejection rebuild it, for Ch3 r's order with holes where the
// servers out were, as mcrouter keeps its list and fails over.
func (r *ring) subset(ms []member, old *ring) *ring {
	if r.alt != nil {
		s, _ := newAltRing(r.alt.h, ms) // members r placed already
		return s
	}
	if old != nil {
		return old.with(ms, r.points)
	}
	return newRing(ms, r.points)
}
