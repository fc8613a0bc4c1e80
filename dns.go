package selector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
	"github.com/kubecache/k8s-memcache-selector/internal/dns"
)

// This file is discovery by DNS: its addresses, its option, and starting
// it in place of the watch. The polling is internal/discovery's DNSSource.

// DNS configures discovery by DNS, for the dns+, dnssrv+ and dns:///
// addresses of NewServerList (see there). Every field's zero value means
// its default.
type DNS struct {
	// Server is the DNS server's host:port, such as "10.96.0.10:53" or a
	// Consul agent's "127.0.0.1:8600", and names are then asked as given.
	// The default is the first nameserver of /etc/resolv.conf, with its
	// search list and ndots, so that in a pod "dns+memcache:11211" is the
	// Service memcache of the pod's own namespace.
	Server string

	// Interval is the time between lookups (default 5 s). Each wait is
	// stretched by up to a tenth at random, so that clients started
	// together do not ask together, and is at least the answer's least
	// TTL, counted up to a minute: a longer TTL counts as a minute, so
	// that one answer cannot stop discovery for long.
	Interval time.Duration

	// Timeout is how long each query waits for its answer, twice over UDP
	// (default 2 s).
	Timeout time.Duration

	// Confirmations is how many lookups in a row must find no server (an
	// empty answer, or NXDOMAIN) before the servers are emptied (default
	// 3): one empty answer, from a DNS server restarting or a Service
	// recreated, does not drop the whole cache. Negative: never empty
	// them. A lookup that fails (a timeout, SERVFAIL) never empties them.
	Confirmations int
}

// Defaults of DNS.
const (
	defaultDNSInterval      = 5 * time.Second
	defaultDNSConfirmations = 3
	// maxTTLFloor is the longest TTL that delays a lookup.
	maxTTLFloor = time.Minute
)

// WithDNS configures discovery by DNS (see DNS). It is for the dns+,
// dnssrv+ and dns:/// addresses; with any other, NewServerList refuses it.
func WithDNS(d DNS) Option {
	return discoveryOption("WithDNS", func(o *options) { o.dns, o.dnsSet = d, true })
}

// dnsTarget is a parsed DNS address.
type dnsTarget struct {
	addr   string // as given, for messages
	name   string // the name to ask for
	srv    bool   // SRV records of name; else A or AAAA records of name
	port   int    // the servers' port, for A and AAAA
	server string // the DNS server in a dns://server/ address, or ""
}

func (t dnsTarget) String() string { return t.addr }

// The address prefixes of discovery by DNS, as Thanos and dskit write
// them, and gRPC's target scheme.
const (
	prefixDNS    = "dns+"
	prefixDNSSRV = "dnssrv+"
	schemeDNS    = "dns://"
)

// isDNSAddress reports whether addr asks for discovery by DNS.
func isDNSAddress(addr string) bool {
	return strings.HasPrefix(addr, prefixDNS) || strings.HasPrefix(addr, prefixDNSSRV) || strings.HasPrefix(addr, schemeDNS)
}

// parseDNSTarget parses a DNS address: "dns+host:port",
// "dnssrv+_port._proto.host" or "dns://[server]/host:port".
func parseDNSTarget(addr string) (dnsTarget, error) {
	t := dnsTarget{addr: addr}
	bad := func(why string) error {
		return fmt.Errorf("bad address %q: %s; want dns+host:port (A or AAAA records), dnssrv+_port._tcp.host (SRV records) or dns:///host:port, such as dns+memcache-headless:11211 or dnssrv+_memcache._tcp.memcache-headless", addr, why)
	}
	rest := addr
	switch {
	case strings.HasPrefix(addr, prefixDNSSRV):
		t.srv, t.name = true, strings.TrimPrefix(addr, prefixDNSSRV)
		if strings.Contains(t.name, ":") {
			return t, bad("an SRV address has no port: the SRV records give the ports")
		}
		if why := nameProblem(t.name, true); why != "" {
			return t, bad(why)
		}
		return t, nil
	case strings.HasPrefix(addr, prefixDNS):
		rest = strings.TrimPrefix(addr, prefixDNS)
	default:
		var ok bool
		if t.server, rest, ok = strings.Cut(strings.TrimPrefix(addr, schemeDNS), "/"); !ok {
			return t, bad("a dns: address is dns:///host:port, with three slashes, or dns://server/host:port")
		}
		if t.server != "" {
			if _, _, err := net.SplitHostPort(t.server); err != nil {
				t.server = net.JoinHostPort(strings.Trim(t.server, "[]"), "53")
			}
		}
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return t, bad(strings.TrimPrefix(err.Error(), "address "+rest+": "))
	}
	n, err := strconv.Atoi(port)
	switch {
	case err != nil:
		return t, bad(fmt.Sprintf("port %q is not a number; for a named port, ask for its SRV records: dnssrv+_%s._tcp.%s", port, port, host))
	case n < 1 || n > 65535:
		return t, bad(fmt.Sprintf("port %s is out of range 1-65535", port))
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return t, bad(fmt.Sprintf("%s is an IP address, not a name; for fixed servers use SetServers", host))
	}
	if why := nameProblem(host, false); why != "" {
		return t, bad(why)
	}
	t.name, t.port = host, n
	return t, nil
}

