package discovery

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The helpers of this package's tests. The root's tests drive discovery
// through NewServerList against the full fake API server of its
// fakeapi_test.go; these test the pieces alone, and need only a server that
// answers a list, a recording log, and the objects' JSON.

const waitFor = 10 * time.Second

// eventually polls cond until it holds, and fails the test if it does not
// within waitFor.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// goroutines returns the stacks of the running goroutines, by their header
// ("goroutine 7 [running]:" without the state).
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	gs := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		id, _, _ := strings.Cut(g, " [")
		gs[id] = g
	}
	return gs
}

// checkNoLeaks fails the test unless the goroutines of the watch and of the
// HTTP client's connections not in before have exited.
func checkNoLeaks(t *testing.T, before map[string]string) {
	t.Helper()
	ours := []string{"(*Watch).Run", "net/http.(*persistConn)", "net/http.(*http2ClientConn)", "net/http.(*http2clientConnReadLoop)"}
	var leaked []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked = nil
		for id, g := range goroutines() {
			if _, ok := before[id]; !ok && slices.ContainsFunc(ours, func(s string) bool { return strings.Contains(g, s) }) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(leaked) > 0 {
		t.Errorf("%d goroutines left:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	}
}

// writeFile writes a file in a new temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// recLogger records log lines as "LEVEL message: key=value ...", and passes
// them to t.Log.
type recLogger struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *recLogger) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	l.t.Log(s)
}

func (l *recLogger) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(s string) bool { return strings.Contains(s, sub) })
}

// testLog returns a log that writes to l.
func testLog(l *recLogger) *slog.Logger { return slog.New(recHandler{l: l}) }

type recHandler struct {
	l     *recLogger
	attrs []slog.Attr
}

func (h recHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	sep := ": "
	write := func(a slog.Attr) bool {
		fmt.Fprintf(&b, "%s%s=%v", sep, a.Key, a.Value.Resolve())
		sep = " "
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	h.l.add(b.String())
	return nil
}

func (h recHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recHandler{l: h.l, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
}

func (h recHandler) WithGroup(string) slog.Handler { return h }

// fakeAPI is an API server that answers every request with an empty
// EndpointSliceList, and records the requests.
type fakeAPI struct {
	*httptest.Server
	caFile string // the server's certificate, for the client's CA file

	mu   sync.Mutex
	reqs []fakeReq
}

// fakeReq is a request as the fake saw it.
type fakeReq struct {
	path, auth string
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

// newFake returns a fake, not started.
func newFake(t *testing.T) *fakeAPI {
	f := &fakeAPI{}
	f.Server = httptest.NewUnstartedServer(f)
	f.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshakes a test makes fail
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, fakeReq{path: r.URL.Path, auth: r.Header.Get("Authorization")})
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}`)
}

// requests returns the requests so far.
func (f *fakeAPI) requests() []fakeReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// The objects, as the API server writes them. A slice belongs to Service
// "memcache" in "default"; an endpoint is a ready pod named after its IP.

type fakeObject interface{ meta() *fakeMeta }

type fakeMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
}

type fakeSlice struct {
	Kind        string         `json:"kind"`
	APIVersion  string         `json:"apiVersion"`
	Metadata    fakeMeta       `json:"metadata"`
	AddressType string         `json:"addressType"`
	Endpoints   []fakeEndpoint `json:"endpoints"`
	Ports       []fakePort     `json:"ports"`
}

func (s *fakeSlice) meta() *fakeMeta { return &s.Metadata }

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

func (e *fakeEndpoints) meta() *fakeMeta { return &e.Metadata }

type fakeSubset struct {
	Addresses []fakeAddress `json:"addresses,omitempty"`
	Ports     []fakePort    `json:"ports,omitempty"`
}

type fakeAddress struct {
	IP        string   `json:"ip"`
	Hostname  string   `json:"hostname,omitempty"`
	TargetRef *fakeRef `json:"targetRef,omitempty"`
}

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
		Metadata:    fakeMeta{Name: name, Namespace: "default", Labels: map[string]string{"kubernetes.io/service-name": "memcache"}},
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
