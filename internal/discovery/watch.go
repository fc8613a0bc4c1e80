package discovery

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
// otherwise. State is kept per slice, because endpoints move between slices;
// the events that arrive together are applied together, then the members are
// recomputed once.

// fallbackChecks is how many times in a row the API server must say that it
// does not serve EndpointSlices before the watcher falls back to Endpoints,
// so that an API server still starting up does not switch it for good.
const fallbackChecks = 3

// WatchConfig is what a Watch needs: explicit values, not the root's
// options.
type WatchConfig struct {
	Service, Namespace string
	Port               int    // the pods' port number (the Service's targetPort), or 0 with PortName
	PortName           string // the name of a Service port
	Client             ClientConfig
	Legacy             bool   // watch core/v1 Endpoints from the start
	Family             string // "IPv4", "IPv6" or "" for either
	Timing             Timing // the zero Timing: client-go's
	Log                *slog.Logger
	Report             Report // nil for none
	// Publish takes the members and the draining addresses (sorted) after
	// the first list and after every change; lag is the time since the
	// change's trigger, or 0. A set it refuses is logged, and the last
	// set stays.
	Publish func(ms []Member, draining []string, lag time.Duration) error
}

// NewWatch returns the Watch of cfg's Service, with a client for cfg's API
// server; it fails on a bad URL or token file, or a CA file without a
// certificate. Run starts it.
func NewWatch(cfg WatchConfig) (*Watch, error) {
	c, err := newClient(clientConfig{server: cfg.Client.Server, tokenFile: cfg.Client.TokenFile, caFile: cfg.Client.CAFile,
		httpClient: cfg.Client.HTTPClient, log: cfg.Log})
	if err != nil {
		return nil, err
	}
	return newWatcher(c, watchConfig{
		target: target{service: cfg.Service, namespace: cfg.Namespace, port: cfg.Port, portName: cfg.PortName},
		legacy: cfg.Legacy, family: cfg.Family, timing: cfg.Timing, log: cfg.Log, report: cfg.Report, publish: cfg.Publish,
	}), nil
}

// Stats returns the state of the watch. It is safe to call from any
// goroutine.
func (w *Watch) Stats() Stats { return w.stats.get() }

// watchConfig is WatchConfig, as the watch uses it.
type watchConfig struct {
	target  target
	legacy  bool
	family  string
	timing  Timing
	log     *slog.Logger
	report  Report
	publish func(ms []Member, draining []string, lag time.Duration) error
}

// phase is where a watcher is in its life.
type phase int

const (
	starting phase = iota // before the first sync: fatal errors end NewServerList
	synced                // listed and watching: every error is retried
)

// Watch runs discovery for one Service. Its fields are used only by the
// goroutine running Run, but for stats, which has its own lock.
type Watch struct {
	watchConfig
	c      *client
	res    resource
	dec    decoder
	phase  phase
	stats  stats
	warned bool   // about a Service without EndpointSlices
	noFam  string // the families seen when the family asked was last said to have no endpoints

	slices    map[string][]endpoint // eligible endpoints per slice (or Endpoints) name
	rv        string                // the last resource version seen
	listRV    string                // the resource version of the next LIST
	needList  bool
	lists     int // successful LISTs
	expiries  int // expired lists and watches in a row
	notServed int // answers in a row that discovery.k8s.io/v1 is not served
	published []Member
	drained   []string  // the draining addresses published
	trigger   time.Time // the newest change trigger time of the slices changed since the last publish
	backoff   backoff
}

func newWatcher(c *client, cfg watchConfig) *Watch {
	if cfg.timing.WatchTimeout == nil {
		cfg.timing = defaultTiming()
	}
	w := &Watch{
		watchConfig: cfg, c: c, dec: decoder{t: cfg.target},
		listRV:   "0", // the first list may come from the API server's cache
		needList: true, backoff: backoff{Timing: cfg.timing},
	}
	w.stats.report = cfg.report
	w.use(cfg.legacy)
	return w
}

// use makes the watcher list and watch EndpointSlices, or if legacy core/v1
// Endpoints: the one place that chooses.
func (w *Watch) use(legacy bool) {
	w.res = resourceFor(w.target, legacy)
	w.dec.legacy = legacy
}

// verdict is what the watcher does after a LIST or a WATCH ends.
type verdict int

const (
	proceed       verdict = iota // watch (again) from w.rv
	relistNow                    // list again at once: the watcher switched to Endpoints
	relistLatest                 // list the latest version: w.rv has expired
	backoffResume                // back off, then watch again from w.rv
	backoffRelist                // back off, then list again
	fatal                        // waiting will not fix it: fail the start, or back off and relist
)

// errShortWatch is a watch that the server ended at once: resuming at once
// would hammer it.
var errShortWatch = errors.New("the API server ended the watch within a second")

// errFallback says the list switched to legacy Endpoints.
var errFallback = errors.New("switched to core/v1 Endpoints")

