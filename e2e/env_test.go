package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// The names in examples/kubernetes.
const (
	serviceName = "memcache-headless"
	saName      = "memcache-selector"
	appLabel    = "memcache"
)

// loadManifests parses the example manifests (not copies of them).
func loadManifests(t *testing.T) *cluster.Manifests {
	t.Helper()
	m, err := cluster.LoadManifests(*manifestsDir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// extraAPIServer is an API server besides the primary, on the same etcd,
// that some tests share. It starts on first use and stops with the control
// plane.
type extraAPIServer struct {
	desc  string // its name and flags, for the log
	start func() (*cluster.APIServer, error)

	once sync.Once
	as   *cluster.APIServer
	err  error
}

func (x *extraAPIServer) get(t *testing.T) *cluster.APIServer {
	t.Helper()
	x.once.Do(func() {
		start := time.Now()
		x.as, x.err = x.start()
		t.Logf("started %s in %v", x.desc, time.Since(start).Round(time.Millisecond))
	})
	if x.err != nil {
		t.Fatal(x.err)
	}
	return x.as
}

// env is one test's namespace: the example Service and RBAC applied, a token
// of the example ServiceAccount in a file, and the pods the test runs.
// Subtests use e.sub(t), which shares all but t.
type env struct {
	t   *testing.T
	ctx context.Context
	*envState
}

type envState struct {
	ns        string
	client    kubernetes.Interface
	m         *cluster.Manifests
	tokenFile string

	mu   sync.Mutex
	pods []*cluster.Pod
}

// sub returns the env for subtest t.
func (e *env) sub(t *testing.T) *env { return &env{t: t, ctx: t.Context(), envState: e.envState} }

var nsSeq atomic.Int32

// newEnv creates a fresh namespace for t, applies the example manifests in
// it and writes a TokenRequest token of the example ServiceAccount.
func newEnv(t *testing.T) *env {
	t.Helper()
	dumpLogsOnFailure(t)
	name := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	name = strings.NewReplacer("/", "-", "_", "-").Replace(name)
	if len(name) > 40 {
		name = name[:40]
	}
	e := &env{t: t, ctx: t.Context(), envState: &envState{
		ns:     fmt.Sprintf("e2e-%d-%s", nsSeq.Add(1), strings.Trim(name, "-")),
		client: cp.Client,
		m:      loadManifests(t),
	}}
	// The app runs in the Service's namespace and learns it from
	// POD_NAMESPACE, as examples/kubernetes/app.yaml sets it.
	t.Setenv("POD_NAMESPACE", e.ns)
	e.createNamespace(e.ns)
	e.applyManifests(e.ns)
	e.tokenFile = filepath.Join(t.TempDir(), "token")
	e.writeToken(e.tokenFile, e.ns, saName, nil)
	t.Cleanup(e.cleanup)
	return e
}

// createNamespace creates ns with its default ServiceAccount.
func (e *env) createNamespace(ns string) {
	e.t.Helper()
	if err := cluster.CreateNamespace(context.Background(), e.client, ns); err != nil {
		e.t.Fatal(err)
	}
}

// applyManifests creates the example ServiceAccount, Role, RoleBinding and
// Service in ns, as they are (kubectl apply -n ns -f).
func (e *env) applyManifests(ns string) {
	e.t.Helper()
	if err := e.m.Apply(context.Background(), e.client, ns); err != nil {
		e.t.Fatal(err)
	}
}

// requestToken asks the TokenRequest API for a token of ServiceAccount
// ns/sa, optionally bound to an object (deleting that object revokes it).
func (e *env) requestToken(ns, sa string, bound *authv1.BoundObjectReference) string {
	e.t.Helper()
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(3600)),
		BoundObjectRef:    bound,
	}}
	out, err := e.client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa, tr, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("TokenRequest for %s/%s: %v", ns, sa, err)
	}
	return out.Status.Token
}

// writeToken writes a fresh token of ns/sa to path, atomically (write and
// rename, as the kubelet's projected volume does), and returns it.
func (e *env) writeToken(path, ns, sa string, bound *authv1.BoundObjectReference) string {
	e.t.Helper()
	tok := e.requestToken(ns, sa, bound)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func (e *env) cleanup() {
	e.mu.Lock()
	pods := e.pods
	e.pods = nil
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() { _ = p.ForceDelete(context.Background()) })
	}
	wg.Wait()
}

// podOpts change the pods runPods starts.
type podOpts struct {
	prefix      string
	noProcess   bool
	notReady    bool // leave Ready=False
	statefulSet bool // hostname = pod name, subdomain = the Service
	ports       []corev1.ContainerPort
	labels      map[string]string
	memoryMB    int // memcached's -m (default 16)
}

