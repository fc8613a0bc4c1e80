package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// APIServerIP is the address the API servers listen on and advertise. It is
// on lo in the private network namespace; run.sh adds it.
const APIServerIP = "10.244.255.254"

const (
	etcdClientPort = 2379
	etcdPeerPort   = 2380
	apiServerPort  = 6443
	adminToken     = "e2e-admin-token"
)

// Options configure a ControlPlane.
type Options struct {
	BinDir string // holds etcd, kube-apiserver, kube-controller-manager
	Dir    string // working directory: data, certificates, logs
}

// ControlPlane is etcd, one primary kube-apiserver and kube-controller-manager
// with the EndpointSlice, EndpointSliceMirroring and Endpoints controllers.
type ControlPlane struct {
	opts Options

	Etcd      *Process
	APIServer *APIServer // the primary: what the controller manager and tests use
	KCM       *Process

	// Client is an admin client of the primary API server.
	Client kubernetes.Interface
	Config *rest.Config

	saPub, saKey, tokenFile string
	extraAPIServers         []*APIServer
}

// APIServer is one kube-apiserver process; it can be killed and restarted
// with the same flags, certificate and port.
type APIServer struct {
	Name   string
	URL    string // https://10.244.255.254:PORT
	CAFile string // its self-signed serving certificate: the CA to trust
	Proc   *Process

	bin, logPath string
	args         []string
	readyz       string // the readiness URL path and query
}

// Start starts etcd, the primary API server and the controller manager, and
// waits until the API server is ready.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	cp := &ControlPlane{opts: opts}
	if err := cp.writeCredentials(); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	as, err := cp.StartAPIServer(ctx, "kube-apiserver", apiServerPort)
	if err != nil {
		return nil, err
	}
	cp.APIServer = as
	cp.Config = cp.AdminConfig(as)
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, err
	}
	if err := cp.startKCM(); err != nil {
		return nil, err
	}
	return cp, nil
}

// Stop stops every component; the reverse order of Start.
func (cp *ControlPlane) Stop() {
	if cp.KCM != nil {
		cp.KCM.Stop(10 * time.Second)
	}
	for _, as := range cp.extraAPIServers {
		as.Proc.Stop(10 * time.Second)
	}
	if cp.APIServer != nil {
		cp.APIServer.Proc.Stop(10 * time.Second)
	}
	if cp.Etcd != nil {
		cp.Etcd.Stop(10 * time.Second)
	}
}

// Logs returns the log files of the components, by name.
func (cp *ControlPlane) Logs() map[string]string {
	m := map[string]string{}
	for _, p := range []*Process{cp.Etcd, cp.KCM} {
		if p != nil {
			m[p.Name] = p.LogPath
		}
	}
	for _, as := range append([]*APIServer{cp.APIServer}, cp.extraAPIServers...) {
		if as != nil {
			m[as.Name] = as.logPath
		}
	}
	return m
}

// AdminConfig is a client configuration for as with the admin token.
func (cp *ControlPlane) AdminConfig(as *APIServer) *rest.Config {
	return &rest.Config{
		Host:            as.URL,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: as.CAFile},
		QPS:             500,
		Burst:           1000,
		Timeout:         30 * time.Second,
	}
}

func (cp *ControlPlane) path(elem ...string) string {
	return filepath.Join(append([]string{cp.opts.Dir}, elem...)...)
}