// classify is the watcher's one decision on an error.
func classify(err error) verdict {
	var e *APIError
	var cert *tls.CertificateVerificationError
	switch {
	case err == nil:
		return proceed
	case errors.Is(err, errFallback):
		return relistNow
	case errors.As(err, &e) && e.expired():
		return relistLatest
	case errors.As(err, &e) && e.StatusCode == http.StatusTooManyRequests,
		errors.Is(err, errShortWatch), errors.Is(err, syscall.ECONNREFUSED):
		return backoffResume
	case errors.As(err, &e):
		switch e.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusBadRequest:
			return fatal
		}
		return backoffRelist
	case errors.Is(err, ErrNoPort), errors.As(err, &cert), errors.As(err, new(*redirectError)):
		return fatal
	}
	return backoffRelist
}

// Run lists and watches until ctx is done, and closes the client's
// connections. It sends one value on ready: nil
// once the first list is published and the watch has started, or an error
// that retrying cannot fix (bad credentials or certificate, missing RBAC
// verbs, no matching port), after which it returns.
func (w *Watch) Run(ctx context.Context, ready chan<- error) {
	defer w.c.close()
	for ctx.Err() == nil {
		var err error
		if w.needList {
			err = w.list(ctx)
		} else {
			start := time.Now()
			err = w.watch(ctx, func() {
				if w.phase == starting {
					w.phase = synced
					w.stats.synced()
					ready <- nil
				}
			})
			if err == nil && time.Since(start) < w.timing.ShortWatch {
				err = errShortWatch
			}
		}
		if ctx.Err() != nil {
			return
		}
		v := classify(err)
		if v != proceed && v != relistNow {
			w.stats.failed(err)
		}
		if v == fatal && w.phase == starting {
			ready <- err
			return
		}
		switch v {
		case proceed:
			w.expiries = 0
			w.needList = false
		case relistNow:
			w.needList = true
		case relistLatest:
			w.log.Info("resource version expired; listing again", "resource_version", w.rv)
			w.listRV, w.needList, w.expiries = "", true, w.expiries+1
			if w.expiries > 1 {
				w.sleep(ctx, err)
			}
		case backoffResume:
			w.sleep(ctx, err)
		case backoffRelist, fatal:
			w.sleep(ctx, err)
			w.listRV, w.needList = w.rv, true
		}
	}
}

