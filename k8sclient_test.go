package selector

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/discovery"
	"github.com/kubecache/k8s-memcache-selector/internal/testca"
)

// Configuration errors fail NewServerList at once, saying what is wrong.
func TestClientConfigErrors(t *testing.T) {
	f := newFakeAPI(t)
	notPEM := writeFile(t, "ca.crt", "not a certificate")
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"URL without scheme", []Option{WithAPIServer("10.0.0.1:6443")}, "bad API server URL"},
		{"URL of another scheme", []Option{WithAPIServer("ftp://10.0.0.1")}, "bad API server URL"},
		{"URL without host", []Option{WithAPIServer("https://")}, "bad API server URL"},
		{"not in a pod", []Option{WithAPIServer("")}, ErrNotInCluster.Error()},
		{"CA file missing", []Option{WithCAFile("/nonexistent/ca.crt")}, "read API server CA"},
		{"CA file without PEM", []Option{WithCAFile(notPEM)}, "holds no PEM certificate"},
		{"token file missing", []Option{WithTokenFile("/nonexistent/token")}, "read token"},
		{"token file empty", []Option{WithTokenFile(writeFile(t, "token", "\n"))}, "is empty"},
		{"HTTP client with a Timeout", []Option{WithHTTPClient(&http.Client{Timeout: time.Minute})}, "Timeout"},
		{"token over plain HTTP", []Option{WithAPIServer("http://10.0.0.1:8080")}, "would travel in plaintext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newServerList(t, f, "memcache:11211", tc.opts...)
			require.ErrorContains(t, err, tc.want)
		})
	}
	assert.Empty(t, f.requests())
}

// In a pod the URL is https://KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT,
// with brackets for IPv6.
func TestInClusterURL(t *testing.T) {
	sa := t.TempDir()
	ca, err := os.ReadFile(newFakeAPI(t).caFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"token": "t", "ca.crt": string(ca)} {
		if err := os.WriteFile(filepath.Join(sa, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for host, want := range map[string]string{"10.96.0.1": "https://10.96.0.1:443", "fd00::1": "https://[fd00::1]:443"} {
		env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
		cfg, err := options{getenv: func(k string) string { return env[k] }, saDir: sa}.clientConfig()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := discovery.NewWatch(discovery.WatchConfig{Client: cfg, Log: testLog(&recLogger{t: t})}); err != nil {
			t.Fatal(err) // the client that the configuration makes
		}
		if got := cfg.Server; got != want {
			t.Errorf("host %s: URL %s, want %s", host, got, want)
		}
		if cfg.TokenFile != sa+"/token" || cfg.CAFile != sa+"/ca.crt" {
			t.Errorf("host %s: token %q, CA %q, want the service account's", host, cfg.TokenFile, cfg.CAFile)
		}
	}
}

// The API server's CA rotates as the kubelet updates ca.crt (a symlink swap)
// and the server moves to a certificate of the new CA, breaking connections.
// The watch's next connection fails verification, which reads the CA file
// again at once rather than after the period, and the watch goes on.
func TestCARotationMidWatch(t *testing.T) {
	f, caA, rotate := newRotatingFakeAPI(t)
	k := &kubeletDir{t: t, dir: t.TempDir()}
	k.write(map[string]string{"ca.crt": string(caA)})
	f.put(v4("memcache-a", ep("10.0.0.1")))
	ss := start(t, f, WithCAFile(filepath.Join(k.dir, "ca.crt")))
	f.waitWatch(1)

	k.write(map[string]string{"ca.crt": string(rotate())})
	f.waitWatch(2).apply("MODIFIED", v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2")...)
}

// WithHTTPClient's client is used as it is, with the bearer token added.
func TestWithHTTPClient(t *testing.T) {
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	ss := start(t, f, WithHTTPClient(f.Client()), WithCAFile("/nonexistent/ca.crt"))
	checkServers(t, ss, hostports("10.0.0.1")...)
	for _, r := range f.requests() {
		if r.auth != "Bearer token-1" {
			t.Errorf("%s with Authorization %q, want the token", r.verb, r.auth)
		}
	}
}

// API server warnings, such as the Endpoints deprecation, are logged once.
func TestWarningsLoggedOnce(t *testing.T) {
	f := newFakeAPI(t)
	const warning = `299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"`
	f.set(func(f *fakeAPI) { f.warning = warning })
	f.put(legacyEndpoints(fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.1"}}, Ports: memcachePort}))
	log := &recLogger{t: t}
	start(t, f, WithLegacyEndpoints(), WithLogger(log))
	for i := 1; i <= 2; i++ {
		w := f.waitWatch(i)
		w.bookmark()
		w.close()
	}
	f.waitWatch(3)
	log.mu.Lock()
	defer log.mu.Unlock()
	n := 0
	for _, l := range log.lines {
		if strings.Contains(l, "v1 Endpoints is deprecated") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("warning logged %d times in 4 requests, want once", n)
	}
}

// A redirect is refused, as Kubernetes clients refuse them since
// CVE-2020-8559: the token is not sent where it points, in plaintext or
// not, and the servers do not come from there.
func TestRedirectRefused(t *testing.T) {
	for _, tc := range []struct {
		name       string
		code       int
		plain      bool // the redirect is to http://, on the same host
		httpClient bool // WithHTTPClient
	}{
		{"307 from https to http on the same host", http.StatusTemporaryRedirect, true, false},
		{"302 to another API server", http.StatusFound, false, false},
		{"308 with WithHTTPClient", http.StatusPermanentRedirect, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := newFakeAPI(t)
			if tc.plain {
				target = newPlainFakeAPI(t)
			}
			target.put(v4("memcache-a", ep("10.6.6.6")))
			redirector := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target.URL+r.URL.RequestURI(), tc.code)
			}))
			t.Cleanup(redirector.Close)
			opts := []Option{WithAPIServer(redirector.URL), WithCAFile(caFileOf(t, redirector))}
			user := redirector.Client()
			if tc.httpClient {
				opts = append(opts, WithHTTPClient(user))
			}

			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			ss, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, target, opts...)...)
			if ss != nil {
				ss.Close()
			}
			assert.NoError(t, ctx.Err(), "NewServerList waited for its context: a redirect is fatal")
			assert.Empty(t, target.requests(), "the redirect was followed, with the token")
			assert.Nil(t, user.CheckRedirect, "WithHTTPClient's client was changed")
			require.Error(t, err) // internal/discovery's *redirectError, which its tests check
			assert.Contains(t, err.Error(), "the API server answered with a redirect to "+target.URL+"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?")
			assert.Contains(t, err.Error(), "which is refused")
			assert.Contains(t, err.Error(), "WithAPIServer")
		})
	}
}

