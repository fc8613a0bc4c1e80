package selector

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeAPI is a fake Kubernetes API server that speaks the wire format the
// watcher reads: list JSON, chunked newline-delimited watch events, Status
// bodies. It serves EndpointSlices, core/v1 Endpoints and the discovery.k8s.io/v1
// discovery document. Tests script it: store objects, push events into an
// open watch, fail or hold the next request of a verb. It records every
// request. A watch stays open, silent, until the test ends it or the client
// goes away, as a dead connection would.
type fakeAPI struct {
	*httptest.Server
	t      *testing.T
	caFile string // the server's certificate, for WithCAFile ("" for plain HTTP)
	quit   chan struct{}

	mu           sync.Mutex
	rv           int
	objs         map[string]stored // by resource/namespace/name
	reqs         []fakeReq
	watches      []*fakeWatch
	faults       map[string][]fault       // one-shot error responses, by verb
	sticky       *fault                   // if set, the answer to every list and watch
	holds        map[string]chan struct{} // hold the next request of a verb until closed
	token        string                   // if set, the only bearer token accepted
	noSlices     bool                     // discovery.k8s.io/v1 is not served
	emptyWatches bool                     // end every watch as soon as it starts
	warning      string                   // a Warning header for every response
	listBodies   []string                 // one-shot 200 bodies for the next lists
}

type stored struct {
	resource, namespace, service string
	body                         json.RawMessage
}

// fakeReq is a request as the fake saw it, and its response code.
type fakeReq struct {
	verb     string // "list", "watch" or "get" (discovery)
	path     string
	rawQuery string
	query    url.Values
	auth     string
	accept   string
	agent    string
	proto    int // HTTP major version
	at       time.Time
	code     int
}

// fault is an error response, sent with a Status body.
type fault struct {
	code              int
	reason, message   string
	cause             string // details.causes[0].reason
	retryAfter        string // the Retry-After header
	retryAfterSeconds int    // details.retryAfterSeconds
}

func (ft fault) status() map[string]any {
	s := map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": ft.message, "reason": ft.reason, "code": ft.code}
	if ft.cause != "" || ft.retryAfterSeconds != 0 {
		d := map[string]any{"retryAfterSeconds": ft.retryAfterSeconds}
		if ft.cause != "" {
			d["causes"] = []map[string]string{{"reason": ft.cause, "message": ft.message}}
		}
		s["details"] = d
	}
	return s
}

var (
	expiredFault = fault{code: 410, reason: "Expired", message: "too old resource version: 3 (40)"}
	tooLargeRV   = fault{code: 504, reason: "Timeout", message: "Too large resource version: 99, current: 40",
		cause: "ResourceVersionTooLarge", retryAfterSeconds: 1}
	serverError = fault{code: 500, reason: "InternalError", message: "etcdserver: request timed out"}
)

// forbidden is the API server's 403 for a verb on EndpointSlices.
func forbidden(verb string) fault {
	return fault{code: 403, reason: "Forbidden", message: fmt.Sprintf(
		`endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:default:app" cannot %s resource "endpointslices" in API group "discovery.k8s.io" in the namespace "default"`, verb)}
}

// newFakeAPI starts a TLS fake with HTTP/2, as the API server is, and writes
// its certificate to a CA file.
func newFakeAPI(t *testing.T) *fakeAPI {
	f := newFake(t)
	f.EnableHTTP2 = true
	f.StartTLS()
	f.caFile = filepath.Join(t.TempDir(), "ca.crt")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
	require.NoError(t, os.WriteFile(f.caFile, pemCert, 0o600))
	return f
}

// newPlainFakeAPI starts a plain HTTP fake, as kubectl proxy is.
func newPlainFakeAPI(t *testing.T) *fakeAPI {
	f := newFake(t)
	f.Start()
	return f
}

