package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Proxy is an HTTPS reverse proxy on 127.0.0.1 in front of an API server. A
// library under test talks to it instead of the API server, so a test can
// see every request (with a fingerprint of its bearer token, its status and
// whether the watch stream carried a 410 Expired), cut every open stream as a
// network failure would, and hold new requests for a while.
type Proxy struct {
	URL    string // https://127.0.0.1:PORT
	CAFile string // the proxy's certificate, to trust

	srv *httptest.Server
	rp  *httputil.ReverseProxy

	mu       sync.Mutex
	held     chan struct{} // non-nil while holding; closed on Release
	inflight map[int]context.CancelFunc
	reqs     []*ProxyRequest
}

// ProxyRequest is one request that went through the Proxy.
type ProxyRequest struct {
	Time     time.Time
	Method   string
	Path     string
	Query    url.Values
	TokenFP  string // TokenFingerprint of the bearer token ("" if none)
	Status   int    // 0 until the response headers arrive
	Expired  bool   // the response body carried a 410 (an in-stream ERROR event)
	Canceled bool   // cut by DropStreams
}

// Watch reports whether the request is a watch.
func (r ProxyRequest) Watch() bool {
	return r.Query.Get("watch") == "true" || r.Query.Get("watch") == "1"
}

// TokenFingerprint is a short, printable digest of a bearer token.
func TokenFingerprint(token string) string {
	token = strings.TrimSpace(token)
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:4])
}

// NewProxy starts a proxy to target; dir receives the proxy's CA file.
func NewProxy(target *APIServer, dir string) (*Proxy, error) {
	u, err := url.Parse(target.URL)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(target.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	p := &Proxy{inflight: map[int]context.CancelFunc{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2: true,
		},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ModifyResponse: func(resp *http.Response) error {
			rec := resp.Request.Context().Value(recKey{}).(*ProxyRequest)
			p.mu.Lock()
			rec.Status = resp.StatusCode
			p.mu.Unlock()
			resp.Body = &sniffer{ReadCloser: resp.Body, onMatch: func() {
				p.mu.Lock()
				rec.Expired = true
				p.mu.Unlock()
			}}
			return nil
		},
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	p.URL = p.srv.URL
	p.CAFile = filepath.Join(dir, "proxy-ca.crt")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	if err := os.WriteFile(p.CAFile, certPEM, 0o644); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

type recKey struct{}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	rec := &ProxyRequest{
		Time:    time.Now(),
		Method:  r.Method,
		Path:    r.URL.Path,
		Query:   r.URL.Query(),
		TokenFP: TokenFingerprint(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")),
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), recKey{}, rec))
	defer cancel()
	p.mu.Lock()
	id := len(p.reqs)
	p.reqs = append(p.reqs, rec)
	p.inflight[id] = func() {
		rec.Canceled = true
		cancel()
	}
	held := p.held
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.inflight, id)
		p.mu.Unlock()
	}()

	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return
		}
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// Hold makes new requests wait until Release.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release lets held and new requests through.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// DropStreams cuts every request in flight (watch streams included) the way
// a broken connection would. It returns how many it cut.
func (p *Proxy) DropStreams() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.inflight)
	for id, cancel := range p.inflight {
		cancel()
		delete(p.inflight, id)
	}
	return n
}

// Requests returns a copy of the requests seen so far, in arrival order.
func (p *Proxy) Requests() []ProxyRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ProxyRequest, len(p.reqs))
	for i, r := range p.reqs {
		out[i] = *r
	}
	return out
}

// Close stops the proxy and cuts its connections.
func (p *Proxy) Close() {
	p.Release()
	p.srv.CloseClientConnections()
	p.srv.Close()
}

// sniffer passes a response body through and calls onMatch once if it
// contains an HTTP 410 status (the ERROR event of an expired watch).
type sniffer struct {
	io.ReadCloser
	onMatch func()
	tail    []byte
	matched bool
}

var code410 = []byte(`"code":410`)

func (s *sniffer) Read(b []byte) (int, error) {
	n, err := s.ReadCloser.Read(b)
	if n > 0 && !s.matched {
		buf := append(s.tail, b[:n]...)
		if bytes.Contains(buf, code410) {
			s.matched = true
			s.onMatch()
		}
		if len(buf) > len(code410) {
			buf = buf[len(buf)-len(code410):]
		}
		s.tail = append(s.tail[:0], buf...)
	}
	return n, err
}