// A certificate that does not verify fails NewServerList at once, with the
// fix for its reason: the CA file for an unknown CA, the URL's host for a
// certificate of other hosts, the clock for an expired one.
func TestCertificateErrors(t *testing.T) {
	f := newFakeAPI(t) // a certificate for 127.0.0.1, ::1 and example.com
	_, port, err := net.SplitHostPort(f.Listener.Addr().String())
	require.NoError(t, err)
	expiredCA, expiredCert := testca.Until(t, time.Now().Add(-time.Minute))
	expired := httptest.NewUnstartedServer(http.NotFoundHandler())
	expired.TLS = &tls.Config{Certificates: []tls.Certificate{expiredCert}}
	expired.Config.ErrorLog = log.New(io.Discard, "", 0)
	expired.StartTLS()
	t.Cleanup(expired.Close)
	for _, tc := range []struct {
		name string
		opts []Option
		want []string
		not  string
	}{
		{"unknown CA", []Option{WithCAFile("")},
			[]string{"x509: certificate signed by unknown authority", "not signed by a CA this client trusts; give its CA with WithCAFile"}, "WithAPIServer"},
		{"another host", []Option{WithAPIServer("https://" + net.JoinHostPort("localhost", port))},
			[]string{"x509: certificate is valid for", "not localhost", `the API server's certificate does not name host "localhost"`, "WithAPIServer"}, "WithCAFile"},
		{"expired", []Option{WithAPIServer(expired.URL), WithCAFile(writeFile(t, "ca.crt", string(expiredCA)))},
			[]string{"x509: certificate has expired", "check this machine's clock, or renew the API server's certificate"}, "WithCAFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			_, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, tc.opts...)...)
			for _, want := range tc.want {
				assert.ErrorContains(t, err, want)
			}
			assert.NotContains(t, err.Error(), tc.not)
			assert.NoError(t, ctx.Err(), "NewServerList waited for its context")
		})
	}
}

// kubeletDir writes files as kubelet writes a projected volume: into a new
// directory, which the ..data symlink then points to, atomically; the
// visible names are symlinks through ..data.
type kubeletDir struct {
	t   *testing.T
	dir string
	n   int
}

func (k *kubeletDir) write(files map[string]string) {
	k.t.Helper()
	k.n++
	ts := filepath.Join(k.dir, fmt.Sprintf("..2026_11_30_00_00_%02d.%d", k.n, 1000+k.n))
	must := func(err error) {
		k.t.Helper()
		if err != nil {
			k.t.Fatal(err)
		}
	}
	must(os.Mkdir(ts, 0o755))
	for name, content := range files {
		must(os.WriteFile(filepath.Join(ts, name), []byte(content), 0o600))
		if _, err := os.Lstat(filepath.Join(k.dir, name)); err != nil {
			must(os.Symlink(filepath.Join("..data", name), filepath.Join(k.dir, name)))
		}
	}
	old, _ := os.Readlink(filepath.Join(k.dir, "..data"))
	must(os.Symlink(filepath.Base(ts), filepath.Join(k.dir, "..data_tmp")))
	must(os.Rename(filepath.Join(k.dir, "..data_tmp"), filepath.Join(k.dir, "..data")))
	if old != "" {
		must(os.RemoveAll(filepath.Join(k.dir, old)))
	}
}

// newRotatingFakeAPI starts a TLS fake whose certificate, signed by a CA of
// its own, can be changed (rotate) while it runs.
func newRotatingFakeAPI(t *testing.T) (f *fakeAPI, caPEM []byte, rotate func() (newCAPEM []byte)) {
	caPEM, cert := testca.New(t)
	var served atomic.Pointer[tls.Certificate]
	served.Store(&cert)
	f = newFake(t)
	f.EnableHTTP2 = true
	f.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*served.Load()}, NextProtos: []string{"h2", "http/1.1"}}, nil
	}}
	f.StartTLS()
	return f, caPEM, func() []byte {
		newCA, newCert := testca.New(t)
		served.Store(&newCert)
		f.CloseClientConnections()
		return newCA
	}
}

// caFileOf writes the certificate of the TLS server s to a CA file.
func caFileOf(t *testing.T, s *httptest.Server) string {
	return writeFile(t, "ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})))
}
