package selector

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// This file keeps a set of ready members in step with a Service's
// EndpointSlices (or, on old clusters, its Endpoints). It follows client-go's
// reflector: LIST, then WATCH from the list's resource version; resume after a
// clean close; relist when the version has expired; back off with jitter
// otherwise. State is kept per slice, because endpoints move between slices,
// and the members are recomputed from all slices after every change.

// timing holds the watch's durations; tests shorten them.
type timing struct {
	watchTimeout func() time.Duration // the timeoutSeconds of each WATCH
	watchGrace   time.Duration        // client-side deadline past watchTimeout
	backoffBase  time.Duration
	backoffCap   time.Duration
	backoffReset time.Duration // start over after this long without failures
	shortWatch   time.Duration // a watch closed this fast with no events is an error
}

func defaultTiming() timing {
	return timing{
		// 5 to 10 minutes, as client-go does, to spread reconnects over time.
		watchTimeout: func() time.Duration { return 5*time.Minute + rand.N(5*time.Minute) },
		watchGrace:   30 * time.Second,
		backoffBase:  800 * time.Millisecond,
		backoffCap:   30 * time.Second,
		backoffReset: 2 * time.Minute,
		shortWatch:   time.Second,
	}
}

// watcher runs discovery for one Service. Its fields are used only by the
// goroutine running run; lastErr may be read after run has returned.
type watcher struct {
	c       *client
	t       target
	legacy  bool
	family  string
	timing  timing
	log     Logger
	publish func([]member)

	slices    map[string][]member // eligible members per slice (or Endpoints) name
	rv        string              // the last resource version seen
	mismatch  string              // why the last slice with endpoints had no matching port
	published []member            // the members last published, canonical
	lastErr   error
}

func newWatcher(c *client, t target, o options, log Logger, publish func([]member)) *watcher {
	tm := o.timing
	if tm.watchTimeout == nil {
		tm = defaultTiming()
	}
	return &watcher{c: c, t: t, legacy: o.legacy, family: o.family, timing: tm, log: log, publish: publish}
}

// errShortWatch is a watch that closed at once with no events, which, if
// resumed at once, would hammer the API server.
var errShortWatch = errors.New("watch closed immediately with no events")

// run lists and watches until ctx is done. It sends one value on synced: nil
// once the first list is published and the watch has started, or an error
// that retrying cannot fix (bad credentials, missing RBAC verbs, no matching
// port), after which it returns.
func (w *watcher) run(ctx context.Context, synced chan<- error) {
	defer w.c.close()
	var (
		listRV   = "0" // the first list may come from the API server's cache
		needList = true
		expiries = 0 // consecutive expired lists and watches
		b        = backoff{timing: w.timing}
	)
	ready := func(err error) {
		if synced != nil {
			synced <- err
			synced = nil
		}
	}
	for ctx.Err() == nil {
		if needList {
			err := w.list(ctx, listRV, synced != nil)
			switch {
			case err == nil:
				needList = false
			case errors.Is(err, errFallback):
				continue
			case expired(err):
				listRV, expiries = "", expiries+1
				if expiries > 1 {
					w.fail(ctx, &b, err)
				}
				continue
			case synced != nil && fatal(err):
				ready(err)
				return
			default:
				w.fail(ctx, &b, err)
				continue
			}
		}

		start := time.Now()
		n, err := w.watch(ctx, func() { ready(nil) })
		if n > 0 {
			expiries = 0
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && n == 0 && time.Since(start) < w.timing.shortWatch:
			w.fail(ctx, &b, errShortWatch)
		case err == nil:
			// A clean close: resume from w.rv.
		case expired(err):
			w.log.Infof("selector: %s: resource version %s expired, listing again", w.t, w.rv)
			listRV, needList, expiries = "", true, expiries+1
			if expiries > 1 {
				w.fail(ctx, &b, err)
			}
		case retriable(err):
			w.fail(ctx, &b, err) // and resume from w.rv
		default:
			if synced != nil && fatal(err) {
				ready(err)
				return
			}
			w.fail(ctx, &b, err)
			listRV, needList = w.rv, true
		}
	}
}

// fail logs err and sleeps the next backoff interval, or until ctx is done.
// The members stay as they are: an error never empties the ring. Every
// error backs off alike, a 403 after the first sync included: a restarting
// API server answers 403 until its RBAC caches fill.
func (w *watcher) fail(ctx context.Context, b *backoff, err error) {
	if ctx.Err() != nil {
		return // err is the cancellation: keep the last real error for NewServerList
	}
	w.lastErr = err
	d := b.next()
	var e *APIError
	if errors.As(err, &e) {
		d = max(d, e.retryAfter) // the server's Retry-After is a floor
	}
	w.log.Errorf("selector: %s: %v; retrying in %v, keeping %d servers", w.t, err, d.Round(time.Millisecond), len(w.published))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// fatal reports whether err is one that retrying will not fix, so that
// NewServerList should fail with it rather than wait.
func fatal(err error) bool {
	var e *APIError
	if errors.As(err, &e) {
		switch e.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusBadRequest:
			return true
		}
		return false
	}
	return errors.Is(err, errNoPort)
}

