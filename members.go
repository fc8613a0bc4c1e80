package selector

import (
	"net"
	"slices"
	"strings"
)

// member is one server on the ring. id decides where its points go; addr is
// where its connections go. They differ for StatefulSet pods, whose id (the
// pod's hostname) outlives its IP.
type member struct {
	id     string
	addr   *staticAddr
	zone   string // the endpoint's zone, for pools split by zone (see Pool); not part of the mapping
	static bool   // given to SetServers: Ketama names it by id, Ch3 places it at order
	order  int    // its place in SetServers' arguments
}

// setMembers makes ms r's members.
func (r *ring) setMembers(ms []member) {
	r.members, r.servers = ms, servers(ms)
	r.addrs = make([]*staticAddr, len(ms))
	for i, m := range ms {
		r.addrs[i] = m.addr
	}
}

// servers returns the distinct addresses of ms, sorted.
func servers(ms []member) []net.Addr {
	as := make([]net.Addr, 0, len(ms))
	for _, m := range ms {
		as = append(as, m.addr)
	}
	slices.SortFunc(as, func(a, b net.Addr) int { return strings.Compare(a.String(), b.String()) })
	return slices.CompactFunc(as, func(a, b net.Addr) bool { return a.String() == b.String() })
}

// sameRing reports whether a ring of h over ms, canonical, would be old, so
// that there is nothing to rebuild: the same members at the same addresses
// in the same zones and, where h reads the order of SetServers (Ch3's
// index, Ketama's equal points), in the same order. The library's own ring
// is the same for a set in any order.
func sameRing(h Hashing, old *ring, ms []member) bool {
	return old.sameIDs(ms) && slices.EqualFunc(old.members, ms, func(a, b member) bool {
		return a.addr == b.addr && a.zone == b.zone && (h.mode == ownRing || a.order == b.order)
	})
}

// canonical sorts ms by id and removes members with a duplicate id, keeping
// the first, so that equal sets give equal rings.
func canonical(ms []member) []member {
	slices.SortStableFunc(ms, func(a, b member) int { return strings.Compare(a.id, b.id) })
	return slices.CompactFunc(ms, func(a, b member) bool { return a.id == b.id })
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