func newFake(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, quit: make(chan struct{}), rv: 1, objs: map[string]stored{},
		faults: map[string][]fault{}, holds: map[string]chan struct{}{}}
	f.Server = httptest.NewUnstartedServer(f)
	f.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshakes a test makes fail
	t.Cleanup(func() {
		close(f.quit) // ends watches and holds, so Close does not wait for them
		f.Close()
	})
	return f
}

// put stores objects at a new resource version, without a watch event.
func (f *fakeAPI) put(objs ...fakeObject) {
	for _, o := range objs {
		f.store(o, false)
	}
}

// remove deletes an object, without a watch event.
func (f *fakeAPI) remove(o fakeObject) { f.store(o, true) }

// store stores or deletes o at a new resource version and returns its JSON.
func (f *fakeAPI) store(o fakeObject, del bool) json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	m := o.meta()
	m.ResourceVersion = strconv.Itoa(f.rv)
	b, err := json.Marshal(o)
	require.NoError(f.t, err)
	key := o.resource() + "/" + m.Namespace + "/" + m.Name
	if del {
		delete(f.objs, key)
	} else {
		f.objs[key] = stored{resource: o.resource(), namespace: m.Namespace, service: o.service(), body: b}
	}
	return b
}

// version returns the current resource version: a list now would return it.
func (f *fakeAPI) version() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strconv.Itoa(f.rv)
}

// failNext answers the next request of verb with ft.
func (f *fakeAPI) failNext(verb string, ft fault) {
	f.mu.Lock()
	f.faults[verb] = append(f.faults[verb], ft)
	f.mu.Unlock()
}

// answerList answers the next list with a 200 and body, as it is.
func (f *fakeAPI) answerList(body string) {
	f.mu.Lock()
	f.listBodies = append(f.listBodies, body)
	f.mu.Unlock()
}

// putRaw stores body as an EndpointSlice of the memcache Service, as it is.
func (f *fakeAPI) putRaw(name, body string) {
	f.mu.Lock()
	f.objs["endpointslices/default/"+name] = stored{resource: "endpointslices", namespace: "default", service: "memcache", body: json.RawMessage(body)}
	f.mu.Unlock()
}

// failAll answers every list and watch with ft until called with nil.
func (f *fakeAPI) failAll(ft *fault) {
	f.mu.Lock()
	f.sticky = ft
	f.mu.Unlock()
}

// hold makes the next request of verb that failNext does not answer wait,
// recorded but unanswered, until release is called.
func (f *fakeAPI) hold(verb string) (release func()) {
	c := make(chan struct{})
	f.mu.Lock()
	f.holds[verb] = c
	f.mu.Unlock()
	return sync.OnceFunc(func() { close(c) })
}

// set changes the fake's settings (token, noSlices, ...) under its lock.
func (f *fakeAPI) set(fn func(f *fakeAPI)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// requests returns the requests so far, of the given verbs or all.
func (f *fakeAPI) requests(verbs ...string) []fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	var rs []fakeReq
	for _, r := range f.reqs {
		if len(verbs) == 0 || slices.Contains(verbs, r.verb) {
			rs = append(rs, r)
		}
	}
	return rs
}

// waitRequests waits until there are n requests of verb, and returns them.
func (f *fakeAPI) waitRequests(verb string, n int) []fakeReq {
	f.t.Helper()
	var rs []fakeReq
	eventually(f.t, fmt.Sprintf("%d %s requests", n, verb), func() bool {
		rs = f.requests(verb)
		return len(rs) >= n
	})
	return rs
}

