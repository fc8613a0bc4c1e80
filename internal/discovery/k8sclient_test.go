package discovery

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/testca"
)

// fakeClientConfig configures a client for f, as NewServerList would.
func fakeClientConfig(t *testing.T, f *fakeAPI, tokenFile string) clientConfig {
	return clientConfig{server: f.URL, caFile: f.caFile, tokenFile: tokenFile, log: testLog(&recLogger{t: t})}
}

// listSlices lists the memcache slices through c.
func listSlices(t *testing.T, c *client) {
	t.Helper()
	var l objectList
	q := url.Values{"labelSelector": {"kubernetes.io/service-name=memcache"}}
	if err := c.list(context.Background(), "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", q, request{verb: "list"}, &l); err != nil {
		t.Fatal(err)
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

// A rotated service account token is read again once the cached one is
// tokenReadPeriod old: kubelet swaps a symlink, so the client must re-read
// by time, through the link.
func TestTokenRotationBySymlinkSwap(t *testing.T) {
	f := newFakeAPI(t)
	k := &kubeletDir{t: t, dir: t.TempDir()}
	k.write(map[string]string{"token": "token-1\n"})
	c, err := newClient(fakeClientConfig(t, f, filepath.Join(k.dir, "token")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()

	listSlices(t, c)
	k.write(map[string]string{"token": "token-2\n"})
	listSlices(t, c) // within the period: the cached token
	c.token.mu.Lock()
	c.token.readAt = c.token.readAt.Add(-tokenReadPeriod) // the period passes
	c.token.mu.Unlock()
	listSlices(t, c)

	// A read that fails keeps the last good token.
	if err := os.RemoveAll(filepath.Join(k.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	c.token.expire()
	listSlices(t, c)

	var got []string
	for _, r := range f.requests() {
		got = append(got, r.auth)
	}
	want := []string{"Bearer token-1", "Bearer token-1", "Bearer token-2", "Bearer token-2"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("tokens sent %q, want %q", got, want)
	}
	if tokenReadPeriod != time.Minute {
		t.Errorf("tokenReadPeriod = %v, want client-go's minute", tokenReadPeriod)
	}
}

func TestTokenFile(t *testing.T) {
	for _, tc := range []struct {
		name, content string // content "-" is no file
		want, wantErr string
	}{
		{"trimmed", " token-1\n\n", "token-1", ""},
		{"empty", " \n", "", "is empty"},
		{"missing", "-", "", "read token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if tc.content != "-" {
				if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			tok, err := (&tokenFile{path: path}).get()
			if tok != tc.want || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("get() = %q, %v; want %q, an error saying %q", tok, err, tc.want, tc.wantErr)
			}
		})
	}
}

// The transport is client-go's: HTTP/2 with pings even with a custom CA,
// TLS 1.2 or later, handshake timeout, no overall timeout. Each client has
// its own.
func TestHTTPClientSettings(t *testing.T) {
	f := newFakeAPI(t)
	c1, err1 := newClient(fakeClientConfig(t, f, ""))
	c2, err2 := newClient(fakeClientConfig(t, f, ""))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if c1.ca == nil || c1.http.Transport != c1.ca {
		t.Fatalf("transport %T, want the CA file's *caTransport", c1.http.Transport)
	}
	checkTransport(t, c1.ca.transport())
	if c1.http.Transport == c2.http.Transport || c1.ca.transport() == c2.ca.transport() {
		t.Error("two clients share a transport")
	}
	if c1.http.Timeout != 0 {
		t.Errorf("client Timeout %v would cut watches", c1.http.Timeout)
	}
}

// checkTransport checks tr has client-go's settings.
func checkTransport(t *testing.T, tr *http.Transport) {
	t.Helper()
	switch {
	case !tr.ForceAttemptHTTP2:
		t.Error("HTTP/2 not forced: a custom TLS config turns it off")
	case tr.HTTP2 == nil || tr.HTTP2.SendPingTimeout != 30*time.Second || tr.HTTP2.PingTimeout != 15*time.Second:
		t.Errorf("HTTP/2 config %+v, want pings after 30s idle, 15s timeout", tr.HTTP2)
	case tr.TLSHandshakeTimeout != 10*time.Second || tr.MaxIdleConnsPerHost != 25 || tr.Proxy == nil || tr.DialContext == nil:
		t.Errorf("transport %+v, want client-go's timeouts", tr)
	case tr.TLSClientConfig.MinVersion != tls.VersionTLS12 || tr.TLSClientConfig.RootCAs == nil:
		t.Errorf("TLS config %+v, want TLS 1.2 and the CA file", tr.TLSClientConfig)
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

// The CA file is read again every caReadPeriod, and a changed CA moves new
// requests to a transport that trusts it, with the same settings. A file
// that cannot be read or parsed keeps the last good CA.
func TestCAFileRotation(t *testing.T) {
	f, caA, rotate := newRotatingFakeAPI(t)
	k := &kubeletDir{t: t, dir: t.TempDir()}
	k.write(map[string]string{"ca.crt": string(caA)})
	o := fakeClientConfig(t, f, "")
	o.caFile = filepath.Join(k.dir, "ca.crt")
	log := &recLogger{t: t}
	o.log = testLog(log)
	c, err := newClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	listSlices(t, c)
	first := c.ca.transport()
	age := func() { // the period passes
		c.ca.mu.Lock()
		c.ca.readAt = c.ca.readAt.Add(-caReadPeriod)
		c.ca.mu.Unlock()
	}

	for _, bad := range []string{"not a certificate", ""} {
		k.write(map[string]string{"ca.crt": bad})
		age()
		if c.ca.transport() != first {
			t.Fatalf("CA file %q replaced the transport", bad)
		}
	}
	if !log.has("keeping the API server CA") {
		t.Error("a bad CA file was not logged")
	}
	listSlices(t, c)

	caB := rotate()
	k.write(map[string]string{"ca.crt": string(caB)})
	if c.ca.transport() != first {
		t.Fatal("the CA file was read again within the period")
	}
	age()
	second := c.ca.transport()
	if second == first {
		t.Fatal("a new CA after the period did not replace the transport")
	}
	checkTransport(t, second)
	if !log.has("the API server CA changed; new connections trust it") || !log.has("file="+o.caFile) {
		t.Error("the CA change was not logged")
	}
	listSlices(t, c)
	if caReadPeriod != 5*time.Minute {
		t.Errorf("caReadPeriod = %v, want client-go's 5 minutes", caReadPeriod)
	}
}

// A stream that ends, even mid-event, is a clean close; malformed JSON is an
// error.
func TestWatchStreamNext(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		wantErr    bool // else io.EOF
	}{
		{"end", `{"type":"ADDED","object":{}}` + "\n", false},
		{"cut mid-event", `{"type":"ADDED","object":{}}` + "\n" + `{"type":"MODI`, false},
		{"malformed", `{"type":"ADDED","object":{}}` + "\n" + `{"type": ADDED}`, true},
		{"wrong type", `{"type":"ADDED","object":{}}` + "\n" + `{"type": 7}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := io.NopCloser(strings.NewReader(tc.body))
			s := newWatchStream(body)
			if ev, err := s.next(); err != nil || ev.Type != "ADDED" {
				t.Fatalf("first event %+v, %v", ev, err)
			}
			_, err := s.next()
			if tc.wantErr == errors.Is(err, io.EOF) || err == nil {
				t.Errorf("next() = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}

// caFileOf writes the certificate of the TLS server s to a CA file.
func caFileOf(t *testing.T, s *httptest.Server) string {
	return writeFile(t, "ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})))
}

// A token goes over plain HTTP only to a loopback host, as to kubectl
// proxy; elsewhere it would travel in plaintext.
func TestTokenOverPlainHTTP(t *testing.T) {
	token := writeFile(t, "token", "token-1\n")
	for _, tc := range []struct {
		name, server, tokenFile string
		refused                 bool
	}{
		{"http to a remote host", "http://10.0.0.1:8080", token, true},
		{"http to a name", "http://kubernetes.default.svc", token, true},
		{"http to a host named like localhost", "http://localhost.example.com:8001", token, true},
		{"http to 127.0.0.1", "http://127.0.0.1:8001", token, false},
		{"http to 127.1.2.3", "http://127.1.2.3:8001", token, false},
		{"http to ::1", "http://[::1]:8001", token, false},
		{"http to localhost", "http://LocalHost:8001", token, false},
		{"http without a token", "http://10.0.0.1:8080", "", false},
		{"https", "https://10.0.0.1:6443", token, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := newClient(clientConfig{server: tc.server, tokenFile: tc.tokenFile, log: testLog(&recLogger{t: t})})
			if !tc.refused {
				require.NoError(t, err)
				c.close()
				return
			}
			require.Error(t, err)
			for _, want := range []string{"plain HTTP", "would travel in plaintext", "https://", "kubectl proxy on a loopback address", "without WithTokenFile"} {
				assert.Contains(t, err.Error(), want)
			}
			assert.NotContains(t, err.Error(), "token-1")
		})
	}
}

// allocated returns the bytes f allocates, from the heap's statistics (so
// with those of any goroutine running meanwhile).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// gzipped returns prefix and then mib MiB of fill, repeated, gzipped as
// gzip members that inflate to about 1,000 times their size.
func gzipped(t *testing.T, prefix, fill string, mib int) []byte {
	t.Helper()
	member := func(s string) []byte {
		var b bytes.Buffer
		zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
		require.NoError(t, err)
		_, err = io.WriteString(zw, s)
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		return b.Bytes()
	}
	chunk := member(strings.Repeat(fill, (1<<20)/len(fill)))
	return append(member(prefix), bytes.Repeat(chunk, mib)...)
}

// serveBody starts a TLS server with HTTP/2 that answers every request with
// 200 and the body write writes, and returns a client for it.
func serveBody(t *testing.T, write func(w http.ResponseWriter, r *http.Request)) *client {
	s := httptest.NewUnstartedServer(http.HandlerFunc(write))
	s.EnableHTTP2 = true
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.StartTLS()
	t.Cleanup(s.Close)
	c, err := newClient(clientConfig{server: s.URL, caFile: caFileOf(t, s), log: testLog(&recLogger{t: t})})
	require.NoError(t, err)
	t.Cleanup(c.close)
	return c
}

// writeGzip writes body with Content-Encoding gzip, as a server does when
// the client accepts it (as net/http's transport says it does).
func writeGzip(w http.ResponseWriter, r *http.Request, body []byte) {
	if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		http.Error(w, "the client does not accept gzip", http.StatusNotAcceptable)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Write(body)
}

// A watch event over maxEventBytes fails the stream, saying so, having
// held about that much; and gzip is bounded by the inflated size: 256 KiB
// of gzip that inflate to 256 MiB are not inflated past the bound.
func TestWatchEventBound(t *testing.T) {
	const prefix = `{"type":"ADDED","object":{"metadata":{"name":"`
	bomb := gzipped(t, prefix, "a", 256)
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter, r *http.Request)
	}{
		{"endless, without a newline", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, prefix)
			chunk := strings.Repeat("a", 64<<10)
			for r.Context().Err() == nil {
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
		}},
		{"gzip inflating to 256 MiB", func(w http.ResponseWriter, r *http.Request) { writeGzip(w, r, bomb) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serveBody(t, tc.write)
			var err error
			n := allocated(func() {
				var s *watchStream
				s, err = c.watch(context.Background(), "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", url.Values{}, request{verb: "watch"})
				require.NoError(t, err)
				defer s.close()
				_, err = s.next()
			})
			require.ErrorIs(t, err, errTooLarge)
			assert.ErrorContains(t, err, "a watch event is over 8 MiB, too large for a Kubernetes object")
			assert.Less(t, n, uint64(8*maxEventBytes), "bytes allocated")
		})
	}
}

// A LIST over maxListBytes fails, saying so, having held about that much.
// gzip is bounded by the inflated size: 256 KiB of gzip that inflate to
// 256 MiB are not inflated past the bound. A list that says in its
// Content-Length that it is over the bound is not read.
func TestListBound(t *testing.T) {
	const prefix = `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[`
	bomb := gzipped(t, prefix, `"`+strings.Repeat("a", 1<<19-4)+`",`, 256) // items of half a MiB
	for _, tc := range []struct {
		name     string
		write    func(w http.ResponseWriter, r *http.Request)
		maxAlloc uint64
	}{
		{"gzip inflating to 256 MiB", func(w http.ResponseWriter, r *http.Request) { writeGzip(w, r, bomb) }, 2 * maxListBytes},
		{"Content-Length over the bound", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(maxListBytes+1))
			io.WriteString(w, prefix)
		}, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serveBody(t, tc.write)
			var err error
			n := allocated(func() {
				err = c.list(context.Background(), "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", nil, request{verb: "list", resource: "endpointslices.discovery.k8s.io"}, &objectList{})
			})
			require.ErrorIs(t, err, errTooLarge)
			assert.ErrorContains(t, err, "the endpointslices.discovery.k8s.io list is over 64 MiB, too large for the list of one Service")
			assert.Less(t, n, tc.maxAlloc, "bytes allocated")
		})
	}
}

func TestDecodeList(t *testing.T) {
	big := `"` + strings.Repeat("a", 3<<20) + `"` // 3 MiB: three are over maxEventBytes
	for _, tc := range []struct {
		name, body string
		want       objectList
		wantErr    string // "" for none
	}{
		{"a list", `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{"resourceVersion":"7","continue":""},"items":[{"a":1}, {"b":[2]}]}`,
			objectList{Kind: "EndpointSliceList", Metadata: listMeta{ResourceVersion: "7"}, Items: []json.RawMessage{[]byte(`{"a":1}`), []byte(`{"b":[2]}`)}}, ""},
		{"items null", `{"kind":"EndpointsList","items":null,"metadata":{"resourceVersion":"8"}}`,
			objectList{Kind: "EndpointsList", Metadata: listMeta{ResourceVersion: "8"}}, ""},
		{"no items", `{"kind":"Status","code":404}`, objectList{Kind: "Status"}, ""},
		{"items given twice", `{"items":[1,2],"items":[3]}`, objectList{Items: []json.RawMessage{[]byte(`3`)}}, ""},
		{"values over maxEventBytes together, each under it", `{"kind":"EndpointSliceList","x":` + big + `,"items":[` + big + `,` + big + `]}`,
			objectList{Kind: "EndpointSliceList", Items: []json.RawMessage{[]byte(big), []byte(big)}}, ""},
		{"maxListItems items", `{"items":[0` + strings.Repeat(",0", maxListItems-1) + `]}`,
			objectList{Items: slices.Repeat([]json.RawMessage{[]byte(`0`)}, maxListItems)}, ""},
		{"more than maxListItems items", `{"items":[0` + strings.Repeat(",0", maxListItems) + `]}`, objectList{},
			"the list has over 100000 items, too large for the list of one Service"},
		{"an item over maxEventBytes", `{"items":["` + strings.Repeat("a", maxEventBytes) + `"]}`, objectList{},
			"a value in the list is over 8 MiB, too large for a Kubernetes object"},
		{"an array", `[]`, objectList{}, "found [ where the list has {"},
		{"items not an array", `{"items":{}}`, objectList{}, "found { where the list has its items array"},
		{"a kind not a string", `{"kind":7}`, objectList{}, "cannot unmarshal number"},
		{"cut short", `{"kind":"EndpointSliceList","items":[{}`, objectList{}, "EOF"},
		{"an error page", `<html>`, objectList{}, "invalid character '<'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var l objectList
			err := decodeList(strings.NewReader(tc.body), &l)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want.Kind, l.Kind)
			assert.Equal(t, tc.want.Metadata, l.Metadata)
			require.Len(t, l.Items, len(tc.want.Items))
			for i := range l.Items {
				assert.Equal(t, string(tc.want.Items[i]), string(l.Items[i]), "item %d", i)
			}
		})
	}
}

// A list of tiny items stops at maxListItems: decoded whole, the 8 MiB of
// this one would take 650 MiB.
func TestDecodeListTinyItems(t *testing.T) {
	body := `{"items":[0` + strings.Repeat(",0", 4<<20) + `]}`
	var err error
	n := allocated(func() { err = decodeList(strings.NewReader(body), &objectList{}) })
	require.ErrorIs(t, err, errTooLarge)
	assert.Less(t, n, uint64(64<<20), "bytes allocated")
}

// After a large event, the decoder holds megabytes of the events that
// follow; telling whether the next one has arrived does not copy them.
func TestWatchStreamBurstAfterLargeEvent(t *testing.T) {
	small := `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}` + "\n"
	body := `{"type":"ADDED","object":{"data":"` + strings.Repeat("a", 1<<20) + `"}}` + "\n" + strings.Repeat(small, 5000)
	s := newWatchStream(io.NopCloser(strings.NewReader(body)))
	ev, err := s.next()
	require.NoError(t, err)
	require.Equal(t, "ADDED", ev.Type)
	events := 0
	n := allocated(func() {
		for {
			if _, err := s.next(); err != nil {
				require.ErrorIs(t, err, io.EOF)
				return
			}
			events++
			s.more()
		}
	})
	assert.Equal(t, 5000, events)
	assert.Less(t, n, uint64(16<<20), "bytes allocated for 330 KiB of events")
}

// hangingDialer is a dialer whose dials hang, as to an address that never
// answers, until their context ends.
func hangingDialer() (d *net.Dialer, started, ended chan struct{}) {
	started, ended = make(chan struct{}, 100), make(chan struct{}, 100)
	return &net.Dialer{ControlContext: func(ctx context.Context, _, _ string, _ syscall.RawConn) error {
		started <- struct{}{}
		defer func() { ended <- struct{}{} }()
		<-ctx.Done()
		return ctx.Err()
	}}, started, ended
}

// A dial still hanging when the client closes ends then. net/http dials on
// a context detached from the request, so cancelling the request (as
// Close does to the watch's) leaves the dial, with its goroutine and
// socket, for up to dialTimeout.
func TestCloseEndsDials(t *testing.T) {
	before := goroutines()
	d, started, ended := hangingDialer()
	cs := newConns()
	base, err := url.Parse("https://127.0.0.1:1")
	require.NoError(t, err)
	c := &client{base: base, http: &http.Client{Transport: &http.Transport{DialContext: cs.dial(d)}}, conns: cs}

	ctx, cancel := context.WithCancel(context.Background())
	listed := make(chan error, 1)
	go func() {
		listed <- c.list(ctx, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", nil, request{verb: "list"}, &objectList{})
	}()
	<-started
	cancel()
	require.ErrorIs(t, <-listed, context.Canceled)
	select {
	case <-ended:
		t.Fatal("cancelling the request ended the dial: this test no longer tests anything")
	case <-time.After(50 * time.Millisecond):
	}

	begin := time.Now()
	c.close()
	select {
	case <-ended:
	case <-time.After(waitFor):
		t.Fatal("the dial is still in progress after close")
	}
	assert.Less(t, time.Since(begin), time.Second)
	eventually(t, "the dial's goroutine to end", func() bool {
		for id, g := range goroutines() {
			if _, ok := before[id]; !ok && strings.Contains(g, "dialConnFor") {
				return false
			}
		}
		return true
	})
	checkNoLeaks(t, before)

	// A dial after close fails at once.
	_, err = cs.dial(d)(context.Background(), "tcp", "127.0.0.1:1")
	require.ErrorIs(t, err, net.ErrClosed)
	assert.Empty(t, started)
}

// A client remembers at most maxWarnings distinct warnings; past that, it
// logs a new one at most once per errorPeriod, saying how many it held
// back. A warning is cut to maxErrorMessage bytes.
func TestWarningsBounded(t *testing.T) {
	rec := &recLogger{t: t}
	log := testLog(rec)
	var ws warnings
	for i := range 1000 {
		ws.log(log, []string{fmt.Sprintf(`299 - "warning %d"`, i), `299 - "warning 0"`})
	}
	assert.Equal(t, maxWarnings, len(ws.seen), "warnings remembered")
	require.Equal(t, maxWarnings+1, len(rec.lines), "lines logged") // and warning 64, the first past the bound
	assert.Contains(t, rec.lines[maxWarnings], `warning 64"`)

	ws.log(log, []string{`299 - "warning 5"`}) // remembered
	ws.last = ws.last.Add(-errorPeriod)
	ws.log(log, []string{`299 - "warning 1000"`, `299 - "warning 1001"`})
	require.Equal(t, maxWarnings+2, len(rec.lines), "lines logged")
	assert.Contains(t, rec.lines[maxWarnings+1], `warning 1000" suppressed=935`)

	ws = warnings{}
	ws.log(log, []string{strings.Repeat("w", 1<<20)})
	require.Len(t, ws.seen, 1)
	for w := range ws.seen {
		assert.Equal(t, strings.Repeat("w", maxErrorMessage)+"... (1047552 more bytes)", w)
	}
}