// writeCredentials writes the static token file (one admin in
// system:masters) and the service-account signing key pair.
func (cp *ControlPlane) writeCredentials() error {
	cp.tokenFile = cp.path("tokens.csv")
	if err := os.WriteFile(cp.tokenFile, []byte(adminToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	cp.saKey, cp.saPub = cp.path("sa.key"), cp.path("sa.pub")
	if err := os.WriteFile(cp.saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(cp.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func (cp *ControlPlane) etcdURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d", etcdClientPort)
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	p, err := StartProcess("etcd", cp.path("etcd.log"), filepath.Join(cp.opts.BinDir, "etcd"),
		"-data-dir", cp.path("etcd-data"),
		"-client-url", cp.etcdURL(),
		"-peer-url", fmt.Sprintf("http://127.0.0.1:%d", etcdPeerPort))
	if err != nil {
		return err
	}
	cp.Etcd = p
	return waitFor(ctx, 60*time.Second, p, func() error {
		resp, err := http.Get(cp.etcdURL() + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !bytes.Contains(b, []byte(`"health":"true"`)) {
			return fmt.Errorf("etcd /health: %s", b)
		}
		return nil
	})
}

// StartAPIServer starts a kube-apiserver on port against the shared etcd,
// with the shared token file and service-account keys (so tokens are valid
// on every instance) and its own certificate directory. extra flags are
// appended (a later flag wins). The primary is started by Start; tests start
// further instances, e.g. with --watch-cache=false; Stop stops them too.
func (cp *ControlPlane) StartAPIServer(ctx context.Context, name string, port int, extra ...string) (*APIServer, error) {
	return cp.startAPIServer(ctx, name, port, "/readyz", extra...)
}

// StartAPIServerWithoutSlices starts an API server that does not serve
// discovery.k8s.io/v1, like a cluster from before EndpointSlices. Its
// informer-sync readiness check never passes (the server's own EndpointSlice
// informers cannot sync), so readiness excludes that check.
func (cp *ControlPlane) StartAPIServerWithoutSlices(ctx context.Context, name string, port int) (*APIServer, error) {
	return cp.startAPIServer(ctx, name, port, "/readyz?exclude=informer-sync", "--runtime-config=discovery.k8s.io/v1=false")
}

func (cp *ControlPlane) startAPIServer(ctx context.Context, name string, port int, readyz string, extra ...string) (*APIServer, error) {
	certDir := cp.path(name + "-certs")
	if err := os.MkdirAll(certDir, 0o755); err != nil {
		return nil, err
	}
	as := &APIServer{
		Name:    name,
		URL:     fmt.Sprintf("https://%s:%d", APIServerIP, port),
		CAFile:  filepath.Join(certDir, "apiserver.crt"),
		bin:     filepath.Join(cp.opts.BinDir, "kube-apiserver"),
		logPath: cp.path(name + ".log"),
		readyz:  readyz,
		args: append([]string{
			"--etcd-servers=" + cp.etcdURL(),
			"--secure-port=" + strconv.Itoa(port),
			"--bind-address=" + APIServerIP,
			"--advertise-address=" + APIServerIP,
			"--endpoint-reconciler-type=none",
			"--cert-dir=" + certDir,
			"--token-auth-file=" + cp.tokenFile,
			"--authorization-mode=RBAC",
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + cp.saPub,
			"--service-account-signing-key-file=" + cp.saKey,
			"--service-cluster-ip-range=10.96.0.0/16",
			"--profiling=false",
		}, extra...),
	}
	if err := as.Start(ctx); err != nil {
		return nil, err
	}
	if port != apiServerPort {
		cp.extraAPIServers = append(cp.extraAPIServers, as)
	}
	return as, nil
}

// Start (re)starts the API server process and waits until /readyz answers.
func (as *APIServer) Start(ctx context.Context) error {
	p, err := StartProcess(as.Name, as.logPath, as.bin, as.args...)
	if err != nil {
		return err
	}
	as.Proc = p
	return waitFor(ctx, 120*time.Second, p, func() error { return as.ready() })
}

// Kill kills the API server with SIGKILL, as a crash would.
func (as *APIServer) Kill() { as.Proc.Kill() }

// RestartWithNewCA kills the API server, removes its self-signed serving
// certificate and starts it again: it makes a new one, so CAFile holds a new
// CA, as when a cluster's CA is rotated. (SIGTERM would wait out its
// graceful shutdown, which only makes the test slower.)
func (as *APIServer) RestartWithNewCA(ctx context.Context) error {
	as.Proc.Kill()
	for _, f := range []string{as.CAFile, filepath.Join(filepath.Dir(as.CAFile), "apiserver.key")} {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	return as.Start(ctx)
}

func (as *APIServer) ready() error {
	ca, err := os.ReadFile(as.CAFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %s", as.CAFile)
	}
	c := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	req, _ := http.NewRequest("GET", as.URL+as.readyz, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", as.Name, as.readyz, resp.StatusCode, b)
	}
	return nil
}

func (cp *ControlPlane) startKCM() error {
	kubeconfig := cp.path("kcm.kubeconfig")
	if err := WriteKubeconfig(kubeconfig, cp.APIServer.URL, cp.APIServer.CAFile, adminToken); err != nil {
		return err
	}
	p, err := StartProcess("kube-controller-manager", cp.path("kube-controller-manager.log"),
		filepath.Join(cp.opts.BinDir, "kube-controller-manager"),
		"--kubeconfig="+kubeconfig,
		"--controllers=endpointslice,endpointslicemirroring,endpoint",
		"--leader-elect=false",
		"--secure-port=0",
		"--kube-api-qps=200",
		"--kube-api-burst=400",
	)
	cp.KCM = p
	return err
}

// RestartKCM stops the controller manager and starts a fresh one.
//
// A test that kills the API server calls it once the server is back: while
// connections are refused, the controller manager's client-go reflectors back
// off exponentially (0.8 s doubling to 30 s, with as much again of jitter)
// and reset only after two quiet minutes, so its informers could return a
// minute late and stall the EndpointSlices of the tests that follow. The
// library is what the suite tests, not the controller manager's backoff.
func (cp *ControlPlane) RestartKCM() error {
	cp.KCM.Stop(10 * time.Second)
	return cp.startKCM()
}

// WriteKubeconfig writes a kubeconfig with one cluster, user and context.
func WriteKubeconfig(path, server, caFile, token string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: e2e
  user:
    token: %s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: e2e
current-context: e2e
`, server, caFile, token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// waitFor polls check every 100ms until it succeeds, p exits, ctx ends or
// timeout passes; the error includes the tail of p's log.
func waitFor(ctx context.Context, timeout time.Duration, p *Process, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-p.Done():
			_, err := p.Exited()
			return fmt.Errorf("%s exited (%v) before it was ready; log tail:\n%s", p.Name, err, Tail(p.LogPath, 40))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %v; log tail:\n%s", p.Name, timeout, last, Tail(p.LogPath, 40))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// EtcdRevision returns the current revision of etcd (the resourceVersion
// of the latest write), through etcd's JSON gateway.
func (cp *ControlPlane) EtcdRevision(ctx context.Context) (int64, error) {
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	key := base64.StdEncoding.EncodeToString([]byte("/registry/health-probe"))
	if err := cp.etcdPost(ctx, "/v3/kv/range", map[string]any{"key": key}, &out); err != nil {
		return 0, err
	}
	return strconv.ParseInt(out.Header.Revision, 10, 64)
}

// EtcdCompact compacts etcd's history up to revision rev (physically), so
// watches from older resourceVersions fail with "compacted".
func (cp *ControlPlane) EtcdCompact(ctx context.Context, rev int64) error {
	return cp.etcdPost(ctx, "/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
}

func (cp *ControlPlane) etcdPost(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", cp.etcdURL()+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %d %s", path, resp.StatusCode, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// CheckNetwork verifies that the process runs in the private network
// namespace run.sh sets up: the API server address is local. It refuses to
// run anywhere else, so the suite never touches a real network.
func CheckNetwork() error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == APIServerIP {
			return nil
		}
	}
	return errors.New("e2e: " + APIServerIP + " is not a local address: run the suite through e2e/run.sh (make e2e), " +
		"which starts it in a private network namespace (unshare -n) with the pod addresses on lo")
}
