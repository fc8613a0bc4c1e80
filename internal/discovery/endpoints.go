package discovery

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// This file decodes EndpointSlices (or core/v1 Endpoints) into eligible
// endpoints: which endpoints are eligible, on which port, with which names.
// members.go makes them members.

// ErrNoPort is returned by NewServerList when the Service's endpoints have no
// TCP port matching the address's port: use the pods' port number (the
// Service's targetPort) or the name of a Service port.
var ErrNoPort = errors.New("no matching port")

// decoder decodes the objects of one target.
type decoder struct {
	t        target
	legacy   bool      // core/v1 Endpoints, not EndpointSlices
	mismatch string    // why the last object with endpoints had no matching port
	trigger  time.Time // the last object's change trigger time, or zero (see objectMeta)
}

// endpoint is an eligible endpoint of one slice, before the union of all
// slices gives it its identity.
type endpoint struct {
	addr          string // ip:port, where its connections go
	hostname, pod string // its names that can be identities, or ""
	draining      bool   // terminating but still serving: not a member
	zone          string // its node's topology.kubernetes.io/zone, as the EndpointSlice controller copies it, or ""
}

// decode turns an EndpointSlice or Endpoints object into its name, resource
// version and eligible endpoints.
func (d *decoder) decode(raw json.RawMessage) (name, rv string, eps []endpoint, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil, errors.New("no object")
	}
	if d.legacy {
		var e endpoints
		if err := json.Unmarshal(raw, &e); err != nil {
			return "", "", nil, err
		}
		d.trigger = triggerTime(e.Metadata)
		for _, s := range e.Subsets {
			p, ok := d.port(s.Ports, e.Metadata.Name)
			if !ok {
				continue
			}
			for _, a := range s.Addresses {
				if e, ok := newEndpoint(a.IP, p, a.Hostname, podName(a.TargetRef)); ok {
					eps = append(eps, e)
				}
			}
		}
		return e.Metadata.Name, e.Metadata.ResourceVersion, eps, nil
	}

	var s endpointSlice
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", "", nil, err
	}
	d.trigger = triggerTime(s.Metadata)
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
		// A missing condition means ready, serving, not terminating. One
		// that is serving and terminating drains: it is no member, but its
		// values can still be read.
		serving := c.Serving == nil || *c.Serving
		terminating := c.Terminating != nil && *c.Terminating
		drains := terminating && c.Serving != nil && *c.Serving
		if len(e.Addresses) == 0 || !drains && (c.Ready != nil && !*c.Ready || !serving || terminating) {
			continue
		}
		hostname := ""
		if e.Hostname != nil {
			hostname = *e.Hostname
		}
		zone := e.Zone
		if e, ok := newEndpoint(e.Addresses[0], p, hostname, podName(e.TargetRef)); ok {
			e.draining = drains
			if zone != nil {
				e.zone = *zone
			}
			eps = append(eps, e)
		}
	}
	return s.Metadata.Name, s.Metadata.ResourceVersion, eps, nil
}

// newEndpoint returns the endpoint at ip and port, with its hostname and
// pod name ("" if none). Invalid or unusable IPs are skipped (see usable), so
// an empty one never becomes ":11211", which would dial localhost. A name
// that cannot be an identity is dropped (see isLabel and isSubdomain).
func newEndpoint(ip string, port int, hostname, pod string) (endpoint, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !usable(a) || port < 1 || port > 65535 {
		return endpoint{}, false
	}
	if !isLabel(hostname) {
		hostname = ""
	}
	if !isSubdomain(pod) {
		pod = ""
	}
	return endpoint{addr: net.JoinHostPort(a.String(), strconv.Itoa(port)), hostname: hostname, pod: pod}, true
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

// dns1123Label is Kubernetes' DNS-1123 label, as the root's address parser
// has it too.
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// maxDNSName is the length of the longest DNS name (RFC 1035's 255 octets
// on the wire, less the first length octet and the root).
const maxDNSName = 253

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
	Endpoints   bounded[struct {
		Addresses  bounded[string, limit100] `json:"addresses"`
		Conditions struct {
			Ready       *bool `json:"ready"`
			Serving     *bool `json:"serving"`
			Terminating *bool `json:"terminating"`
		} `json:"conditions"`
		Hostname  *string    `json:"hostname"`
		TargetRef *objectRef `json:"targetRef"`
		Zone      *string    `json:"zone"`
	}, limit1000] `json:"endpoints"`
	Ports bounded[port, limit100] `json:"ports"`
}

// endpoints is a core/v1 Endpoints.
type endpoints struct {
	Metadata objectMeta `json:"metadata"`
	Subsets  bounded[struct {
		Addresses bounded[struct {
			IP        string     `json:"ip"`
			Hostname  string     `json:"hostname"`
			TargetRef *objectRef `json:"targetRef"`
		}, limit1000] `json:"addresses"`
		Ports bounded[port, limit100] `json:"ports"`
	}, limit1000] `json:"subsets"`
}

// bounded is a JSON array of at most L's limit of elements, the API's own
// limits (1000 endpoints a slice, 100 ports and addresses an endpoint),
// decoded one element at a time: a broken API server's array of a million
// empty objects is an error, not gigabytes of structs.
type bounded[T any, L limit] []T

type limit interface{ max() int }

type (
	limit100  struct{}
	limit1000 struct{}
)

func (limit100) max() int  { return 100 }
func (limit1000) max() int { return 1000 }

func (b *bounded[T, L]) UnmarshalJSON(data []byte) error {
	d := json.NewDecoder(bytes.NewReader(data))
	tok, err := d.Token()
	switch {
	case err != nil:
		return err
	case tok == nil: // null
		*b = nil
		return nil
	case tok != json.Delim('['):
		return fmt.Errorf("want an array, not %v", tok)
	}
	var l L
	*b = (*b)[:0]
	for d.More() {
		if len(*b) == l.max() {
			return fmt.Errorf("an array of more than %d elements, the API's limit", l.max())
		}
		var v T
		if err := d.Decode(&v); err != nil {
			return err
		}
		*b = append(*b, v)
	}
	return nil
}

// triggerTime returns the change trigger time of m, or zero if it has none
// or it does not parse: it only measures lag, never decides anything.
func triggerTime(m objectMeta) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, m.Annotations.Trigger)
	return t
}
