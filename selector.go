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
// The application's service account needs a Role in the Service's namespace
// with list and watch on endpointslices in the discovery.k8s.io group (and,
// for clusters without discovery.k8s.io/v1 only, get, list and watch on
// endpoints in the core group): examples/kubernetes/rbac.yaml in this
// module's repository is that Role, its ServiceAccount and RoleBinding.
//
// # Hashing
//
// Each member has [DefaultPointsPerServer] points on a consistent-hash ring,
// drawn from the xxhash of its identity, and the ring is read at 2^20 fixed
// slots: a key goes to the owner of its xxhash's slot, so a lookup is one
// hash and one read of a table of 0.5 to 2 MB, at any number of servers. The
// identity of a StatefulSet pod is its hostname, so a pod that restarts with
// a new IP keeps its keys; other endpoints, and pods that share a hostname,
// are identified by pod name, or by IP and port. Every process that sees the
// same members routes every key to the same server.
//
// # Compatibility
//
// Every client of a cache must map keys alike. The mappings (this ring,
// [Ketama] and [Ch3]) are pinned by golden vectors in the tests; a release
// that changes one is a breaking change, and its CHANGELOG.md says so. The
// module is not yet at 1.0 (see docs/stability.md in its repository).
//
// # Logs and state
//
// The ServerList logs server changes at info level, a Service without
// EndpointSlices as a warning, and discovery errors at error level, each
// error at most once a minute: to slog.Default by default, as structured
// records with [WithSlog], or as lines with [WithLogger]. [ServerList.Stats]
// and [ServerList.HasSynced] report the state of discovery, and
// [WithOnChange] each new server set, for metrics and health checks of
// your own.
package selector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
)

// ErrNoServers is returned by PickServer when there are no servers. It is
// memcache.ErrNoServers, so errors.Is works with either.
var ErrNoServers = memcache.ErrNoServers

// ErrNotInCluster is returned by NewServerList and NewClient, wrapped (test
// it with errors.Is), when no API server was given with WithAPIServer and
// the program does not run in a Kubernetes pod. Its text names both ways
// out: a cluster reached from outside, and a fixed list of servers, which
// is what a first try on a laptop wants.
var ErrNotInCluster = errors.New("not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset): " +
	"reach a cluster from outside with WithAPIServer (kubectl proxy), or, without Kubernetes, " +
	"use a fixed list of servers: ServerList.SetServers, then NewClientFromList")

var _ memcache.ServerSelector = (*ServerList)(nil)

// ServerList is a memcache.ServerSelector over a consistent-hash ring.
//
// It is safe for concurrent use. PickServer and Each read an immutable
// snapshot of the ring without locks; a change builds a new snapshot and
// publishes it atomically, so a reader never sees a half-updated ring.
//
// The zero value is an empty list ready for SetServers. NewServerList returns
// one that Kubernetes keeps current until Close. Keys are mapped by the
// library's own ring unless WithHashing (or SetHashing) chooses the mapping
// of other clients of the same servers: see Hashing.
type ServerList struct {
	ring atomic.Pointer[ring]

	mu      sync.Mutex // serializes writers (SetServers and discovery)
	points  int        // points per member; 0 means DefaultPointsPerServer
	hashing Hashing    // how keys map to servers; fixed before the first servers
	metrics Metrics    // nil for none; set before the first servers
	service string     // "namespace/name" with discovery, for metrics

	// Discovery, set by NewServerList.
	subs     []chan<- struct{}        // told of every change (see subscribe); guarded by mu
	drains   bool                     // discovery reports draining endpoints
	zoned    bool                     // discovery reports the endpoints' zones (EndpointSlices), for ByZone
	draining atomic.Pointer[[]string] // terminating endpoints still serving (see setDraining)

	disc       discoverer    // the watch or the DNS source, for Stats; nil without discovery
	discovered bool          // discovery has published a set; used by its goroutine only
	changed    chan struct{} // signals the change hook, coalesced
	nonEmpty   chan struct{} // closed once there is a server
	stop       context.CancelFunc
	wg         sync.WaitGroup
}

// discoverer is what the ServerList reads of its discovery: a
// *discovery.Watch or *discovery.DNSSource.
type discoverer interface {
	Stats() discovery.Stats
}

