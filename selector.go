// Package selector routes gomemcache keys straight to the memcached pods of a
// Kubernetes Service, through a consistent-hash ring that follows the
// Service's EndpointSlices as pods come and go.
//
//	ss, err := selector.NewServerList(ctx, "memcache-headless:11211")
//	if err != nil { ... }
//	defer ss.Close()
//	cache := memcache.NewFromSelector(ss)
//
// A pod change moves only the keys that must move (about 1/N of them), where
// gomemcache's modulo hashing moves nearly all. Outside Kubernetes the zero
// [ServerList] is a consistent-hashing replacement for memcache.ServerList:
// fill it with [ServerList.SetServers].
//
// # Discovery
//
// [NewServerList] lists the Service's EndpointSlices, then watches them with
// the semantics of client-go's reflector: it resumes from the last resource
// version, relists when the API server says it has expired, and backs off with
// jitter on errors. API faults never replace a good server set with an empty
// one. Only ready endpoints are members; terminating pods leave the ring as
// soon as Kubernetes marks them.
//
// The Service's namespace needs a Role with list and watch on endpointslices
// in the discovery.k8s.io group (see the README for the manifest).
//
// # Hashing
//
// Each member has [DefaultPointsPerServer] points on the ring, placed by the
// xxhash of its identity. The identity of a StatefulSet pod is its hostname,
// so a pod that restarts with a new IP keeps its keys; other endpoints are
// identified by pod name, or by IP and port. Every process that sees the same
// members routes every key to the same server.
package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

// ErrNoServers is returned by PickServer when there are no servers. It is
// memcache.ErrNoServers, so errors.Is works with either.
var ErrNoServers = memcache.ErrNoServers

// ErrNotInCluster is returned by NewServerList when no API server was given
// with WithAPIServer and the program does not run in a Kubernetes pod.
var ErrNotInCluster = errors.New("selector: not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset); use WithAPIServer to run outside a cluster")

var _ memcache.ServerSelector = (*ServerList)(nil)