// retriable reports whether a failed watch should resume from the same
// resource version after a backoff, rather than relist: the server was
// unreachable or asked us to slow down.
func retriable(err error) bool {
	var e *APIError
	if errors.As(err, &e) {
		return e.StatusCode == http.StatusTooManyRequests
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func expired(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.expired()
}

// errFallback says the list switched to legacy Endpoints: list again at once.
var errFallback = errors.New("switched to core/v1 Endpoints")

// errNoPort is a Service whose endpoints have no port matching the address.
var errNoPort = errors.New("no matching port")

func (w *watcher) path() (string, request) {
	if w.legacy {
		return "/api/v1/namespaces/" + w.t.namespace + "/endpoints", request{resource: "endpoints", namespace: w.t.namespace}
	}
	return "/apis/discovery.k8s.io/v1/namespaces/" + w.t.namespace + "/endpointslices",
		request{resource: "endpointslices.discovery.k8s.io", namespace: w.t.namespace}
}

func (w *watcher) query() url.Values {
	if w.legacy {
		return url.Values{"fieldSelector": {"metadata.name=" + w.t.service}}
	}
	return url.Values{"labelSelector": {"kubernetes.io/service-name=" + w.t.service}}
}

// list replaces the state with a LIST at resource version rv ("0": any, from
// the cache; "": the latest) and publishes the result. An empty result is
// published too: unlike an error, it is the truth.
func (w *watcher) list(ctx context.Context, rv string, initial bool) error {
	path, r := w.path()
	r.verb = "list"
	q := w.query()
	q.Set("resourceVersion", rv)
	var l objectList
	err := w.c.list(ctx, path, q, r, &l)
	var e *APIError
	if errors.As(err, &e) && e.StatusCode == http.StatusNotFound && !w.legacy {
		// 404 on a collection means the resource is not served. Fall back
		// only if the whole discovery.k8s.io/v1 group is missing.
		served, serr := w.c.served(ctx, "/apis/discovery.k8s.io/v1", request{verb: "get", resource: "discovery.k8s.io/v1"})
		if serr == nil && !served {
			w.log.Infof("selector: %s: the API server does not serve discovery.k8s.io/v1 EndpointSlices; watching core/v1 Endpoints", w.t)
			w.legacy = true
			return errFallback
		}
	}
	if err != nil {
		return err
	}

	state := make(map[string][]member, len(l.Items))
	w.mismatch = ""
	for _, raw := range l.Items {
		name, _, ms, err := w.decode(raw)
		if err != nil {
			return err
		}
		state[name] = ms
	}
	w.slices, w.rv = state, l.Metadata.ResourceVersion
	w.recompute()
	if initial && len(w.published) == 0 && w.mismatch != "" {
		return fmt.Errorf("%w: %s", errNoPort, w.mismatch)
	}
	return nil
}

// watch runs one WATCH from w.rv, applying events as they come, until the
// stream ends. established is called once the server has accepted the watch.
// It returns the number of events read and nil for a clean close.
func (w *watcher) watch(ctx context.Context, established func()) (int, error) {
	timeout := w.timing.watchTimeout()
	// The server ends the watch after timeout; if it does not (a dead
	// connection without HTTP/2 pings, a proxy), this deadline does.
	ctx, cancel := context.WithTimeout(ctx, timeout+w.timing.watchGrace)
	defer cancel()

	path, r := w.path()
	r.verb = "watch"
	q := w.query()
	q.Set("resourceVersion", w.rv)
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", strconv.Itoa(max(1, int(timeout.Seconds()))))
	s, err := w.c.watch(ctx, path, q, r)
	if err != nil {
		return 0, err
	}
	defer s.close()
	established()

	for n := 0; ; n++ {
		ev, err := s.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return n, err
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			name, rv, ms, err := w.decode(ev.Object)
			if err != nil {
				w.log.Errorf("selector: %s: skipping %s event: %v", w.t, ev.Type, err)
				continue
			}
			if ev.Type == "DELETED" {
				delete(w.slices, name)
			} else {
				w.slices[name] = ms
			}
			w.rv = rv
			w.recompute()
		case "BOOKMARK":
			var o struct{ Metadata objectMeta }
			if json.Unmarshal(ev.Object, &o) == nil && o.Metadata.ResourceVersion != "" {
				w.rv = o.Metadata.ResourceVersion
			}
		case "ERROR":
			var st status
			if err := json.Unmarshal(ev.Object, &st); err != nil {
				return n, fmt.Errorf("decode watch error: %w", err)
			}
			return n, r.error(st, 0)
		default:
			w.log.Errorf("selector: %s: skipping watch event of unknown type %q", w.t, ev.Type)
		}
	}
}

// recompute publishes the union of all slices' members if it changed. The
// same endpoint may be in two slices at once while it moves between them, so
// members are deduplicated by address, then by identity.
func (w *watcher) recompute() {
	var all []member
	for _, ms := range w.slices {
		all = append(all, ms...)
	}
	all = pickFamily(all, w.family)
	slices.SortFunc(all, func(a, b member) int {
		return cmp.Or(strings.Compare(a.addr.str, b.addr.str), strings.Compare(a.id, b.id))
	})
	all = slices.CompactFunc(all, func(a, b member) bool { return a.addr.str == b.addr.str })
	all = canonical(all)
	if slices.EqualFunc(all, w.published, func(a, b member) bool { return a.id == b.id && a.addr.str == b.addr.str }) {
		return
	}
	w.published = all
	w.publish(slices.Clone(all))
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
func (w *watcher) decode(raw json.RawMessage) (name, rv string, ms []member, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil, errors.New("no object")
	}
	if w.legacy {
		var e endpoints
		if err := json.Unmarshal(raw, &e); err != nil {
			return "", "", nil, err
		}
		for _, s := range e.Subsets {
			p, ok := w.port(s.Ports, e.Metadata.Name)
			if !ok {
				continue
			}
			for _, a := range s.Addresses {
				name := a.Hostname
				if name == "" && a.TargetRef != nil && a.TargetRef.Kind == "Pod" {
					name = a.TargetRef.Name
				}
				if m, ok := newMember(a.IP, p, name); ok {
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
	p, ok := w.port(s.Ports, s.Metadata.Name)
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
		name := ""
		if e.Hostname != nil && *e.Hostname != "" {
			name = *e.Hostname
		} else if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
			name = e.TargetRef.Name
		}
		if m, ok := newMember(e.Addresses[0], p, name); ok {
			ms = append(ms, m)
		}
	}
	return s.Metadata.Name, s.Metadata.ResourceVersion, ms, nil
}

// newMember returns the member for an endpoint: identity name:port if the
// endpoint has a stable name, else ip:port. Invalid IPs are skipped, so an
// empty one never becomes ":11211", which would dial localhost.
func newMember(ip string, port int, name string) (member, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return member{}, false
	}
	hostport := net.JoinHostPort(a.String(), strconv.Itoa(port))
	id := hostport
	if name != "" {
		id = name + ":" + strconv.Itoa(port)
	}
	return member{id: id, addr: &staticAddr{network: "tcp", str: hostport}}, true
}

// port resolves the address's port against one slice's ports: a name
// matches the Service port name, a number the target port. A slice without
// ports takes a numeric port as it is. No match skips the slice, and says why.
func (w *watcher) port(ps []port, slice string) (int, bool) {
	if len(ps) == 0 && w.t.port != 0 {
		return w.t.port, true
	}
	var have []string
	for _, p := range ps {
		if p.Port == nil || *p.Port == 0 {
			continue
		}
		name, proto := "", "TCP"
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto == "TCP" && (w.t.portName != "" && name == w.t.portName || w.t.port != 0 && int(*p.Port) == w.t.port) {
			return int(*p.Port), true
		}
		have = append(have, fmt.Sprintf("%s=%d/%s", cmp.Or(name, `""`), *p.Port, proto))
	}
	want := strconv.Itoa(w.t.port)
	if w.t.portName != "" {
		want = strconv.Quote(w.t.portName)
	}
	w.mismatch = fmt.Sprintf("service %s/%s has no TCP port %s (%s has ports %s); use the pods' port number (the targetPort) or the Service port name",
		w.t.namespace, w.t.service, want, slice, cmp.Or(strings.Join(have, ", "), "none"))
	w.log.Errorf("selector: %s: %s", w.t, w.mismatch)
	return 0, false
}

// backoff is client-go's: from backoffBase doubling to backoffCap, each
// interval d stretched to a random point in [d, 2d), starting over after
// backoffReset without failures.
type backoff struct {
	timing
	d    time.Duration
	last time.Time
}

func (b *backoff) next() time.Duration {
	if time.Since(b.last) > b.backoffReset {
		b.d = 0
	}
	b.last = time.Now()
	b.d = min(max(b.backoffBase, 2*b.d), b.backoffCap)
	return b.d + rand.N(b.d+1)
}
