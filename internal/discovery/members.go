package discovery

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// This file turns the eligible endpoints of a Service's slices (or of a DNS
// answer) into its members: one per address, in one IP family, each under
// the identity that keeps its keys where they were.

// Member is a server that discovery found: what the root turns into a ring
// member.
type Member struct {
	ID   string // the identity that places it on the ring: name:port, or ip:port
	Addr string // ip:port, where its connections go
	Zone string // its node's topology.kubernetes.io/zone, or ""
}

// union returns the members of all slices in one IP family, each under its
// identity (see identify), canonical (see canonical), never nil. The same
// endpoint may be in two slices at once while it moves between them, or in a
// mirrored slice without its names: endpoints are deduplicated by address,
// keeping the one with the most names.
func union(bySlice map[string][]endpoint, family string) []Member {
	var all []endpoint
	for _, eps := range bySlice {
		for _, e := range eps {
			if !e.draining {
				all = append(all, e)
			}
		}
	}
	all = pickFamily(all, family)
	slices.SortFunc(all, func(a, b endpoint) int {
		return cmp.Or(strings.Compare(a.addr, b.addr),
			-cmpBool(a.hostname != "", b.hostname != ""), -cmpBool(a.pod != "", b.pod != ""),
			strings.Compare(a.hostname, b.hostname), strings.Compare(a.pod, b.pod))
	})
	all = slices.CompactFunc(all, func(a, b endpoint) bool { return a.addr == b.addr })
	return canonical(identify(all))
}

// draining returns the sorted addresses of the endpoints of all slices that
// are terminating but still serving (a pod in its grace period, whose
// preStop hook runs) and are not members: the Client reads them for a
// handoff until they stop serving.
func draining(bySlice map[string][]endpoint, family string, members []Member) []string {
	var all []endpoint
	for _, eps := range bySlice {
		for _, e := range eps {
			if e.draining {
				all = append(all, e)
			}
		}
	}
	var as []string
	for _, e := range pickFamily(all, family) {
		if !slices.ContainsFunc(members, func(m Member) bool { return m.Addr == e.addr }) {
			as = append(as, e.addr)
		}
	}
	slices.Sort(as)
	return slices.Compact(as)
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

// identify returns the members of eps, one endpoint per address, each under
// its identity: name:port, or else ip:port. The name is the hostname (a
// StatefulSet pod's, which outlives its IP) if no other endpoint has it as
// hostname or pod name: the pods of a Deployment with spec.hostname and
// spec.subdomain share one. Else it is the pod name, if no other endpoint has
// it as pod name, as it has while a slice lists a pod at an old address. A
// name used is so the only one of its kind among all names, and never an IP
// address (isSubdomain refuses those): distinct addresses are always
// distinct members.
func identify(eps []endpoint) []Member {
	names := make(map[string]int, 2*len(eps)) // endpoints with a hostname or pod name
	pods := make(map[string]int, len(eps))    // endpoints with a pod name
	for _, e := range eps {
		if e.hostname != "" {
			names[e.hostname]++
		}
		if e.pod != "" && e.pod != e.hostname {
			names[e.pod]++
		}
		if e.pod != "" {
			pods[e.pod]++
		}
	}
	ms := make([]Member, len(eps))
	for i, e := range eps {
		port := e.addr[strings.LastIndexByte(e.addr, ':')+1:]
		id := e.addr
		switch {
		case e.hostname != "" && names[e.hostname] == 1:
			id = e.hostname + ":" + port
		case e.pod != "" && pods[e.pod] == 1:
			id = e.pod + ":" + port
		}
		ms[i] = Member{ID: id, Addr: e.addr, Zone: e.zone}
	}
	return ms
}

// canonical sorts ms by identity and removes members with a duplicate
// identity, keeping the first, so that equal sets are equal slices (the
// root's ring does the same to its members).
func canonical(ms []Member) []Member {
	slices.SortStableFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(ms, func(a, b Member) bool { return a.ID == b.ID })
}

// pickFamily keeps the endpoints of one IP family: the one asked for, or
// IPv4 if there are any IPv4 endpoints and IPv6 if not. A dual-stack pod is
// in an IPv4 slice and an IPv6 slice, and must count once.
func pickFamily(eps []endpoint, family string) []endpoint {
	if family == "" {
		family = "IPv6"
		if slices.ContainsFunc(eps, func(e endpoint) bool { return isIPv4(e.addr) }) {
			family = "IPv4"
		}
	}
	return slices.DeleteFunc(eps, func(e endpoint) bool { return isIPv4(e.addr) != (family == "IPv4") })
}

// families returns the IP families of the endpoints of all slices that
// are not draining, in order: "IPv4", "IPv6".
func families(bySlice map[string][]endpoint) []string {
	var v4, v6 bool
	for _, eps := range bySlice {
		for _, e := range eps {
			if !e.draining {
				v4, v6 = v4 || isIPv4(e.addr), v6 || !isIPv4(e.addr)
			}
		}
	}
	var fs []string
	if v4 {
		fs = append(fs, "IPv4")
	}
	if v6 {
		fs = append(fs, "IPv6")
	}
	return fs
}

func isIPv4(hostport string) bool {
	ap, err := netip.ParseAddrPort(hostport)
	return err == nil && ap.Addr().Is4()
}
