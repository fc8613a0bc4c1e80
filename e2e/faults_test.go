package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// A second API server on the same etcd, without the watch cache, so that a
// watch from an old resourceVersion reaches etcd (and its compaction).
var noCache = &extraAPIServer{desc: "kube-apiserver-nocache --watch-cache=false", start: func() (*cluster.APIServer, error) {
	return cp.StartAPIServer(context.Background(), "kube-apiserver-nocache", 6444, "--watch-cache=false")
}}

// Scenario 9a: the API server the library watches is killed (SIGKILL) and
// restarted. Meanwhile the ring keeps its members and traffic flows; pod
// changes made while it is down (through the other API server) reach the
// ring once it is back.
func TestFaultAPIServerRestart(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{})
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)
	c := newClient(l)
	other, err := kubernetes.NewForConfig(cp.AdminConfig(noCache.get(t)))
	if err != nil {
		t.Fatal(err)
	}

	cp.APIServer.Kill()
	kubelet.SetClient(other)
	restarted := false
	defer func() {
		kubelet.SetClient(cp.Client)
		if !restarted {
			if err := cp.APIServer.Start(context.Background()); err != nil {
				t.Errorf("restart %s: %v", cp.APIServer.Name, err)
			}
			if err := cp.RestartKCM(); err != nil {
				t.Errorf("restart the controller manager: %v", err)
			}
		}
	}()
	t.Logf("killed %s", cp.APIServer.Name)
	l.holdsFor(t, addrs(pods, 11211), 2*time.Second)
	checkTraffic(t, c, "apiserver-down", 200)

	// While it is down: pod 0 turns not ready, a new pod starts.
	if err := pods[0].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	newPod, err := e.runPod("mc-3", podOpts{})
	if err != nil {
		t.Fatal(err)
	}
	l.holdsFor(t, addrs(pods, 11211), time.Second)
	t.Logf("while it was down: the ring kept its %d servers and served 200 keys without error", len(pods))

	start := time.Now()
	if err := cp.APIServer.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	kubelet.SetClient(cp.Client)
	ready := time.Since(start)
	if err := cp.RestartKCM(); err != nil {
		t.Fatal(err)
	}
	want := addrs([]*cluster.Pod{pods[1], pods[2], newPod}, 11211)
	sliceAt := make(chan time.Duration, 1)
	go func() {
		for e.ctx.Err() == nil {
			if got, err := e.readySliceAddrs(serviceName, 11211); err == nil && slices.Equal(got, sorted(want)) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		sliceAt <- time.Since(start)
	}()
	d, err := l.awaitServers(want, start, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ds := <-sliceAt
	t.Logf("%s restarted and ready in %v; the EndpointSlices (from a restarted controller manager) had the changes made while it was down %v after the restart, the ring %v after",
		cp.APIServer.Name, ready.Round(time.Millisecond), ds.Round(time.Millisecond), d.Round(time.Millisecond))
	// A restarting API server answers 403 for a moment (its RBAC caches
	// are empty), and a retry may land then: that must not stall the watch
	// for long (client-go's backoff would retry within seconds).
	if lag := d - ds; lag > 15*time.Second {
		t.Errorf("the ring lagged the EndpointSlices by %v after the API server restart; want a few seconds at most", lag.Round(time.Millisecond))
	}
	checkTraffic(t, c, "apiserver-back", 200)
}

// Scenario 9b: the watch resumes from a resourceVersion that etcd has
// compacted away. The library watches through a proxy in front of an API
// server without watch cache; the proxy cuts the stream and holds the
// reconnect while pods change and etcd compacts; released, the watch from
// the old resourceVersion gets 410 Expired, the library relists, and the
// ring has every change (no lost update).
func TestFaultCompaction(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{noProcess: true})
	proxy, err := cluster.NewProxy(noCache.get(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close) // after the library's Close
	l, err := e.newLibWith(libConfig{url: proxy.URL, caFile: proxy.CAFile, tokenFile: e.tokenFile}, serviceName+":11211")
	if err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)
	// One change through the watch, so the library holds the
	// resourceVersion of a watch event.
	if err := pods[2].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs(pods[:2], 11211), 10*time.Second)

	holdStart := time.Now()
	proxy.Hold()
	t.Logf("proxy: cut %d open requests; holding new ones", proxy.DropStreams())

	if err := pods[2].SetReady(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := pods[0].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	newPod, err := e.runPod("mc-3", podOpts{noProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	want := addrs([]*cluster.Pod{pods[1], pods[2], newPod}, 11211)
	e.waitSlices(want, 11211, 10*time.Second)
	rev, err := cp.EtcdRevision(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.EtcdCompact(e.ctx, rev); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd compacted up to revision %d; the ring still shows %v", rev, l.servers())

	proxy.Release()
	d := l.waitServers(t, want, 30*time.Second)
	t.Logf("released the proxy; the ring had every change %v later", d.Round(time.Millisecond))

	var sawExpired, relisted bool
	for _, r := range proxy.Requests() {
		if r.Time.Before(holdStart) {
			continue
		}
		t.Logf("  request after the cut: %s %s?%s -> %d expired=%v canceled=%v",
			r.Method, r.Path, r.Query.Encode(), r.Status, r.Expired, r.Canceled)
		if r.Watch() && r.Expired && r.Query.Get("resourceVersion") != "" {
			sawExpired = true
		}
		if sawExpired && !r.Watch() && r.Status == 200 {
			relisted = true
		}
	}
	if !sawExpired {
		t.Errorf("no watch from the old resourceVersion got 410 Expired; the test did not exercise compaction")
	}
	if !relisted {
		t.Errorf("no LIST after the 410")
	}
}

// Scenario 9d: the API server's CA rotates. An API server of the test's own
// (the controller manager does not use it) restarts with a new self-signed
// certificate, which is the CA file the library reads. Its next connection
// fails verification, the library reads the CA file again at once, and
// changes reach the ring as before.
func TestFaultCARotation(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{noProcess: true})
	as, err := cp.StartAPIServer(e.ctx, "kube-apiserver-rotating", 6446)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { as.Proc.Stop(10 * time.Second) })
	l, err := e.newLibWith(libConfig{url: as.URL, caFile: as.CAFile, tokenFile: e.tokenFile}, serviceName+":11211")
	if err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)

	oldCA, err := os.ReadFile(as.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := as.RestartWithNewCA(e.ctx); err != nil {
		t.Fatal(err)
	}
	newCA, err := os.ReadFile(as.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(oldCA, newCA) {
		t.Fatal("the API server kept its certificate")
	}
	t.Logf("%s restarted with a new CA in %v", as.Name, time.Since(start).Round(time.Millisecond))
	l.holdsFor(t, addrs(pods, 11211), time.Second)

	if err := pods[0].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	d := l.waitServers(t, addrs(pods[1:], 11211), 30*time.Second)
	t.Logf("a change after the CA rotation reached the ring in %v", d.Round(time.Millisecond))
	if !slices.ContainsFunc(l.log.messages(), func(m string) bool {
		return strings.Contains(m, "the API server CA changed") && strings.Contains(m, "file="+as.CAFile)
	}) {
		t.Errorf("the library did not log the new CA")
	}
}

// Scenario 9c: the token file is rotated (atomic rename, as the kubelet
// does) and the old token revoked (its bound Secret deleted). After the
// connection breaks, the library works with the new token.
func TestFaultTokenRotation(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{noProcess: true})
	proxy, err := cluster.NewProxy(cp.APIServer, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close) // after the library's Close

	bound := func(name string) *authv1.BoundObjectReference {
		s, err := e.client.CoreV1().Secrets(e.ns).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &authv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: s.Name, UID: s.UID}
	}
	oldTok := e.writeToken(e.tokenFile, e.ns, saName, bound("token-1"))
	l, err := e.newLibWith(libConfig{url: proxy.URL, caFile: proxy.CAFile, tokenFile: e.tokenFile}, serviceName+":11211")
	if err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)

	newTok := e.writeToken(e.tokenFile, e.ns, saName, bound("token-2"))
	if err := e.client.CoreV1().Secrets(e.ns).Delete(e.ctx, "token-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRevoked(t, oldTok)
	rotated := time.Now()
	t.Logf("token rotated (%s -> %s) and the old one revoked; cutting %d open requests",
		cluster.TokenFingerprint(oldTok), cluster.TokenFingerprint(newTok), proxy.DropStreams())

	if err := pods[0].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	d := l.waitServers(t, addrs(pods[1:], 11211), 30*time.Second)
	t.Logf("a change after the rotation reached the ring in %v", d.Round(time.Millisecond))
	if err := pods[0].SetReady(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)

	count := map[string]int{}
	for _, r := range proxy.Requests() {
		if r.Time.After(rotated) {
			count[fmt.Sprintf("%s/%d", r.TokenFP, r.Status)]++
		}
	}
	t.Logf("requests after the rotation, by token/status: %v", count)
	if count[cluster.TokenFingerprint(newTok)+"/200"] == 0 {
		t.Errorf("no successful request with the new token")
	}
	if n := count[cluster.TokenFingerprint(oldTok)+"/200"]; n > 0 {
		t.Errorf("%d successful requests with the revoked token", n)
	}
}

// waitRevoked waits until the API server rejects tok.
func waitRevoked(t *testing.T, tok string) {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.BearerToken = tok
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_, err := c.DiscoveryV1().EndpointSlices("default").List(t.Context(), metav1.ListOptions{})
		if apierrors.IsUnauthorized(err) {
			return
		}
	}
	t.Fatal("the old token still authenticates 30s after its Secret was deleted")
}