// sleep logs err and sleeps the next backoff interval, or until ctx is done.
// The members stay as they are: an error never empties the ring. Every
// error backs off alike, a 403 after the first sync included: a restarting
// API server answers 403 until its RBAC caches fill.
func (w *Watch) sleep(ctx context.Context, err error) {
	d := w.backoff.next()
	var e *APIError
	if errors.As(err, &e) {
		d = max(d, min(e.retryAfter, w.timing.MaxRetryAfter)) // the server's Retry-After is a floor
	}
	w.log.Error("discovery failed; keeping the servers and retrying",
		keyError, err.Error(), keyRetryIn, d.Round(time.Millisecond).String(), keyServers, len(w.published))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// list replaces the state with a LIST at w.listRV ("0": any, from the
// cache; "": the latest) and publishes the result. An empty result is
// published too: unlike an error, it is the truth. An item that does not
// decode is skipped and logged, as a bad watch event is.
func (w *Watch) list(ctx context.Context) error {
	r, q := w.res.request("list", "resourceVersion", w.listRV)
	var l objectList
	err := w.c.list(ctx, w.res.path, q, r, &l)
	var e *APIError
	if errors.As(err, &e) && e.StatusCode == http.StatusNotFound && !w.res.legacy {
		return w.fallback(ctx, err)
	}
	w.notServed = 0
	if err != nil {
		return err
	}
	if l.Kind != w.res.listKind || l.Metadata.ResourceVersion == "" {
		return fmt.Errorf("the API server answered a LIST of %s with kind %q and resource version %q, not a %s: is WithAPIServer's URL a Kubernetes API server?",
			r.resource, l.Kind, l.Metadata.ResourceVersion, w.res.listKind)
	}
	if w.lists++; w.lists > 1 {
		w.stats.relisted()
	}

	state := make(map[string][]endpoint, len(l.Items))
	w.dec.mismatch = ""
	for _, raw := range l.Items {
		name, _, eps, err := w.dec.decode(raw)
		if err != nil {
			w.log.Error("skipping a listed object that does not decode", keyError, err.Error())
			continue
		}
		state[name] = eps
	}
	w.slices, w.rv = state, l.Metadata.ResourceVersion
	w.stats.heard()
	if len(l.Items) == 0 && !w.warned {
		w.warned = true
		w.log.Warn(fmt.Sprintf("the Service has no %s: check the Service's name and namespace, and that it has a selector", w.res.noun))
	}
	if w.phase == starting && w.dec.mismatch != "" && len(union(w.slices, w.family)) == 0 {
		return fmt.Errorf("%w: %s", ErrNoPort, w.dec.mismatch)
	}
	w.recompute()
	return nil
}

// fallback handles a 404 on the EndpointSlice collection, which means the
// resource is not served. It switches to Endpoints only if the whole
// discovery.k8s.io/v1 group is missing, fallbackChecks times in a row.
func (w *Watch) fallback(ctx context.Context, notFound error) error {
	served, err := w.c.served(ctx, "/apis/discovery.k8s.io/v1", request{verb: "get", resource: "discovery.k8s.io/v1"})
	switch {
	case err != nil:
		return err
	case served:
		w.notServed = 0
		return notFound
	}
	if w.notServed++; w.notServed < fallbackChecks {
		return fmt.Errorf("the API server does not serve discovery.k8s.io/v1 (%d of %d checks before watching core/v1 Endpoints)", w.notServed, fallbackChecks)
	}
	w.log.Info("the API server does not serve discovery.k8s.io/v1 EndpointSlices; watching core/v1 Endpoints")
	w.use(true)
	w.notServed = 0
	return errFallback
}

// watch runs one WATCH from w.rv, applying events as they come, until the
// stream ends. established is called once the server has accepted the watch.
// It returns nil for a clean close.
func (w *Watch) watch(ctx context.Context, established func()) error {
	timeout := w.timing.WatchTimeout()
	// The server ends the watch after timeout; if it does not (a dead
	// connection without HTTP/2 pings, a proxy), this deadline does.
	ctx, cancel := context.WithTimeout(ctx, timeout+w.timing.WatchGrace)
	defer cancel()

	r, q := w.res.request("watch", "resourceVersion", w.rv, "allowWatchBookmarks", "true",
		"timeoutSeconds", strconv.Itoa(max(1, int(timeout.Seconds()))))
	if w.phase == synced {
		w.stats.rewatched()
	}
	s, err := w.c.watch(ctx, w.res.path, q, r)
	if err != nil {
		return err
	}
	defer s.close()
	w.stats.heard()
	established()

	dirty := false // a slice changed since the last recompute
	defer func() {
		if dirty {
			w.recompute()
		}
	}()
	for {
		ev, err := s.next()
		if err == nil {
			w.stats.heard()
			var changed bool
			changed, err = w.apply(ev, r)
			dirty = dirty || changed
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return err
		}
		// Events that arrived together are applied together: recompute
		// once the buffered ones are done.
		if dirty && !s.more() {
			w.recompute()
			dirty = false
		}
	}
}

// apply applies one watch event to the state and reports whether the
// members of a slice changed; an ERROR event is returned as an error. An
// event that changes nothing, such as a slice's new resource version alone,
// costs the decoding of that slice and no more.
func (w *Watch) apply(ev event, r request) (changed bool, err error) {
	switch ev.Type {
	case "ADDED", "MODIFIED", "DELETED":
		name, rv, eps, err := w.dec.decode(ev.Object)
		if err != nil {
			w.log.Error("skipping a watch event that does not decode", "type", ev.Type, keyError, err.Error())
			return false, nil
		}
		w.rv = rv
		old, had := w.slices[name]
		switch {
		case ev.Type == "DELETED":
			delete(w.slices, name)
			return had, nil
		case !had || !slices.Equal(old, eps):
			w.slices[name] = eps
			if w.dec.trigger.After(w.trigger) {
				w.trigger = w.dec.trigger
			}
			return true, nil
		}
	case "BOOKMARK":
		var o struct{ Metadata objectMeta }
		if json.Unmarshal(ev.Object, &o) == nil && o.Metadata.ResourceVersion != "" {
			w.rv = o.Metadata.ResourceVersion
		}
	case "ERROR":
		var st status
		if err := json.Unmarshal(ev.Object, &st); err != nil {
			return false, fmt.Errorf("decode watch error: %w", err)
		}
		return false, r.error(st, 0)
	default:
		w.log.Error("skipping a watch event of unknown type", "type", ev.Type)
	}
	return false, nil
}

// warnFamily warns, given the members all, that the Service has endpoints
// but none of the family WithIPFamily asked for: once, and again when the
// families seen change.
func (w *Watch) warnFamily(all []Member) {
	if w.family == "" || len(all) > 0 {
		w.noFam = ""
		return
	}
	if fs := families(w.slices); len(fs) > 0 && strings.Join(fs, ", ") != w.noFam {
		w.noFam = strings.Join(fs, ", ")
		w.log.Warn(fmt.Sprintf("WithIPFamily(%q): the Service has no %s endpoints, only %s ones, so there are no servers: ask for %q, or leave WithIPFamily out",
			w.family, w.family, strings.Join(fs, " and "), fs[0]))
	}
}

// recompute publishes the union of all slices' members after the first list
// and after every change. A set that publish refuses (too many members) is
// logged, and the ring keeps the last set.
func (w *Watch) recompute() {
	var lag time.Duration
	if !w.trigger.IsZero() {
		lag, w.trigger = max(time.Since(w.trigger), 0), time.Time{}
	}
	all := union(w.slices, w.family)
	w.warnFamily(all)
	dr := draining(w.slices, w.family, all)
	if w.published != nil && slices.Equal(all, w.published) && slices.Equal(dr, w.drained) {
		return
	}
	w.drained = dr
	if err := w.publish(all, dr, lag); err != nil {
		w.log.Error("refusing the Service's endpoints; keeping the servers", keyError, err.Error(), keyServers, len(w.published))
		return
	}
	w.published = all
}