// runPods starts n pods named prefix-0..n-1 (from start), in parallel, and
// returns them in order.
func (e *env) runPods(start, n int, o podOpts) []*cluster.Pod {
	e.t.Helper()
	if o.prefix == "" {
		o.prefix = "mc"
	}
	pods := make([]*cluster.Pod, n)
	err := forEach(n, func(i int) (err error) {
		pods[i], err = e.runPod(fmt.Sprintf("%s-%d", o.prefix, start+i), o)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return pods
}

func (e *env) runPod(name string, o podOpts) (*cluster.Pod, error) {
	labels := map[string]string{"app": appLabel}
	for k, v := range o.labels {
		labels[k] = v
	}
	spec := cluster.PodSpec{
		Namespace: e.ns,
		Name:      name,
		Labels:    labels,
		Ports:     o.ports,
		NoProcess: o.noProcess,
		NotReady:  o.notReady,
		MemoryMB:  o.memoryMB,
	}
	if o.statefulSet {
		spec.Hostname, spec.Subdomain = name, serviceName
	}
	p, err := kubelet.RunPod(e.ctx, spec)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.pods = append(e.pods, p)
	e.mu.Unlock()
	return p, nil
}

// lib is a ServerList under test, with a channel that OnChange pings.
type lib struct {
	*selector.ServerList
	changed chan struct{}
	log     *testLogger
}

// libConfig says how the library reaches the API server.
type libConfig struct {
	url, caFile, tokenFile string
}

func (e *env) defaultConfig() libConfig {
	return libConfig{url: cp.APIServer.URL, caFile: cp.APIServer.CAFile, tokenFile: e.tokenFile}
}

// newLib runs selector.NewServerList for addr as the example
// ServiceAccount; Close runs when the test ends.
func (e *env) newLib(addr string, opts ...selector.Option) (*lib, error) {
	return e.newLibWith(e.defaultConfig(), addr, opts...)
}

func (e *env) newLibWith(c libConfig, addr string, opts ...selector.Option) (*lib, error) {
	l := &lib{changed: make(chan struct{}, 1), log: newTestLogger(e.t)}
	all := append([]selector.Option{
		selector.WithAPIServer(c.url),
		selector.WithCAFile(c.caFile),
		selector.WithTokenFile(c.tokenFile),
		selector.WithLogger(l.log),
		selector.WithOnChange(func([]net.Addr) {
			select {
			case l.changed <- struct{}{}:
			default:
			}
		}),
	}, opts...)
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, addr, all...)
	if err != nil {
		return nil, err
	}
	l.ServerList = ss
	e.t.Cleanup(func() { ss.Close() })
	return l, nil
}

func (e *env) mustLib(addr string, opts ...selector.Option) *lib {
	e.t.Helper()
	l, err := e.newLib(addr, opts...)
	if err != nil {
		e.t.Fatalf("NewServerList(%q): %v", addr, err)
	}
	return l
}

// servers returns l.Servers() as strings.
func (l *lib) servers() []string {
	var out []string
	for _, a := range l.Servers() {
		out = append(out, a.String())
	}
	return out
}

// waitServers waits until the ring holds exactly want (in any order) and
// returns how long that took; it fails t after timeout.
func (l *lib) waitServers(t *testing.T, want []string, timeout time.Duration) time.Duration {
	t.Helper()
	d, err := l.awaitServers(want, time.Now(), timeout)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// awaitServers waits until the ring holds exactly want and returns the time
// since start.
func (l *lib) awaitServers(want []string, start time.Time, timeout time.Duration) (time.Duration, error) {
	want = sorted(want)
	deadline := time.NewTimer(time.Until(start.Add(timeout)))
	defer deadline.Stop()
	for {
		got := l.servers()
		if slices.Equal(got, want) {
			return time.Since(start), nil
		}
		select {
		case <-l.changed:
		case <-time.After(2 * time.Millisecond):
		case <-deadline.C:
			return 0, fmt.Errorf("ring after %v: got %d servers %v, want %d %v", timeout, len(got), got, len(want), want)
		}
	}
}

// holdsFor checks that the ring stays exactly want for d.
func (l *lib) holdsFor(t *testing.T, want []string, d time.Duration) {
	t.Helper()
	want = sorted(want)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got := l.servers(); !slices.Equal(got, want) {
			t.Fatalf("ring changed to %v, want it to stay %v", got, want)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// addrs returns the pods' addresses on port.
func addrs(pods []*cluster.Pod, port int) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Addr(port)
	}
	return out
}

// newClient returns a gomemcache client with settings for a loaded 2-core box.
func newClient(ss memcache.ServerSelector) *memcache.Client {
	c := memcache.NewFromSelector(ss)
	c.Timeout = 2 * time.Second
	c.MaxIdleConns = 8
	return c
}

// testLogger forwards the library's logs to t until the test ends.
type testLogger struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
	msgs []string
}

func newTestLogger(t *testing.T) *testLogger {
	l := &testLogger{t: t}
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l *testLogger) Errorf(format string, args ...any) { l.logf("library ERROR: "+format, args...) }
func (l *testLogger) Infof(format string, args ...any)  { l.logf("library INFO: "+format, args...) }

func (l *testLogger) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg)
	if !l.done {
		l.t.Log(msg)
	}
}

// messages returns what the library logged so far.
func (l *testLogger) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs)
}
