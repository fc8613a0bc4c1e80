package selector

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// This file turns EndpointSlices (or core/v1 Endpoints) into ring members:
// which endpoints are eligible, on which port, in which IP family, under
// which identity; and the union of a Service's slices.

// ErrNoPort is returned by NewServerList when the Service's endpoints have no
// TCP port matching the address's port: use the pods' port number (the
// Service's targetPort) or the name of a Service port.
var ErrNoPort = errors.New("no matching port")

// decoder decodes the objects of one target.
type decoder struct {
	t        target
	legacy   bool   // core/v1 Endpoints, not EndpointSlices
	mismatch string // why the last object with endpoints had no matching port
}

// union returns the members of all slices in one IP family, each under its
// identity (see identify), canonical (see canonical), never nil. The same
// endpoint may be in two slices at once while it moves between them, or in a
// mirrored slice without its names: members are deduplicated by address,
// keeping the one with the most names.
func union(bySlice map[string][]member, family string) []member {
	all := []member{}
	for _, ms := range bySlice {
		all = append(all, ms...)
	}
	all = pickFamily(all, family)
	slices.SortFunc(all, func(a, b member) int {
		if c := strings.Compare(a.addr.str, b.addr.str); c != 0 {
			return c
		}
		ah, ap := splitNames(a.id)
		bh, bp := splitNames(b.id)
		return cmp.Or(-cmpBool(ah != "", bh != ""), -cmpBool(ap != "", bp != ""), strings.Compare(a.id, b.id))
	})
	all = slices.CompactFunc(all, func(a, b member) bool { return a.addr.str == b.addr.str })
	identify(all)
	return canonical(all)
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

// The members decode returns are provisional: the ring identity of an
// endpoint depends on the Service's other endpoints, so decode keeps the
// endpoint's names in the id, as hostname "/" pod name (either may be
// empty; neither can hold a '/'), and identify, after the union of all
// slices, replaces them with the identity.
func provisionalID(hostname, pod string) string { return hostname + "/" + pod }

func splitNames(id string) (hostname, pod string) {
	hostname, pod, _ = strings.Cut(id, "/")
	return hostname, pod
}

// identify replaces the provisional ids of ms, one member per address, with
// identities: name:port, or else ip:port. The name is the hostname (a
// StatefulSet pod's, which outlives its IP) if no other member has it as
// hostname or pod name: the pods of a Deployment with spec.hostname and
// spec.subdomain share one. Else it is the pod name, if no other member has
// it as pod name, as it has while a slice lists a pod at an old address. A
// name used is so the only one of its kind among all names, and never an IP
// address (endpointMember drops those): distinct addresses are always
// distinct members.
func identify(ms []member) {
	names := make(map[string]int, 2*len(ms)) // members with a hostname or pod name
	pods := make(map[string]int, len(ms))    // members with a pod name
	for _, m := range ms {
		h, p := splitNames(m.id)
		if h != "" {
			names[h]++
		}
		if p != "" && p != h {
			names[p]++
		}
		if p != "" {
			pods[p]++
		}
	}
	for i, m := range ms {
		h, p := splitNames(m.id)
		port := m.addr.str[strings.LastIndexByte(m.addr.str, ':')+1:]
		switch {
		case h != "" && names[h] == 1:
			ms[i].id = h + ":" + port
		case p != "" && pods[p] == 1:
			ms[i].id = p + ":" + port
		default:
			ms[i].id = m.addr.str
		}
	}
}

// equalMembers reports whether a and b have the same ids at the same
// addresses.
func equalMembers(a, b []member) bool {
	return slices.EqualFunc(a, b, func(x, y member) bool { return x.id == y.id && x.addr.str == y.addr.str })
}

// pickFamily keeps the members of one IP family: the one asked for, or IPv4
// if there are any IPv4 members and IPv6 if not. A dual-stack pod is in an
// IPv4 slice and an IPv6 slice, and must count once.
func pickFamily(ms []member, family string) []member {
	if family == "" {
		family = "IPv6"
		if slices.ContainsFunc(ms, func(m member) bool { return isIPv4(m.addr.str) }) {
			family = "IPv4"
		}
	}
	return slices.DeleteFunc(ms, func(m member) bool { return isIPv4(m.addr.str) != (family == "IPv4") })
}

func isIPv4(hostport string) bool {
	ap, err := netip.ParseAddrPort(hostport)
	return err == nil && ap.Addr().Is4()
}

// decode turns an EndpointSlice or Endpoints object into its name, resource
// version and eligible members.
func (d *decoder) decode(raw json.RawMessage) (name, rv string, ms []member, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil, errors.New("no object")
	}
	if d.legacy {
		var e endpoints
		if err := json.Unmarshal(raw, &e); err != nil {
			return "", "", nil, err
		}
		for _, s := range e.Subsets {
			p, ok := d.port(s.Ports, e.Metadata.Name)
			if !ok {
				continue
			}
			for _, a := range s.Addresses {
				if m, ok := endpointMember(a.IP, p, a.Hostname, podName(a.TargetRef)); ok {
					ms = append(ms, m)
				}
			}
		}
		return e.Metadata.Name, e.Metadata.ResourceVersion, ms, nil
	}

	var s endpointSlice
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", "", nil, err
	}
	if s.Metadata.Name == "" {
		return "", "", nil, errors.New("object has no name")
	}
	if s.AddressType != "IPv4" && s.AddressType != "IPv6" {
		return s.Metadata.Name, s.Metadata.ResourceVersion, nil, nil // FQDN slices have no defined meaning
	}
	if len(s.Endpoints) == 0 {
		return s.Metadata.Name, s.Metadata.ResourceVersion, nil, nil
	}
	p, ok := d.port(s.Ports, s.Metadata.Name)
	if !ok {
		return s.Metadata.Name, s.Metadata.ResourceVersion, nil, nil
	}
	for _, e := range s.Endpoints {
		c := e.Conditions
		// ready is serving and not terminating, unless the Service publishes
		// not-ready addresses, when ready is always true: so ask for all three.
		// A missing condition means ready, serving, not terminating.
		if len(e.Addresses) == 0 || c.Ready != nil && !*c.Ready || c.Serving != nil && !*c.Serving || c.Terminating != nil && *c.Terminating {
			continue
		}
		hostname := ""
		if e.Hostname != nil {
			hostname = *e.Hostname
		}
		if m, ok := endpointMember(e.Addresses[0], p, hostname, podName(e.TargetRef)); ok {
			ms = append(ms, m)
		}
	}
	return s.Metadata.Name, s.Metadata.ResourceVersion, ms, nil
}