// PickServer returns the server that owns key. It does not allocate or lock.
func (ss *ServerList) PickServer(key string) (net.Addr, error) {
	r := ss.ring.Load()
	if r == nil {
		return nil, ErrNoServers
	}
	if r.alt != nil {
		return r.addrs[r.owner(r.alt.sum(key))], nil
	}
	return r.addrs[r.keys.SlotOwner(slotOf(xxhash.Sum64String(key)))], nil
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
// socket (but a URL is an error), any other a TCP host:port; if any is
// malformed or fails to resolve, nothing changes. Unlike memcache.ServerList,
// the order does not matter, a server given twice (also as 127.0.0.1:011211,
// or as a host name and its address) counts once, and a change moves only
// the keys that must move.
//
// A TCP server's identity on the ring is its host:port in canonical form (an
// IP address as net/netip writes it, a host name in lower case, the port as
// a number), a Unix socket's its path as given; so a host name keeps its keys
// when its IP changes. On a ServerList from NewServerList the next discovered
// change replaces what SetServers set.
func (ss *ServerList) SetServers(servers ...string) error {
	ms, err := staticMembers(servers)
	if err != nil {
		return err
	}
	added, removed, err := ss.update(ms)
	if err != nil {
		return fmt.Errorf("selector: SetServers: %w", err)
	}
	ss.reportRing(added, removed, 0)
	return nil
}

// reportRing tells the Metrics of a change of servers, if there was one.
func (ss *ServerList) reportRing(added, removed []string, lag time.Duration) {
	ss.mu.Lock()
	m := ss.metrics
	ss.mu.Unlock()
	if m != nil && (added != nil || removed != nil) {
		m.Ring(RingEvent{Service: ss.service, Servers: len(ss.Servers()), Added: len(added), Removed: len(removed), Lag: lag})
	}
}

// reportTo makes a ServerList without discovery, and without Metrics yet,
// report its changes to m, starting with its servers now (see
// NewClientFromList).
func (ss *ServerList) reportTo(m Metrics) {
	if m == nil || ss.disc != nil {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.metrics != nil {
		return
	}
	ss.metrics = m
	if n := len(ss.Servers()); n > 0 {
		m.Ring(RingEvent{Servers: n, Added: n})
	}
}

// update publishes a ring over ms and reports which server addresses it
// added and removed; more members than a ring takes (see maxMembersFor) are
// an error, and change nothing. It reuses the previous ring's address
// values, so that PickServer returns the same net.Addr for a server across
// changes (gomemcache batches GetMulti by net.Addr), and its table when only
// addresses changed.
func (ss *ServerList) update(ms []member) (added, removed []string, err error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()

	ms = canonical(ms)
	if max := maxMembersFor(ss.pointsPerServer()); len(ms) > max {
		return nil, nil, fmt.Errorf("%d servers, more than a ring of %d points a server takes (%d)", len(ms), ss.pointsPerServer(), max)
	}
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
	case sameRing(ss.hashing, old, ms):
		return nil, nil, nil
	case ss.hashing.mode != ownRing:
		if r, err = newAltRing(ss.hashing, ms); err != nil {
			return nil, nil, err
		}
	case sameIDs:
		r = old.withMembers(ms)
	default:
		r = old.with(ms, ss.pointsPerServer())
	}
	ss.ring.Store(r)
	ss.tell()

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
	return added, removed, nil
}

// setDraining records the addresses of the endpoints that are terminating
// but still serving, and tells the subscribers if they changed.
func (ss *ServerList) setDraining(as []string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if old := ss.draining.Load(); old != nil && slices.Equal(*old, as) || old == nil && len(as) == 0 {
		return
	}
	ss.draining.Store(&as)
	ss.tell()
}

// drainingSet returns the addresses that setDraining recorded.
func (ss *ServerList) drainingSet() []string {
	if p := ss.draining.Load(); p != nil {
		return *p
	}
	return nil
}

// tell signals the subscribers. Called with ss.mu held.
func (ss *ServerList) tell() {
	for _, c := range ss.subs {
		select {
		case c <- struct{}{}:
		default: // one is pending: the subscriber will read the latest
		}
	}
}

// subscribe makes every change of ring send on c, without blocking: a
// signal already pending stands for this one too.
func (ss *ServerList) subscribe(c chan<- struct{}) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.subs = append(ss.subs, c)
}

// unsubscribe undoes subscribe(c).
func (ss *ServerList) unsubscribe(c chan<- struct{}) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.subs = slices.DeleteFunc(ss.subs, func(s chan<- struct{}) bool { return s == c })
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
// Without access to the API, addr may instead ask DNS, which is then
// polled: "dnssrv+_port._tcp.name" for SRV records (a StatefulSet pod keeps
// its keys across a new IP), "dns+name:port" or "dns:///name:port" for A or
// AAAA records. See DNS and WithDNS.
//
// NewServerList returns once it has listed the endpoints and started the
// watch; ctx bounds only that, not the watch, so give it a deadline. It fails
// fast on a bad address or option, on missing credentials, on an API server
// certificate that the CA does not verify, and on an API error that waiting
// will not fix, such as a Role without list or watch (an *APIError) or a port
// that the Service does not have (its error names the ports it has); it retries an unreachable or
// failing API server until ctx is done.
//
// A Service with no ready endpoints yet is not an error: PickServer returns
// ErrNoServers until it has some, and a Service without EndpointSlices (a
// misspelt name, or a Service without a selector) is logged as a warning.
// WithWaitForServers makes NewServerList wait for a server instead.
//
// Without WithAPIServer it uses the in-cluster configuration: the
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT variables and the pod's
// service account token and CA.
func NewServerList(ctx context.Context, addr string, opt ...Option) (*ServerList, error) {
	o, err := newOptions(opt)
	if err == nil && o.clientOpt != "" {
		err = fmt.Errorf("NewServerList: %s is an option of the Client, which a ServerList does not make: give it to NewClient, or to NewClientFromList with this ServerList", o.clientOpt)
	}
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	ss, err := startDiscovery(ctx, addr, o)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	return ss, nil
}

// Close stops discovery and returns after its goroutines have exited. The
// servers stay as they were. Close is idempotent and always returns nil; on
// a ServerList not made by NewServerList it does nothing.
//
// Close may be called from the WithOnChange function or from a Logger: it
// then returns at once, and the goroutine that called it exits when the
// callback returns.
func (ss *ServerList) Close() error {
	if ss.stop != nil {
		ss.stop()
		if !inCallback() {
			ss.wg.Wait()
		}
	}
	return nil
}