// waitWatch waits until the n-th watch (from 1) is open and returns it.
func (f *fakeAPI) waitWatch(n int) *fakeWatch {
	f.t.Helper()
	var w *fakeWatch
	eventually(f.t, fmt.Sprintf("watch %d", n), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.watches) >= n {
			w = f.watches[n-1]
		}
		return w != nil
	})
	return w
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	verb := "list"
	if r.URL.Path == "/apis/discovery.k8s.io/v1" {
		verb = "get"
	} else if q.Get("watch") == "1" || q.Get("watch") == "true" {
		verb = "watch"
	}
	f.mu.Lock()
	i := len(f.reqs)
	f.reqs = append(f.reqs, fakeReq{verb: verb, path: r.URL.Path, rawQuery: r.URL.RawQuery, query: q,
		auth: r.Header.Get("Authorization"), accept: r.Header.Get("Accept"), agent: r.UserAgent(), proto: r.ProtoMajor, at: time.Now()})
	var ft *fault
	var hold chan struct{}
	if fs := f.faults[verb]; len(fs) > 0 {
		ft, f.faults[verb] = &fs[0], fs[1:]
	} else {
		hold = f.holds[verb]
		delete(f.holds, verb)
		if verb != "get" {
			ft = f.sticky
		}
	}
	token, warning := f.token, f.warning
	f.mu.Unlock()
	respond := func(code int) {
		f.mu.Lock()
		f.reqs[i].code = code
		f.mu.Unlock()
		w.WriteHeader(code)
	}

	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		case <-f.quit:
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if warning != "" {
		w.Header().Set("Warning", warning)
	}
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		ft = &fault{code: 401, reason: "Unauthorized", message: "Unauthorized"}
	}
	if ft == nil {
		ft = f.route(r, verb)
	}
	if ft != nil {
		if ft.retryAfter != "" {
			w.Header().Set("Retry-After", ft.retryAfter)
		}
		respond(ft.code)
		json.NewEncoder(w).Encode(ft.status())
		return
	}
	switch verb {
	case "get":
		respond(200)
		fmt.Fprint(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"discovery.k8s.io/v1","resources":[{"name":"endpointslices","namespaced":true,"kind":"EndpointSlice","verbs":["get","list","watch"]}]}`)
	case "list":
		respond(200)
		f.mu.Lock()
		var body *string
		if len(f.listBodies) > 0 {
			body, f.listBodies = &f.listBodies[0], f.listBodies[1:]
		}
		f.mu.Unlock()
		if body != nil {
			fmt.Fprint(w, *body)
			return
		}
		f.list(w, r)
	case "watch":
		respond(200)
		f.watch(w, r)
	}
}

// route checks the path and selector, and returns the fault to answer with
// if they are wrong.
func (f *fakeAPI) route(r *http.Request, verb string) *fault {
	notFound := &fault{code: 404, reason: "NotFound", message: "the server could not find the requested resource"}
	f.mu.Lock()
	noSlices := f.noSlices
	f.mu.Unlock()
	if verb == "get" {
		if noSlices {
			return notFound
		}
		return nil
	}
	resource, _ := fakeRoute(r.URL.Path)
	switch {
	case resource == "" || resource == "endpointslices" && noSlices:
		return notFound
	case fakeService(resource, r.URL.Query()) == "":
		return &fault{code: 400, reason: "BadRequest", message: "unable to parse requirement: " + r.URL.RawQuery}
	}
	return nil
}

// fakeRoute returns the resource and namespace of a collection path, or "".
func fakeRoute(path string) (resource, ns string) {
	for prefix, res := range map[string]string{"/apis/discovery.k8s.io/v1/namespaces/": "endpointslices", "/api/v1/namespaces/": "endpoints"} {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			if ns, r, _ := strings.Cut(rest, "/"); r == res {
				return res, ns
			}
		}
	}
	return "", ""
}

// fakeService returns the Service a list or watch selects: by label for
// EndpointSlices, by name for Endpoints. "" is a selector the fake does not
// know, which is a bug in the client.
func fakeService(resource string, q url.Values) string {
	key, prefix := "labelSelector", "kubernetes.io/service-name="
	if resource == "endpoints" {
		key, prefix = "fieldSelector", "metadata.name="
	}
	s, _ := strings.CutPrefix(q.Get(key), prefix)
	return s
}

func (f *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	resource, ns := fakeRoute(r.URL.Path)
	svc := fakeService(resource, r.URL.Query())
	f.mu.Lock()
	var keys []string
	for k, o := range f.objs {
		if o.resource == resource && o.namespace == ns && o.service == svc {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	items := []json.RawMessage{}
	for _, k := range keys {
		items = append(items, f.objs[k].body)
	}
	rv := strconv.Itoa(f.rv)
	f.mu.Unlock()
	kind, apiVersion := "EndpointSliceList", "discovery.k8s.io/v1"
	if resource == "endpoints" {
		kind, apiVersion = "EndpointsList", "v1"
	}
	json.NewEncoder(w).Encode(map[string]any{"kind": kind, "apiVersion": apiVersion,
		"metadata": map[string]string{"resourceVersion": rv}, "items": items})
}

// fakeWatch is one open WATCH response.
type fakeWatch struct {
	f      *fakeAPI
	query  url.Values
	events chan []byte
	end    chan struct{} // closed by the test: end the response
	gone   chan struct{} // closed when the handler has returned
	ending sync.Once
}

func (f *fakeAPI) watch(w http.ResponseWriter, r *http.Request) {
	w.(http.Flusher).Flush() // the client sees the 200 now, as it would from the API server
	fw := &fakeWatch{f: f, query: r.URL.Query(), events: make(chan []byte), end: make(chan struct{}), gone: make(chan struct{})}
	defer close(fw.gone)
	f.mu.Lock()
	f.watches = append(f.watches, fw)
	empty := f.emptyWatches
	f.mu.Unlock()
	if empty {
		return
	}
	for {
		select {
		case b := <-fw.events:
			w.Write(append(b, '\n'))
			w.(http.Flusher).Flush()
		case <-fw.end:
			return
		case <-r.Context().Done():
			return
		case <-f.quit:
			return
		}
	}
}

// send writes the event {"type": typ, "object": obj} into the stream.
func (w *fakeWatch) send(typ string, obj any) {
	w.f.t.Helper()
	b, err := json.Marshal(map[string]any{"type": typ, "object": obj})
	require.NoError(w.f.t, err)
	w.sendRaw(string(b))
}

// sendRaw writes a line into the stream.
func (w *fakeWatch) sendRaw(line string) {
	w.f.t.Helper()
	select {
	case w.events <- []byte(line):
	case <-w.gone:
		w.f.t.Fatalf("watch ended before %s", line)
	}
}

// apply stores (or, for DELETED, deletes) o at a new resource version and
// sends the event, as the API server does.
func (w *fakeWatch) apply(typ string, o fakeObject) {
	w.f.t.Helper()
	w.send(typ, json.RawMessage(w.f.store(o, typ == "DELETED")))
}

// bookmark sends a BOOKMARK at a new resource version and returns it.
func (w *fakeWatch) bookmark() string {
	w.f.t.Helper()
	w.f.mu.Lock()
	w.f.rv++
	rv := strconv.Itoa(w.f.rv)
	w.f.mu.Unlock()
	w.send("BOOKMARK", map[string]any{"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
		"metadata": map[string]string{"resourceVersion": rv}})
	return rv
}

// close ends the response cleanly, as the API server does at timeoutSeconds.
func (w *fakeWatch) close() { w.ending.Do(func() { close(w.end) }) }

// The objects, as the API server writes them.

type fakeObject interface {
	meta() *fakeMeta
	resource() string
	service() string
}

type fakeMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	Annotations     map[string]string `json:"annotations,omitempty"`
}

type fakeSlice struct {
	Kind        string         `json:"kind"`
	APIVersion  string         `json:"apiVersion"`
	Metadata    fakeMeta       `json:"metadata"`
	AddressType string         `json:"addressType"`
	Endpoints   []fakeEndpoint `json:"endpoints"`
	Ports       []fakePort     `json:"ports"`
}

func (s *fakeSlice) meta() *fakeMeta  { return &s.Metadata }
func (s *fakeSlice) resource() string { return "endpointslices" }
func (s *fakeSlice) service() string  { return s.Metadata.Labels["kubernetes.io/service-name"] }

type fakeEndpoint struct {
	Addresses  []string      `json:"addresses"`
	Conditions fakeCondition `json:"conditions"`
	Hostname   *string       `json:"hostname,omitempty"`
	TargetRef  *fakeRef      `json:"targetRef,omitempty"`
}

type fakeCondition struct {
	Ready       *bool `json:"ready,omitempty"`
	Serving     *bool `json:"serving,omitempty"`
	Terminating *bool `json:"terminating,omitempty"`
}

type fakeRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type fakePort struct {
	Name     *string `json:"name,omitempty"`
	Port     *int32  `json:"port,omitempty"`
	Protocol *string `json:"protocol,omitempty"`
}

// fakeEndpoints is a core/v1 Endpoints.
type fakeEndpoints struct {
	Kind       string       `json:"kind"`
	APIVersion string       `json:"apiVersion"`
	Metadata   fakeMeta     `json:"metadata"`
	Subsets    []fakeSubset `json:"subsets,omitempty"`
}

func (e *fakeEndpoints) meta() *fakeMeta  { return &e.Metadata }
func (e *fakeEndpoints) resource() string { return "endpoints" }
func (e *fakeEndpoints) service() string  { return e.Metadata.Name }

type fakeSubset struct {
	Addresses         []fakeAddress `json:"addresses,omitempty"`
	NotReadyAddresses []fakeAddress `json:"notReadyAddresses,omitempty"`
	Ports             []fakePort    `json:"ports,omitempty"`
}

type fakeAddress struct {
	IP        string   `json:"ip"`
	Hostname  string   `json:"hostname,omitempty"`
	TargetRef *fakeRef `json:"targetRef,omitempty"`
}

// Constructors. A slice belongs to Service "memcache" in "default"; an
// endpoint is a ready pod named after its IP.

func ptr[T any](v T) *T { return &v }

// tcp is a named TCP port; name "" is the unnamed port of a one-port Service.
func tcp(name string, n int32) fakePort {
	return fakePort{Name: ptr(name), Port: ptr(n), Protocol: ptr("TCP")}
}

var memcachePort = []fakePort{tcp("memcache", 11211)}

// slice is an EndpointSlice of Service "memcache" with the given address type
// ("IPv4", "IPv6", "FQDN").
func slice(name, addressType string, ports []fakePort, eps ...fakeEndpoint) *fakeSlice {
	return &fakeSlice{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1",
		Metadata: fakeMeta{Name: name, Namespace: "default",
			Labels: map[string]string{"kubernetes.io/service-name": "memcache", "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
		AddressType: addressType, Endpoints: eps, Ports: ports}
}

// v4 is an IPv4 slice on the memcache port.
func v4(name string, eps ...fakeEndpoint) *fakeSlice {
	return slice(name, "IPv4", memcachePort, eps...)
}

// ep is a ready endpoint of pod "pod-<ip>", as the controller writes it.
func ep(ip string) fakeEndpoint {
	return fakeEndpoint{Addresses: []string{ip}, TargetRef: &fakeRef{Kind: "Pod", Namespace: "default", Name: "pod-" + ip},
		Conditions: fakeCondition{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}}
}

// cond sets the conditions; nil leaves one out.
func (e fakeEndpoint) cond(ready, serving, terminating *bool) fakeEndpoint {
	e.Conditions = fakeCondition{Ready: ready, Serving: serving, Terminating: terminating}
	return e
}

// pod sets the endpoint's pod name and, if hostname is not "", its hostname,
// as for a StatefulSet pod.
func (e fakeEndpoint) pod(name, hostname string) fakeEndpoint {
	e.TargetRef = &fakeRef{Kind: "Pod", Namespace: "default", Name: name}
	e.Hostname = nil
	if hostname != "" {
		e.Hostname = ptr(hostname)
	}
	return e
}

// legacyEndpoints is the core/v1 Endpoints of Service "memcache".
func legacyEndpoints(subsets ...fakeSubset) *fakeEndpoints {
	return &fakeEndpoints{Kind: "Endpoints", APIVersion: "v1", Metadata: fakeMeta{Name: "memcache", Namespace: "default"}, Subsets: subsets}
}
