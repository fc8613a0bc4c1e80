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

// canonical sorts ms by id and removes members with a duplicate id, keeping
// the first, so that equal sets give equal rings.
func canonical(ms []member) []member {
	slices.SortStableFunc(ms, func(a, b member) int { return strings.Compare(a.id, b.id) })
	return slices.CompactFunc(ms, func(a, b member) bool { return a.id == b.id })
}