// endpointMember returns the provisional member (see provisionalID) for an
// endpoint at ip and port, with its hostname and pod name ("" if none).
// Invalid or unusable IPs are skipped (see usable), so an empty one never
// becomes ":11211", which would dial localhost. A name that cannot be an
// identity is dropped (see isLabel and isSubdomain).
func endpointMember(ip string, port int, hostname, pod string) (member, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !usable(a) || port < 1 || port > 65535 {
		return member{}, false
	}
	if !isLabel(hostname) {
		hostname = ""
	}
	if !isSubdomain(pod) {
		pod = ""
	}
	hostport := net.JoinHostPort(a.String(), strconv.Itoa(port))
	return member{id: provisionalID(hostname, pod), addr: &staticAddr{network: "tcp", str: hostport}}, true
}

// usable reports whether a can be a memcached pod's address: not
// unspecified, loopback, link-local, multicast or broadcast, and without a
// zone. The EndpointSlice API rejects most of these; this is defence against
// a broken API server, whose 0.0.0.0 or 127.0.0.1 would dial the client's own
// host.
func usable(a netip.Addr) bool {
	a = a.Unmap() // ::ffff:127.0.0.1 is loopback too
	return a.Zone() == "" && !a.IsUnspecified() && !a.IsLoopback() && !a.IsLinkLocalUnicast() &&
		!a.IsMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// dns1123Subdomain is Kubernetes' DNS-1123 subdomain, less the length limit.
var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// isLabel reports whether a hostname can be an identity: a DNS-1123 label,
// at most 63 characters, as Kubernetes requires of a pod's hostname.
func isLabel(s string) bool { return len(s) <= 63 && dns1123Label.MatchString(s) }

// isSubdomain reports whether a pod name can be an identity: a DNS-1123
// subdomain, at most 253 characters, as Kubernetes requires of a pod's name,
// that is not an IP address (as an identity it would be another endpoint's).
// The limits keep a broken API server's megabyte names out of the ring.
func isSubdomain(s string) bool {
	if len(s) > maxDNSName || !dns1123Subdomain.MatchString(s) {
		return false
	}
	_, err := netip.ParseAddr(s)
	return err != nil
}

// podName returns the name of the pod ref refers to, or "".
func podName(ref *objectRef) string {
	if ref == nil || ref.Kind != "Pod" {
		return ""
	}
	return ref.Name
}

// newMember returns the member for an endpoint alone in its Service, as
// union makes it: identity name:port if the endpoint has a name, else
// ip:port.
func newMember(ip string, port int, name string) (member, bool) {
	m, ok := endpointMember(ip, port, name, name)
	if !ok {
		return member{}, false
	}
	ms := []member{m}
	identify(ms)
	return ms[0], true
}

// port resolves the address's port against one slice's ports: a name
// matches the Service port name, a number the target port. A slice without
// ports takes a numeric port as it is. No match skips the slice, and says
// why; so does a match whose number is outside 1-65535 (ports[].port is an
// int32 on the wire).
func (d *decoder) port(ps []port, slice string) (int, bool) {
	if len(ps) == 0 && d.t.port != 0 {
		return d.t.port, true
	}
	var have []string
	for _, p := range ps {
		if p.Port == nil {
			continue
		}
		n := int(*p.Port)
		name, proto := "", "TCP"
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		inRange := n >= 1 && n <= 65535
		if proto == "TCP" && d.t.portName != "" && name == d.t.portName && !inRange {
			d.mismatch = fmt.Sprintf("service %s/%s has TCP port %q = %d in %s, outside 1-65535: the slice is skipped; check the Service's targetPort",
				d.t.namespace, d.t.service, name, n, slice)
			return 0, false
		}
		if proto == "TCP" && inRange && (d.t.portName != "" && name == d.t.portName || d.t.port != 0 && n == d.t.port) {
			return n, true
		}
		h := fmt.Sprintf("%s=%d/%s", cmp.Or(name, `""`), n, proto)
		if !inRange {
			h += " (out of range)"
		}
		have = append(have, h)
	}
	want := strconv.Itoa(d.t.port)
	if d.t.portName != "" {
		want = strconv.Quote(d.t.portName)
	}
	d.mismatch = fmt.Sprintf("service %s/%s has no TCP port %s (%s has ports %s); use the pods' port number (the targetPort) or the Service port name",
		d.t.namespace, d.t.service, want, slice, cmp.Or(strings.Join(have, ", "), "none"))
	return 0, false
}

type objectRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

type port struct {
	Name     *string `json:"name"`
	Port     *int32  `json:"port"`
	Protocol *string `json:"protocol"`
}

// endpointSlice is a discovery.k8s.io/v1 EndpointSlice.
type endpointSlice struct {
	Metadata    objectMeta `json:"metadata"`
	AddressType string     `json:"addressType"`
	Endpoints   []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready       *bool `json:"ready"`
			Serving     *bool `json:"serving"`
			Terminating *bool `json:"terminating"`
		} `json:"conditions"`
		Hostname  *string    `json:"hostname"`
		TargetRef *objectRef `json:"targetRef"`
	} `json:"endpoints"`
	Ports []port `json:"ports"`
}

// endpoints is a core/v1 Endpoints.
type endpoints struct {
	Metadata objectMeta `json:"metadata"`
	Subsets  []struct {
		Addresses []struct {
			IP        string     `json:"ip"`
			Hostname  string     `json:"hostname"`
			TargetRef *objectRef `json:"targetRef"`
		} `json:"addresses"`
		Ports []port `json:"ports"`
	} `json:"subsets"`
}