// ServerList is a memcache.ServerSelector over a consistent-hash ring.
//
// It is safe for concurrent use. PickServer and Each read an immutable
// snapshot of the ring without locks; a change builds a new snapshot and
// publishes it atomically, so a reader never sees a half-updated ring.
//
// The zero value is an empty list ready for SetServers. NewServerList returns
// one that Kubernetes keeps current until Close.
type ServerList struct {
	ring atomic.Pointer[ring]

	mu     sync.Mutex // serializes writers (SetServers and discovery)
	points int        // points per member; 0 means DefaultPointsPerServer

	changed chan struct{} // discovery: signals the change hook, coalesced
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// PickServer returns the server that owns key. It does not allocate or lock.
func (ss *ServerList) PickServer(key string) (net.Addr, error) {
	r := ss.ring.Load()
	if r == nil {
		return nil, ErrNoServers
	}
	return r.pick(xxhash.Sum64String(key)).addr, nil
}

// Each calls f for each server, in the order of Servers, and stops at the
// first error, which it returns. It iterates a snapshot and holds no lock
// while f runs, so f may take its time and call back into the ServerList.
func (ss *ServerList) Each(f func(net.Addr) error) error {
	r := ss.ring.Load()
	if r == nil {
		return nil
	}
	for _, a := range r.servers {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}

// Servers returns the current servers, sorted by address.
func (ss *ServerList) Servers() []net.Addr {
	r := ss.ring.Load()
	if r == nil {
		return nil
	}
	return slices.Clone(r.servers)
}

// SetServers changes the servers to the given ones, with the contract of
// memcache.ServerList.SetServers: an address containing a slash is a Unix
// socket, any other a TCP host:port; if any fails to resolve, nothing
// changes. Unlike memcache.ServerList, the order does not matter, a repeated
// server counts once, and a change moves only the keys that must move.
//
// Each server's identity on the ring is the string given, so a host name
// keeps its keys when its IP changes. On a ServerList from NewServerList the
// next discovered change replaces what SetServers set.
func (ss *ServerList) SetServers(servers ...string) error {
	ms := make([]member, 0, len(servers))
	for _, s := range servers {
		var a net.Addr
		var err error
		if strings.Contains(s, "/") {
			a, err = net.ResolveUnixAddr("unix", s)
		} else {
			a, err = net.ResolveTCPAddr("tcp", s)
		}
		if err != nil {
			return err
		}
		ms = append(ms, member{id: s, addr: newStaticAddr(a)})
	}
	ss.update(ms)
	return nil
}

// update publishes a ring over ms and reports which server addresses it
// added and removed. It reuses the previous ring's address values, so that
// PickServer returns the same net.Addr for a server across changes (gomemcache
// batches GetMulti by net.Addr), and the previous ring's points: all of them
// when only addresses changed, else those of the members that stay.
func (ss *ServerList) update(ms []member) (added, removed []string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()

	ms = canonical(ms)
	old := ss.ring.Load()
	var oldAddrs map[string]*staticAddr
	if old != nil {
		oldAddrs = make(map[string]*staticAddr, len(old.members))
		for _, m := range old.members {
			oldAddrs[m.addr.str] = m.addr
		}
	}
	for i, m := range ms {
		if a, ok := oldAddrs[m.addr.str]; ok && a.network == m.addr.network {
			ms[i].addr = a
		}
	}

	var r *ring
	sameIDs := old.sameIDs(ms)
	switch {
	case sameIDs && slices.EqualFunc(old.members, ms, func(a, b member) bool { return a.addr == b.addr }):
		return nil, nil
	case sameIDs:
		r = old.withMembers(ms)
	default:
		r = old.rebuild(ms, ss.pointsPerServer())
	}
	ss.ring.Store(r)

	newAddrs := map[string]bool{}
	if r != nil {
		for _, a := range r.servers {
			newAddrs[a.String()] = true
			if _, ok := oldAddrs[a.String()]; !ok {
				added = append(added, a.String())
			}
		}
	}
	for s := range oldAddrs {
		if !newAddrs[s] {
			removed = append(removed, s)
		}
	}
	slices.Sort(removed)
	if ss.changed != nil {
		select {
		case ss.changed <- struct{}{}:
		default: // a notification is already pending; it will see this ring
		}
	}
	return added, removed
}

func (ss *ServerList) pointsPerServer() int {
	if ss.points > 0 {
		return ss.points
	}
	return DefaultPointsPerServer
}

// NewServerList returns a ServerList that follows the ready endpoints of the
// Service named by addr, kept current by a watch on the Kubernetes API until
// Close.
//
// addr is "service:port", "service.namespace:port" or the Service's full DNS
// name, "service.namespace.svc.cluster.local:port". The port is the pods'
// port number (the Service's targetPort) or the name of a Service port.
// Without a namespace, the pod's own is used (POD_NAMESPACE, then the
// service account's namespace file, then "default").
//
// NewServerList returns once it has listed the endpoints and started the
// watch; ctx bounds only that, not the watch. It fails fast on a bad address,
// on missing credentials and on an API error that waiting will not fix, such
// as a Role without list or watch (an *APIError); it retries an unreachable
// or failing API server until ctx is done. A Service with no ready endpoints
// yet is not an error: PickServer returns ErrNoServers until it has some.
//
// Without WithAPIServer it uses the in-cluster configuration: the
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT variables and the pod's
// service account token and CA.
func NewServerList(ctx context.Context, addr string, opt ...Option) (*ServerList, error) {
	o := options{log: slogLogger{slog.Default()}, getenv: os.Getenv, saDir: serviceAccountDir}
	for _, f := range opt {
		f(&o)
	}
	t, err := parseTarget(addr, o)
	if err != nil {
		return nil, err
	}
	if o.points < 0 || o.points > maxPoints {
		return nil, fmt.Errorf("selector: WithPointsPerServer(%d): want 1 to %d", o.points, maxPoints)
	}
	c, err := newClient(o)
	if err != nil {
		return nil, err
	}
	lg := newLimitedLogger(o.log, time.Minute)
	c.log = lg
	ss := &ServerList{points: o.points}
	w := newWatcher(c, t, o, lg, func(ms []member) {
		added, removed := ss.update(ms)
		if added != nil || removed != nil {
			var change []string
			for _, a := range added {
				change = append(change, "+"+a)
			}
			for _, a := range removed {
				change = append(change, "-"+a)
			}
			lg.Infof("selector: %s: %d servers (%s)", t, len(ss.Servers()), strings.Join(change, " "))
		}
	})

	// The watch outlives ctx: it keeps ctx's values but not its cancellation
	// or deadline, and stops on Close.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ss.stop = cancel
	if o.onChange != nil {
		ss.changed = make(chan struct{}, 1)
		ss.wg.Go(func() { ss.notify(bg, o.onChange) })
	}
	synced := make(chan error, 1)
	ss.wg.Go(func() { w.run(bg, synced) })

	select {
	case err = <-synced:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		ss.Close()
		if last := w.lastErr; last != nil && !errors.Is(err, last) {
			err = fmt.Errorf("%w (last error: %w)", err, last)
		}
		return nil, fmt.Errorf("selector: discover %s: %w", t, err)
	}
	return ss, nil
}

// notify calls f with the current servers after every change, until ctx is
// done. Changes that come faster than f returns are coalesced: f always sees
// the latest set.
func (ss *ServerList) notify(ctx context.Context, f func([]net.Addr)) {
	for {
		select {
		case <-ss.changed:
			f(ss.Servers())
		case <-ctx.Done():
			return
		}
	}
}

// Close stops discovery and returns after its goroutines have exited. The
// servers stay as they were. Close is idempotent and always returns nil; on
// a ServerList not made by NewServerList it does nothing.
func (ss *ServerList) Close() error {
	if ss.stop != nil {
		ss.stop()
		ss.wg.Wait()
	}
	return nil
}

// An Option configures NewServerList.
type Option func(o *options)

type options struct {
	log        Logger
	apiServer  string
	tokenFile  string
	caFile     string
	httpClient *http.Client
	points     int
	onChange   func([]net.Addr)
	legacy     bool
	family     string

	// Seams for tests.
	getenv func(string) string
	saDir  string
	timing timing
}

// WithLogger sends the ServerList's logs to l. The default logs to
// slog.Default(): server changes at info level, errors at error level with
// repeats of the same error suppressed for a minute.
func WithLogger(l Logger) Option {
	return func(o *options) { o.log = l }
}

// WithSlog sends the ServerList's logs to l.
func WithSlog(l *slog.Logger) Option {
	return func(o *options) { o.log = slogLogger{l} }
}

// WithAPIServer sets the URL of the Kubernetes API server, such as
// "https://203.0.113.7:6443", or "http://127.0.0.1:8001" for kubectl proxy.
// With it, no in-cluster configuration is used: add WithTokenFile and
// WithCAFile as the server needs.
func WithAPIServer(url string) Option {
	return func(o *options) { o.apiServer = url }
}

// WithTokenFile sets the file holding the bearer token for the API server.
// The file is read again every minute and after a 401, so a rotated token
// is picked up. In a pod the default is the service account token.
func WithTokenFile(path string) Option {
	return func(o *options) { o.tokenFile = path }
}

// WithCAFile sets the PEM file of the certificate authorities that sign the
// API server's certificate. The file is read again every 5 minutes and when
// the server's certificate fails verification, so a rotated CA is picked up.
// In a pod the default is the service account CA; outside one, the system
// roots.
func WithCAFile(path string) Option {
	return func(o *options) { o.caFile = path }
}

// WithHTTPClient sets the HTTP client for API requests, for TLS or proxy
// settings of your own. Its Timeout must be zero, since watches are long
// requests; the ServerList bounds each request itself. The bearer token is
// still added from the token file. WithCAFile has no effect with it.
func WithHTTPClient(c *http.Client) Option {
	return func(o *options) { o.httpClient = c }
}

// WithPointsPerServer sets the number of ring points per server, from 1 to
// 100,000; 0 means DefaultPointsPerServer. More points balance keys more
// evenly and cost memory and rebuild time. Every process sharing a cache
// must use the same value, or they will route keys differently.
func WithPointsPerServer(n int) Option {
	return func(o *options) { o.points = n }
}

// WithOnChange calls f with the sorted servers after each change, starting
// with the first discovered set, from a goroutine of the ServerList's own.
// Changes that come while f runs are coalesced into one call with the latest
// set. Use it to log or export the server count.
func WithOnChange(f func(servers []net.Addr)) Option {
	return func(o *options) { o.onChange = f }
}

// WithLegacyEndpoints makes the ServerList watch the Service's core/v1
// Endpoints instead of its EndpointSlices. It is only for API servers that do
// not serve discovery.k8s.io/v1 (before Kubernetes 1.21), and NewServerList
// falls back to Endpoints by itself there. It needs get, list and watch on
// endpoints.
func WithLegacyEndpoints() Option {
	return func(o *options) { o.legacy = true }
}

// WithIPFamily picks the address family of the servers on a dual-stack
// Service: "IPv4" or "IPv6". By default it is IPv4 when the Service has IPv4
// endpoints and IPv6 otherwise.
func WithIPFamily(family string) Option {
	return func(o *options) { o.family = family }
}

// Logger receives the ServerList's logs. slog users can use WithSlog instead.
type Logger interface {
	Errorf(format string, args ...any)
	Infof(format string, args ...any)
}

type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Errorf(format string, args ...any) { s.l.Error(fmt.Sprintf(format, args...)) }
func (s slogLogger) Infof(format string, args ...any)  { s.l.Info(fmt.Sprintf(format, args...)) }

// limitedLogger passes on at most one error per format string per period,
// so an API server outage logs once a minute instead of once a retry.
type limitedLogger struct {
	Logger
	period time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func newLimitedLogger(l Logger, period time.Duration) *limitedLogger {
	return &limitedLogger{Logger: l, period: period, last: map[string]time.Time{}, held: map[string]int{}}
}

func (l *limitedLogger) Errorf(format string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last[format]) < l.period {
		l.held[format]++
		l.mu.Unlock()
		return
	}
	n := l.held[format]
	l.last[format], l.held[format] = now, 0
	l.mu.Unlock()
	if n > 0 {
		format += " (and %d more like it)"
		args = append(args, n)
	}
	l.Logger.Errorf(format, args...)
}

// target is a parsed NewServerList address.
type target struct {
	service, namespace string
	port               int    // the target port number, or 0 if portName is set
	portName           string // the Service port name
	addr               string // as given, for messages
}

func (t target) String() string { return t.addr }

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

var (
	dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// parseTarget parses a NewServerList address. The namespace is the host's
// second label; the third, if any, must be "svc" and the rest is the cluster
// domain.
func parseTarget(addr string, o options) (target, error) {
	t := target{addr: addr}
	bad := func(why string) error {
		return fmt.Errorf("selector: bad address %q: %s; want service:port, service.namespace:port or service.namespace.svc.cluster.local:port, such as memcache-headless:11211", addr, why)
	}
	if strings.Contains(addr, "://") {
		return t, bad("it is a URL")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return t, bad(strings.TrimPrefix(err.Error(), "address "+addr+": "))
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	t.service = labels[0]
	switch {
	case host == "":
		return t, bad("no service name")
	case !dns1035Label.MatchString(t.service):
		return t, bad(fmt.Sprintf("%q is not a Service name (lowercase letters, digits and '-', starting with a letter); for a fixed list of servers use SetServers", t.service))
	case len(labels) > 1 && !dns1123Label.MatchString(labels[1]):
		return t, bad(fmt.Sprintf("%q is not a namespace name", labels[1]))
	case len(labels) > 2 && labels[2] != "svc":
		return t, bad(fmt.Sprintf("the third label is %q, not svc", labels[2]))
	}

	if n, err := strconv.Atoi(port); err == nil {
		if n < 1 || n > 65535 {
			return t, bad(fmt.Sprintf("port %d is out of range 1-65535", n))
		}
		t.port = n
	} else if dns1123Label.MatchString(port) {
		t.portName = port
	} else {
		return t, bad(fmt.Sprintf("port %q is neither a number nor a Service port name", port))
	}

	switch {
	case len(labels) > 1:
		t.namespace = labels[1]
	case o.getenv("POD_NAMESPACE") != "":
		t.namespace = o.getenv("POD_NAMESPACE")
	default:
		t.namespace = "default"
		if b, err := os.ReadFile(o.saDir + "/namespace"); err == nil && strings.TrimSpace(string(b)) != "" {
			t.namespace = strings.TrimSpace(string(b))
		}
	}
	return t, nil
}
