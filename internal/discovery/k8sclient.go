package discovery

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// This file is a tiny Kubernetes REST client: just enough to LIST and WATCH
// one kind of object with client-go's transport settings, without client-go.

// Timeouts and periods from client-go (rest/transport defaults,
// transport/token_source.go, util/net/http.go).
const (
	dialTimeout     = 30 * time.Second
	tlsTimeout      = 10 * time.Second
	pingAfterIdle   = 30 * time.Second // HTTP/2 ping after this long without frames
	pingTimeout     = 15 * time.Second // and drop the connection if unanswered
	listTimeout     = 60 * time.Second
	tokenReadPeriod = time.Minute
	caReadPeriod    = 5 * time.Minute // transport/ca_rotation.go
	userAgent       = "k8s-memcache-selector (+https://github.com/kubecache/k8s-memcache-selector)"
)

// client talks to one API server. It is safe for concurrent use.
type client struct {
	base  *url.URL
	http  *http.Client
	token *tokenFile   // nil: send no token
	ca    *caTransport // our own transport, when the CA is from a file
	conns *conns       // the connections of our own transport; nil with WithHTTPClient

	log    *slog.Logger
	warned warnings
}

// ClientConfig is the API server and its credentials, as the root
// resolves them from its options or the pod's environment.
type ClientConfig struct {
	Server     string // the URL: https://host:port, or http:// to kubectl proxy on loopback
	TokenFile  string // "": send no token
	CAFile     string // "": the system roots
	HTTPClient *http.Client
}

// clientConfig is ClientConfig, with the log.
type clientConfig struct {
	server     string // the URL
	tokenFile  string // "": send no token
	caFile     string // "": the system roots
	httpClient *http.Client
	log        *slog.Logger
}

func newClient(cfg clientConfig) (*client, error) {
	base, err := url.Parse(cfg.server)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("bad API server URL %q: want https://host:port, or http://host:port for kubectl proxy", cfg.server)
	}
	if cfg.httpClient != nil && cfg.httpClient.Timeout != 0 {
		return nil, fmt.Errorf("WithHTTPClient: the client's Timeout (%v) would cut every watch short; set it to zero (each request has its own deadline)", cfg.httpClient.Timeout)
	}
	if base.Scheme == "http" && cfg.tokenFile != "" && !loopback(base.Hostname()) {
		return nil, fmt.Errorf("the API server URL %s is plain HTTP, over which the bearer token from %s would travel in plaintext: use an https:// URL, or kubectl proxy on a loopback address (http://127.0.0.1:8001) without WithTokenFile", base.Redacted(), cfg.tokenFile)
	}
	c := &client{base: base, http: cfg.httpClient, log: cfg.log}
	if cfg.tokenFile != "" {
		c.token = &tokenFile{path: cfg.tokenFile}
		if _, err := c.token.get(); err != nil {
			return nil, err
		}
	}
	if c.http == nil {
		c.conns = newConns()
		c.http, c.ca, err = newHTTPClient(cfg.caFile, c.conns, cfg.log)
		if err != nil {
			return nil, err
		}
	} else {
		hc := *c.http // a copy, so that the caller's client is left as it was
		c.http = &hc
	}
	c.http.CheckRedirect = refuseRedirect
	return c, nil
}

// redirectError is a redirect the API server answered with. The client
// follows none, as Kubernetes clients have not since CVE-2020-8559:
// following one would send the bearer token where it points, perhaps in
// plaintext, and take the servers from whatever answers there.
type redirectError struct {
	location string
}

func (e *redirectError) Error() string {
	return fmt.Sprintf("the API server answered with a redirect to %s, which is refused, since following it would send the token there: check that the API server URL (WithAPIServer) is the API server's own, not one that redirects", e.location)
}

// refuseRedirect is the client's CheckRedirect.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return &redirectError{location: req.URL.Redacted()}
}

// loopback reports whether host, from a URL, is "localhost" or a loopback
// address (127.0.0.0/8, ::1): the one place a token may go over plain HTTP,
// for kubectl proxy, which adds credentials itself and needs none.
func loopback(host string) bool {
	ip := net.ParseIP(host)
	return strings.EqualFold(host, "localhost") || ip != nil && ip.IsLoopback()
}

