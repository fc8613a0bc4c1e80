package selector

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
	"github.com/kubecache/k8s-memcache-selector/internal/dns"
)

// An Option configures a ServerList or a Client. NewClient takes every
// Option; NewServerList takes those of discovery and logging, and refuses
// the Client's own (WithTimeout, WithMaxIdleConns, WithMaxItemSize,
// WithDialContext, WithFailover, WithHandoff, WithMoves and WithPool) with
// an error that says so; NewClientFromList takes the Client's own,
// WithLogger, WithSlog and WithMetrics, and refuses those of discovery,
// which its ServerList has already.
//
// One rule holds for every option's argument: its zero value (0, "", nil, a
// zero struct or a zero field of one) means the default. Where a setting can
// be turned off, a negative value turns it off, as go-redis's MaxRetries: -1
// does; the setting's doc says so. Of two options that set the same thing,
// the last wins.
type Option func(o *options)

type options struct {
	log        slog.Handler
	apiServer  string
	tokenFile  string
	caFile     string
	httpClient *http.Client
	points     int
	hashing    Hashing
	onChange   func([]net.Addr)
	waitReady  bool
	legacy     bool
	family     string
	discovery  string  // the first discovery option given: NewClientFromList refuses it
	metrics    Metrics // see WithMetrics
	dns        DNS     // see WithDNS
	dnsSet     bool    // WithDNS was given

	client    clientOptions // the Client's, from client options
	clientOpt string        // the first client option given: NewServerList refuses it
	clientErr error         // a client option's bad value, reported by newOptions

	// Seams for tests.
	getenv     func(string) string
	saDir      string
	timing     timing        // the watch's; zero: client-go's
	resolvConf string        // resolv.conf's path
	dnsMaxTTL  time.Duration // the longest TTL that delays a DNS lookup; 0: maxTTLFloor
}

// timing is the watch's durations, a seam for tests.
type timing = discovery.Timing

// discoveryOption returns an Option of discovery, which NewClientFromList
// refuses: its ServerList has its discovery already.
func discoveryOption(name string, f func(o *options)) Option {
	return func(o *options) {
		if o.discovery == "" {
			o.discovery = name
		}
		f(o)
	}
}

// newOptions applies opt over the defaults and checks the result, so that a
// mistake is an error from NewServerList rather than a surprise later.
func newOptions(opt []Option) (options, error) {
	o := options{log: slog.Default().Handler(), getenv: os.Getenv, saDir: serviceAccountDir, client: defaultClientOptions(), resolvConf: dns.ResolvConf}
	for i, f := range opt {
		if f == nil {
			return o, fmt.Errorf("option %d of %d is nil", i+1, len(opt))
		}
		f(&o)
	}
	switch {
	case o.clientErr != nil:
		return o, o.clientErr
	case o.points < 0 || o.points > maxPoints:
		return o, fmt.Errorf("WithPointsPerServer(%d): want 1 to %d, or 0 for the default", o.points, maxPoints)
	case o.hashing.check() != nil:
		return o, fmt.Errorf("WithHashing: %w", o.hashing.check())
	case o.hashing.mode != ownRing && o.points != 0:
		return o, errors.New("WithPointsPerServer is for the library's own ring: Ketama has 160 points a server, as the other clients, and Ch3 none")
	}
	switch strings.ToLower(o.family) {
	case "":
	case "ipv4":
		o.family = "IPv4"
	case "ipv6":
		o.family = "IPv6"
	default:
		return o, fmt.Errorf("WithIPFamily(%q): want \"IPv4\" or \"IPv6\", as in an EndpointSlice's addressType, or \"\" for the default", o.family)
	}
	return o, nil
}

// WithLogger sends the logs to l, one formatted line a record: server
// changes at info level, errors with repeats of the same error suppressed
// for a minute. nil means the default, slog.Default(); to silence the
// logs, use WithSlog(slog.New(slog.DiscardHandler)).
func WithLogger(l Logger) Option {
	return func(o *options) {
		o.log = slog.Default().Handler()
		if l != nil {
			o.log = loggerHandler{l: l}
		}
	}
}