// nameProblem says why name is not a name to look up, or returns "".
func nameProblem(name string, srv bool) string {
	trimmed := strings.TrimSuffix(name, ".")
	if trimmed == "" {
		return "no name"
	}
	if len(trimmed) > maxDNSName {
		return fmt.Sprintf("the name is %d characters, more than the %d of a DNS name", len(trimmed), maxDNSName)
	}
	labels := strings.Split(trimmed, ".")
	for i, l := range labels {
		ok := l != "" && len(l) <= 63 && l[0] != '-' && l[len(l)-1] != '-'
		for j := 0; ok && j < len(l); j++ {
			c := l[j]
			ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' && srv && i < 2
		}
		if !ok {
			return fmt.Sprintf("%q is not a DNS label (at most 63 letters, digits and '-')", l)
		}
	}
	if srv && (len(labels) < 3 || !strings.HasPrefix(labels[0], "_") || !strings.HasPrefix(labels[1], "_")) {
		return fmt.Sprintf("an SRV name is _port._proto.host, such as _memcache._tcp.%s", labels[len(labels)-1])
	}
	return ""
}

// checkDNSOptions refuses the options that cannot apply to discovery by DNS,
// and WithDNS without it.
func checkDNSOptions(o options, dnsAddr bool) error {
	if !dnsAddr {
		if o.dnsSet {
			return errors.New("WithDNS is for discovery by DNS, with a dns+, dnssrv+ or dns:/// address; leave it out, or give such an address")
		}
		return nil
	}
	for _, k := range []struct {
		set  bool
		name string
	}{
		{o.apiServer != "", "WithAPIServer"}, {o.tokenFile != "", "WithTokenFile"}, {o.caFile != "", "WithCAFile"},
		{o.httpClient != nil, "WithHTTPClient"}, {o.legacy, "WithLegacyEndpoints"},
	} {
		if k.set {
			return fmt.Errorf("%s is for discovery through the Kubernetes API, and the address asks for DNS: leave it out, or give the Service's address without dns+", k.name)
		}
	}
	switch {
	case o.client.pool.kind == byZone:
		return errors.New("ByZone needs the zones of the Service's EndpointSlices, which DNS does not give: use AcrossServices with one DNS name per zone, or discovery through the Kubernetes API")
	case o.dns.Interval < 0 || o.dns.Timeout < 0:
		return fmt.Errorf("WithDNS: Interval %v and Timeout %v cannot be negative; 0 means the default", o.dns.Interval, o.dns.Timeout)
	}
	return nil
}

// dnsClient returns the DNS client for t: WithDNS's server, the address's,
// or resolv.conf's first with its search list.
func dnsClient(t dnsTarget, d DNS, resolvConf string) (dns.Client, error) {
	c := dns.Client{Server: d.Server, Timeout: d.Timeout}
	if c.Server == "" {
		c.Server = t.server
	}
	if c.Server != "" {
		if _, _, err := net.SplitHostPort(c.Server); err != nil {
			return c, fmt.Errorf("WithDNS: Server %q: want host:port, such as 10.96.0.10:53", c.Server)
		}
		return c, nil
	}
	conf, err := dns.ReadConfig(resolvConf)
	if err != nil {
		return c, fmt.Errorf("no DNS server to ask (%w): give one with WithDNS(DNS{Server: ...})", err)
	}
	c.Server, c.Search, c.Ndots = conf.Servers[0], conf.Search, conf.Ndots
	return c, nil
}

// startDNS starts discovery by DNS for the address addr, and returns its
// ServerList once the first lookup has answered.
func startDNS(ctx context.Context, addr string, o options) (*ServerList, error) {
	t, err := parseDNSTarget(addr)
	if err != nil {
		return nil, err
	}
	if err := checkDNSOptions(o, true); err != nil {
		return nil, err
	}
	c, err := dnsClient(t, o.dns, o.resolvConf)
	if err != nil {
		return nil, err
	}
	log := dnsLog(o.log, t)
	ss := &ServerList{points: o.points, hashing: o.hashing, changed: make(chan struct{}, 1), nonEmpty: make(chan struct{}),
		metrics: o.metrics, service: t.addr}
	src := discovery.NewDNS(discovery.DNSConfig{Target: discovery.DNSTarget{Addr: t.addr, Name: t.name, SRV: t.srv, Port: t.port},
		Client: c, Family: o.family, Log: log, Report: ss.reportDiscovery(),
		Interval: cmp.Or(o.dns.Interval, defaultDNSInterval), MaxTTL: cmp.Or(o.dnsMaxTTL, maxTTLFloor), Confirmations: cmp.Or(o.dns.Confirmations, defaultDNSConfirmations),
		Publish: func(ms []discovery.Member) error { return ss.publish(toMembers(ms), nil, 0, log) }})
	ss.disc = src

	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ss.stop = cancel
	if o.onChange != nil {
		ss.wg.Go(func() { ss.notify(bg, o.onChange) })
	}
	ready := make(chan struct{})
	ss.wg.Go(func() { src.Run(bg, ready) })

	select {
	case <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil && o.waitReady {
		select {
		case <-ss.nonEmpty:
		case <-ctx.Done():
			err = fmt.Errorf("%w: DNS has no server for %s (WithWaitForServers)", ctx.Err(), t)
		}
	}
	if err != nil {
		ss.Close()
		if last := src.Stats().LastError; last != nil {
			err = fmt.Errorf("%w (last error: %w)", err, last)
		}
		return nil, fmt.Errorf("discover %s: %w", t, err)
	}
	return ss, nil
}

// dnsLog is newLog for a DNS address.
func dnsLog(h slog.Handler, t dnsTarget) *slog.Logger {
	return slog.New(newLimitHandler(h, errorPeriod)).With(keyService, t.addr)
}

// discoveryLog returns the logger of discovery of addr (parsed already):
// the watch's or DNS's.
func discoveryLog(o options, addr string) *slog.Logger {
	if isDNSAddress(addr) {
		t, _ := parseDNSTarget(addr)
		return dnsLog(o.log, t)
	}
	t, _ := parseTarget(addr, o.getenv, o.saDir)
	return newLog(o.log, t)
}