// close ends the connections of the client's own transport, once the watch
// has stopped.
func (c *client) close() {
	if c.conns != nil {
		c.conns.closeAll()
	}
}

// get sends a GET for path and query and returns the response if its status
// is 200. Otherwise it returns an *APIError decoded from the body. After a
// 401 it re-reads the token and tries once more.
func (c *client) get(ctx context.Context, path string, q url.Values, r request) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", userAgent)
		if c.token != nil {
			tok, err := c.token.get()
			if err != nil {
				return nil, err
			}
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := c.http.Do(req)
		var unverified *tls.CertificateVerificationError
		var unknownCA x509.UnknownAuthorityError
		if err != nil && c.ca != nil && errors.As(err, &unknownCA) && try == 0 {
			c.ca.expire() // the API server's CA may have rotated: read it again
			continue
		}
		if err != nil && errors.As(err, &unverified) {
			return nil, certError(err, unverified)
		}
		if err != nil {
			return nil, err
		}
		c.warned.log(c.log, resp.Header.Values("Warning"))
		if resp.StatusCode == http.StatusOK {
			return resp, nil
		}
		e := readError(resp, r)
		if resp.StatusCode == http.StatusUnauthorized && c.token != nil && try == 0 {
			c.token.expire()
			continue
		}
		return nil, e
	}
}

// certError returns err, a failure to verify the API server's certificate,
// with what to fix for its reason.
func certError(err error, unverified *tls.CertificateVerificationError) error {
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(unverified.Err, &host):
		return fmt.Errorf("%w: the API server's certificate does not name host %q: the host of the API server URL (WithAPIServer) must be one the certificate names", err, host.Host)
	case errors.As(unverified.Err, &invalid) && invalid.Reason == x509.Expired:
		return fmt.Errorf("%w: check this machine's clock, or renew the API server's certificate", err)
	}
	return fmt.Errorf("%w: the API server's certificate is not signed by a CA this client trusts; give its CA with WithCAFile", err)
}

// maxWarnings is how many distinct API server warnings a client remembers.
const maxWarnings = 64

// errorPeriod is how often a warning past maxWarnings is logged, at most:
// the root's period for repeats of an error.
const errorPeriod = time.Minute

// warnings logs the API server's Warning headers, such as "v1 Endpoints is
// deprecated in v1.33+", each once. It remembers at most maxWarnings, so
// that a server sending a new one with every response cannot grow it
// without bound; past that, it logs a warning it does not remember at most
// once per errorPeriod, saying how many it held back. Its zero value is
// ready to use.
type warnings struct {
	mu   sync.Mutex
	seen map[string]bool
	last time.Time // when a warning past maxWarnings was last logged
	held int       // warnings past maxWarnings not logged since
}

func (ws *warnings) log(log *slog.Logger, header []string) {
	for _, w := range header {
		w = clip(w, 0, false)
		switch ok, held := ws.note(w); {
		case ok && held > 0:
			log.Warn("the API server warns", "warning", w, "suppressed", held)
		case ok:
			log.Warn("the API server warns", "warning", w)
		}
	}
}

// note records w and reports whether to log it, and how many warnings were
// held back since the last one logged past maxWarnings.
func (ws *warnings) note(w string) (log bool, held int) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	switch {
	case ws.seen[w]:
		return false, 0
	case len(ws.seen) < maxWarnings:
		if ws.seen == nil {
			ws.seen = map[string]bool{}
		}
		ws.seen[w] = true
		return true, 0
	case time.Since(ws.last) < errorPeriod:
		ws.held++
		return false, 0
	}
	ws.last = time.Now()
	held, ws.held = ws.held, 0
	return true, held
}

// served reports whether the API server serves the group version at path,
// such as "/apis/discovery.k8s.io/v1".
func (c *client) served(ctx context.Context, path string, r request) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, path, nil, r)
	var e *APIError
	switch {
	case errors.As(err, &e) && e.StatusCode == http.StatusNotFound:
		return false, nil
	case err != nil:
		return false, err
	}
	resp.Body.Close()
	return true, nil
}