// WithSlog sends the logs to l as structured records: a message, a level,
// and attributes (service, namespace, and as they apply servers, added,
// removed, error). Errors repeated within a minute are suppressed; the next
// one that is logged says how many were. nil means the default,
// slog.Default(); to silence the logs, use slog.New(slog.DiscardHandler).
func WithSlog(l *slog.Logger) Option {
	return func(o *options) {
		o.log = slog.Default().Handler()
		if l != nil {
			o.log = l.Handler()
		}
	}
}

// WithAPIServer sets the URL of the Kubernetes API server, such as
// "https://203.0.113.7:6443", or "http://127.0.0.1:8001" for kubectl proxy.
// With it, no in-cluster configuration is used: add WithTokenFile and
// WithCAFile as the server needs. A token goes over plain http only to a
// loopback host, such as kubectl proxy's (which needs none). "" means the
// default, the in-cluster configuration.
func WithAPIServer(url string) Option {
	return discoveryOption("WithAPIServer", func(o *options) { o.apiServer = url })
}

// WithTokenFile sets the file holding the bearer token for the API server.
// The file is read again every minute and after a 401, so a rotated token
// is picked up. "" means the default: in a pod, the service account token.
func WithTokenFile(path string) Option {
	return discoveryOption("WithTokenFile", func(o *options) { o.tokenFile = path })
}

// WithCAFile sets the PEM file of the certificate authorities that sign the
// API server's certificate. The file is read again every 5 minutes and when
// the server's certificate fails verification, so a rotated CA is picked up.
// "" means the default: in a pod, the service account CA; outside one, the
// system roots.
func WithCAFile(path string) Option {
	return discoveryOption("WithCAFile", func(o *options) { o.caFile = path })
}

// WithHTTPClient sets the HTTP client for API requests, for TLS or proxy
// settings of your own. Its Timeout must be zero, since watches are long
// requests; the ServerList bounds each request itself. The bearer token is
// still added from the token file. WithCAFile has no effect with it. The
// ServerList uses a copy of c that refuses redirects, as Kubernetes clients
// do: following one would send the token elsewhere. nil means the default,
// a client of the ServerList's own.
func WithHTTPClient(c *http.Client) Option {
	return discoveryOption("WithHTTPClient", func(o *options) { o.httpClient = c })
}

// WithPointsPerServer sets the number of ring points per server, from 1 to
// 100,000; 0 means DefaultPointsPerServer. More points balance keys more
// evenly and make each change of servers take longer to apply; the lookup
// table's size does not change. Every process sharing a cache must use the
// same value, or they will route keys differently.
func WithPointsPerServer(n int) Option {
	return discoveryOption("WithPointsPerServer", func(o *options) { o.points = n })
}

// WithOnChange calls f with the sorted servers after each change, starting
// with the first discovered set (which may be empty), from a goroutine of the
// ServerList's own. Changes that come while f runs are coalesced into one call
// with the latest set. Use it to log or export the server count. nil means
// the default: no calls.
func WithOnChange(f func(servers []net.Addr)) Option {
	return discoveryOption("WithOnChange", func(o *options) { o.onChange = f })
}

// WithWaitForServers makes NewServerList wait until the Service has at least
// one ready server, or fail when its ctx ends, instead of returning with an
// empty list that Kubernetes fills later. Use it where starting without a
// cache is worse than not starting, with a ctx that has a deadline.
func WithWaitForServers() Option {
	return discoveryOption("WithWaitForServers", func(o *options) { o.waitReady = true })
}

// WithLegacyEndpoints makes the ServerList watch the Service's core/v1
// Endpoints instead of its EndpointSlices. It is only for API servers that do
// not serve discovery.k8s.io/v1 (before Kubernetes 1.21), and NewServerList
// falls back to Endpoints by itself there. It needs get, list and watch on
// endpoints.
func WithLegacyEndpoints() Option {
	return discoveryOption("WithLegacyEndpoints", func(o *options) { o.legacy = true })
}

// WithIPFamily picks the address family of the servers on a dual-stack
// Service: "IPv4" or "IPv6" (in any case). By default it is IPv4 when the
// Service has IPv4 endpoints and IPv6 otherwise, as with "". A Service
// without endpoints of the family asked is logged as a warning.
func WithIPFamily(family string) Option {
	return discoveryOption("WithIPFamily", func(o *options) { o.family = family })
}
