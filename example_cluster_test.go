package selector_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/kubecache/k8s-memcache-selector/internal/testmc"
)

// The examples run against a stand-in for a Kubernetes cluster seen from
// outside it, on this machine: an API server as `kubectl proxy` serves it
// (plain HTTP, no token) with the EndpointSlices of headless Services, and,
// for the examples that store keys, one real memcached process per pod
// (/usr/bin/memcached, which `make test-deps` installs). Discovery refuses
// loopback addresses, as the EndpointSlice API does, so the pods have
// addresses of their own (10.244.S.N) and Dial takes a pod's address to
// its memcached on 127.0.0.1.

// exampleCluster is the stand-in: an API server, and the pods.
type exampleCluster struct {
	URL  string // the API server, for WithAPIServer
	srv  *httptest.Server
	quit chan struct{}
	pods []*examplePod
}

// examplePod is a StatefulSet pod: name-N, with its hostname, in a zone.
type examplePod struct {
	service, name, ip, zone string
	local                   string    // its memcached, 127.0.0.1:port ("" without one)
	cmd                     *exec.Cmd // its memcached process
}

// startProxy starts an API server with n pods in each of the Services,
// without memcached: for the examples that only discover servers. The pods
// of Service S (from 0) are at 10.244.S.1 and up, named after the Service
// (memcache-headless's memcache-0, memcache-1, ...), pod N in zone-a,
// zone-b or zone-c by N, or in the zone a Service's name ends with.
func startProxy(n int, services ...string) *exampleCluster {
	k := &exampleCluster{quit: make(chan struct{})}
	for s, svc := range services {
		prefix := strings.TrimSuffix(svc, "-headless")
		for i := range n {
			zone := []string{"zone-a", "zone-b", "zone-c"}[i%3]
			if z, ok := strings.CutPrefix(svc, "memcache-"); ok && strings.HasPrefix(z, "zone-") {
				zone = z
			}
			k.pods = append(k.pods, &examplePod{service: svc, name: fmt.Sprintf("%s-%d", prefix, i),
				ip: fmt.Sprintf("10.244.%d.%d", s, i+1), zone: zone})
		}
	}
	k.srv = httptest.NewServer(http.HandlerFunc(k.serve))
	k.URL = k.srv.URL
	return k
}

// startCluster is startProxy with a memcached for each pod.
func startCluster(n int, services ...string) *exampleCluster {
	k := startProxy(n, services...)
	bin, err := exec.LookPath("memcached")
	if err != nil {
		k.Close()
		log.Fatalf("the examples need memcached (make test-deps installs it): %v", err)
	}
	for _, p := range k.pods {
		// A port picked free may be taken before memcached binds it, by
		// another test package's process: then another is picked.
		for try := 0; ; try++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				log.Fatal(err)
			}
			p.local = l.Addr().String()
			l.Close()
			_, port, _ := net.SplitHostPort(p.local)
			p.cmd = exec.Command(bin, "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1")
			if os.Getuid() == 0 {
				p.cmd.Args = append(p.cmd.Args, "-u", "nobody")
			}
			if err := p.cmd.Start(); err != nil {
				k.Close()
				log.Fatal(err)
			}
			err = testmc.Wait(p.local, p.cmd.Process.Pid, 5*time.Second)
			if err == nil {
				break
			}
			p.cmd.Process.Kill()
			p.cmd.Wait()
			p.cmd = nil
			if !errors.Is(err, testmc.ErrPortTaken) || try == 4 {
				k.Close()
				log.Fatalf("memcached of %s: %v", p.name, err)
			}
		}
	}
	return k
}

// Close stops the API server and the pods' memcached.
func (k *exampleCluster) Close() {
	close(k.quit)
	k.srv.CloseClientConnections()
	k.srv.Close()
	for _, p := range k.pods {
		if p.cmd != nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}
}

// Dial, for WithDialContext, connects to a pod's memcached.
func (k *exampleCluster) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	for _, p := range k.pods {
		if p.ip == host && p.local != "" {
			return (&net.Dialer{}).DialContext(ctx, network, p.local)
		}
	}
	return nil, fmt.Errorf("no pod at %s", addr)
}

// Holders returns the pods whose memcached holds key, as "name (zone)".
func (k *exampleCluster) Holders(key string) []string {
	var hs []string
	for _, p := range k.pods {
		if p.local == "" {
			continue
		}
		if _, err := memcache.New(p.local).Get(key); err == nil {
			hs = append(hs, fmt.Sprintf("%s (%s)", p.name, p.zone))
		}
	}
	slices.Sort(hs)
	return hs
}

// Pod returns the name of the pod at addr (ip:port).
func (k *exampleCluster) Pod(addr net.Addr) string {
	host, _, _ := net.SplitHostPort(addr.String())
	for _, p := range k.pods {
		if p.ip == host {
			return p.name
		}
	}
	return "?"
}

// serve answers discovery, LISTs of EndpointSlices by Service (in any
// namespace), and WATCHes, which stay open and silent: the pods do not
// change.
func (k *exampleCluster) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/apis/discovery.k8s.io/v1" {
		fmt.Fprint(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"discovery.k8s.io/v1","resources":[{"name":"endpointslices","namespaced":true,"kind":"EndpointSlice","verbs":["get","list","watch"]}]}`)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/apis/discovery.k8s.io/v1/namespaces/")
	ns, res, _ := strings.Cut(rest, "/")
	svc, _ := strings.CutPrefix(r.URL.Query().Get("labelSelector"), "kubernetes.io/service-name=")
	if !ok || res != "endpointslices" || svc == "" {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		return
	}
	if q := r.URL.Query().Get("watch"); q == "1" || q == "true" {
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-k.quit:
		}
		return
	}
	type endpoint struct {
		Addresses  []string          `json:"addresses"`
		Conditions map[string]bool   `json:"conditions"`
		Hostname   string            `json:"hostname"`
		TargetRef  map[string]string `json:"targetRef"`
		Zone       string            `json:"zone"`
	}
	var eps []endpoint
	for _, p := range k.pods {
		if p.service == svc {
			eps = append(eps, endpoint{Addresses: []string{p.ip}, Hostname: p.name, Zone: p.zone,
				Conditions: map[string]bool{"ready": true, "serving": true, "terminating": false},
				TargetRef:  map[string]string{"kind": "Pod", "namespace": ns, "name": p.name}})
		}
	}
	items := []any{}
	if len(eps) > 0 {
		items = append(items, map[string]any{
			"metadata": map[string]any{"name": svc + "-abcde", "namespace": ns, "resourceVersion": "1",
				"labels": map[string]string{"kubernetes.io/service-name": svc}},
			"addressType": "IPv4",
			"endpoints":   eps,
			"ports":       []map[string]any{{"name": "memcache", "port": 11211, "protocol": "TCP"}},
		})
	}
	json.NewEncoder(w).Encode(map[string]any{"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
		"metadata": map[string]string{"resourceVersion": "1"}, "items": items})
}

// LocalAddrs returns the pods' memcached addresses on this machine, for
// SetServers.
func (k *exampleCluster) LocalAddrs() []string {
	var as []string
	for _, p := range k.pods {
		as = append(as, p.local)
	}
	return as
}
