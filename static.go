package selector

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// This file turns the addresses given to SetServers into ring members.

// staticMembers returns the members for SetServers' addresses, one per
// server: an address with a slash is a Unix socket, its identity the path as
// given; any other is a TCP host:port, its identity the canonical host:port
// (see canonicalHostPort). Addresses with the same identity, or that resolve
// to the same address, count once. It resolves every address or returns the
// first error.
func staticMembers(servers []string) ([]member, error) {
	ids := make([]string, 0, len(servers))
	given := make(map[string]string, len(servers)) // identity -> the first address given for it
	for _, s := range servers {
		id := s
		if !strings.Contains(s, "/") || strings.Contains(s, "://") {
			var err error
			if id, err = canonicalHostPort(s); err != nil {
				return nil, fmt.Errorf("selector: SetServers: %q: %w", s, err)
			}
		}
		if _, ok := given[id]; !ok {
			given[id] = s
			ids = append(ids, id)
		}
	}
	if len(ids) > maxMembers { // before resolving them all
		return nil, fmt.Errorf("selector: SetServers: %d servers, more than a ring takes (%d)", len(ids), maxMembers)
	}

	ms := make([]member, 0, len(ids))
	for i, id := range ids {
		var a net.Addr
		var err error
		if strings.Contains(id, "/") {
			a, err = net.ResolveUnixAddr("unix", id)
		} else {
			a, err = net.ResolveTCPAddr("tcp", id)
		}
		if err != nil {
			return nil, fmt.Errorf("selector: SetServers: %q: %w", given[id], err)
		}
		ms = append(ms, member{id: id, addr: newStaticAddr(a), static: true, order: i})
	}
	// A host name and its address, or two names of one host: one server,
	// whatever the order given.
	slices.SortFunc(ms, func(a, b member) int {
		return cmp.Or(strings.Compare(a.addr.network, b.addr.network), strings.Compare(a.addr.str, b.addr.str), strings.Compare(a.id, b.id))
	})
	return slices.CompactFunc(ms, func(a, b member) bool { return *a.addr == *b.addr }), nil
}

// canonicalHostPort returns the canonical form of a TCP host:port: an IP
// address as netip formats it, a host name in lower case, and the port as a
// decimal number without leading zeros (a service name such as "http" is
// looked up).
func canonicalHostPort(s string) (string, error) {
	const want = "; want host:port, such as 127.0.0.1:11211, or the path of a Unix socket"
	if s == "" {
		return "", errors.New("empty" + want)
	}
	if strings.Contains(s, "://") {
		return "", errors.New("a URL" + want)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return "", errors.New(ae.Err + want)
		}
		return "", fmt.Errorf("%w%s", err, want)
	}
	switch {
	case port == "":
		return "", errors.New("no port" + want)
	case host == "":
		return "", errors.New("no host; for this machine write localhost:" + port)
	}

	var n int
	switch {
	case digits.MatchString(port):
		if n, err = strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %s is out of range 1-65535", port)
		}
	case port[0] == '+' || port[0] == '-':
		// net.LookupPort would take them as numbers.
		return "", fmt.Errorf("port %q is neither a number nor a service name", port)
	default:
		if n, err = net.LookupPort("tcp", port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("unknown port %q; want a number 1-65535 or a service name from /etc/services", port)
		}
	}

	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	} else {
		host = strings.ToLower(host)
	}
	return net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// staticAddr is a net.Addr whose String and Network are precomputed: gomemcache
// calls String on every operation to key its idle-connection pool.
type staticAddr struct {
	network, str string
}

func (a *staticAddr) Network() string { return a.network }
func (a *staticAddr) String() string  { return a.str }

func newStaticAddr(a net.Addr) *staticAddr {
	return &staticAddr{network: a.Network(), str: a.String()}
}
