package e2e

import (
	"context"
	"testing"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// An API server on the same etcd that does not serve discovery.k8s.io/v1,
// like clusters older than EndpointSlices.
var noSlices = &extraAPIServer{desc: "kube-apiserver-noslices --runtime-config=discovery.k8s.io/v1=false", start: func() (*cluster.APIServer, error) {
	return cp.StartAPIServerWithoutSlices(context.Background(), "kube-apiserver-noslices", 6445)
}}

// Scenario 10: the legacy core/v1 Endpoints path. Forced with
// WithLegacyEndpoints against the same API server, and chosen automatically
// against an API server that does not serve EndpointSlices; each follows
// pods turning not ready, new pods and graceful deletes, and carries traffic.
func TestLegacyEndpoints(t *testing.T) {
	tests := []struct {
		name string
		conf func(e *env) libConfig
		opts []selector.Option
	}{
		{"WithLegacyEndpoints", (*env).defaultConfig, []selector.Option{selector.WithLegacyEndpoints()}},
		{"automatic fallback", func(e *env) libConfig {
			as := noSlices.get(e.t)
			return libConfig{url: as.URL, caFile: as.CAFile, tokenFile: e.tokenFile}
		}, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			prefix := []string{"legacy", "fallback"}[i]
			pods := e.runPods(0, 3, podOpts{prefix: prefix})
			l, err := e.newLibWith(tt.conf(e), serviceName+":11211", tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			l.waitServers(t, addrs(pods, 11211), 10*time.Second)
			c := newClient(l)
			checkTraffic(t, c, prefix, 100)

			if err := pods[0].SetReady(e.ctx, false); err != nil {
				t.Fatal(err)
			}
			d1 := l.waitServers(t, addrs(pods[1:], 11211), 10*time.Second)
			more := e.runPods(3, 1, podOpts{prefix: prefix})
			d2 := l.waitServers(t, addrs(append(pods[1:], more...), 11211), 10*time.Second)
			if err := pods[1].Delete(e.ctx); err != nil {
				t.Fatal(err)
			}
			d3 := l.waitServers(t, addrs(append(pods[2:], more...), 11211), 10*time.Second)
			checkTraffic(t, c, prefix+"-after", 100)
			t.Logf("not ready -> ring in %v; new pod -> %v; graceful delete -> %v",
				d1.Round(time.Millisecond), d2.Round(time.Millisecond), d3.Round(time.Millisecond))
		})
	}
}
