// Package testcluster runs what the tests of the metrics adapters (the
// modules in extra/) need of a cluster: real memcached servers on loopback,
// and a fake Kubernetes API server whose Service "memcache" in "default"
// has one EndpointSlice a server, so that a test drives a real Client
// through NewClient, discovery included. The root package's own tests have
// a far fuller fake; this one is only what a list and a watch need.
package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Addr is the address to give NewClient for the fake API's Service.
const Addr = "memcache.default:memcache"

// A Server is a memcached process on 127.0.0.1.
type Server struct {
	Addr    string // where it listens, 127.0.0.1:port
	PodAddr string // its address in the fake API's EndpointSlices, 192.0.2.1:port, which Dial reaches
	cmd     *exec.Cmd
}

// podIP is the servers' address in the EndpointSlices: the ServerList
// refuses loopback endpoints (a broken API server's 127.0.0.1 would dial
// the client's own host), so they are listed at a documentation address,
// which Dial takes to loopback.
const podIP = "192.0.2.1"

// Dial is a DialContext for selector.WithDialContext that reaches a
// Server's PodAddr.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == podIP {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Kill SIGKILLs the server and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Memcached starts a memcached on 127.0.0.1, which the test stops. It
// skips the test if memcached is not installed, and fails it under
// SELECTOR_REQUIRE_PEERS, as the root's tests do.
func Memcached(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatalf("memcached is not installed (make test-deps installs it): %v", err)
		}
		t.Skipf("memcached is not installed (make test-deps installs it): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	s := &Server{Addr: addr, PodAddr: net.JoinHostPort(podIP, port), cmd: exec.Command(bin, "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1")}
	if os.Getuid() == 0 {
		s.cmd.Args = append(s.cmd.Args, "-u", "nobody")
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached at %s did not start: %v", addr, err)
		}
	}
}

// API is a fake Kubernetes API server over plain HTTP (which NewClient
// takes from loopback with WithAPIServer, without a token).
type API struct {
	*httptest.Server
	mu      sync.Mutex
	rv      int
	slices  map[string][]byte // the EndpointSlice of each server, by address
	watches []chan []byte
}

// NewAPI starts an API whose Service has the given servers.
func NewAPI(t testing.TB, servers ...*Server) *API {
	a := &API{slices: map[string][]byte{}}
	for _, s := range servers {
		a.slices[s.PodAddr] = a.slice(s.PodAddr, time.Time{})
	}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// Add adds a server's slice and tells the watches, with a change trigger
// time of changed (as the EndpointSlice controller writes it), from which
// the ServerList measures its lag.
func (a *API) Add(s *Server, changed time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.slice(s.PodAddr, changed)
	a.slices[s.PodAddr] = b
	for _, w := range a.watches {
		w <- []byte(`{"type":"ADDED","object":` + string(b) + "}\n")
	}
}

// slice returns the EndpointSlice of one server at a new resource version.
// Called with a.mu held, or before the server starts.
func (a *API) slice(addr string, changed time.Time) []byte {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	a.rv++
	meta := map[string]any{"name": "memcache-" + port, "namespace": "default", "resourceVersion": strconv.Itoa(a.rv),
		"labels": map[string]string{"kubernetes.io/service-name": "memcache"}}
	if !changed.IsZero() {
		meta["annotations"] = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": changed.UTC().Format(time.RFC3339)}
	}
	b, _ := json.Marshal(map[string]any{"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "metadata": meta,
		"addressType": "IPv4",
		"endpoints":   []any{map[string]any{"addresses": []string{host}, "conditions": map[string]bool{"ready": true, "serving": true, "terminating": false}}},
		"ports":       []any{map[string]any{"name": "memcache", "port": p, "protocol": "TCP"}}})
	return b
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices" {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if q := r.URL.Query().Get("watch"); q != "1" && q != "true" {
		a.mu.Lock()
		items := []json.RawMessage{}
		for _, b := range a.slices {
			items = append(items, b)
		}
		body, _ := json.Marshal(map[string]any{"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
			"metadata": map[string]string{"resourceVersion": strconv.Itoa(a.rv)}, "items": items})
		a.mu.Unlock()
		w.Write(body)
		return
	}
	events := make(chan []byte, 16)
	a.mu.Lock()
	a.watches = append(a.watches, events)
	a.mu.Unlock()
	w.(http.Flusher).Flush()
	for {
		select {
		case b := <-events:
			w.Write(b)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			a.mu.Lock()
			a.watches = slices.DeleteFunc(a.watches, func(c chan []byte) bool { return c == events })
			a.mu.Unlock()
			return
		}
	}
}

// String names the API in test failures.
func (a *API) String() string { return fmt.Sprintf("fake API at %s", a.URL) }
