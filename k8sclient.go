package selector

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
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

// APIError is an error response from the Kubernetes API server, decoded from
// its Status body. Use errors.As to get it from NewServerList's error.
type APIError struct {
	StatusCode int    // HTTP status, such as 403
	Reason     string // Status reason, such as "Forbidden" or "Expired"
	Message    string // Status message from the server

	// The request that failed: verb ("list", "watch" or "get"), resource
	// ("endpointslices.discovery.k8s.io" or "endpoints") and namespace.
	Verb, Resource, Namespace string

	retryAfter time.Duration // from Retry-After or details.retryAfterSeconds
	causes     []string      // details.causes[].reason
}

func (e *APIError) Error() string {
	req := fmt.Sprintf("%s %s in namespace %q", e.Verb, e.Resource, e.Namespace)
	switch e.StatusCode {
	case http.StatusForbidden:
		return fmt.Sprintf("%s is forbidden: the Role bound to this service account must allow verb %q on %s in that namespace (see the README's RBAC manifest): %s",
			req, e.Verb, e.Resource, e.Message)
	case http.StatusUnauthorized:
		return fmt.Sprintf("%s: unauthorized: the bearer token is missing, expired or revoked: %s", req, e.Message)
	}
	return fmt.Sprintf("%s: %d %s: %s", req, e.StatusCode, e.Reason, e.Message)
}

// expired reports whether the error says the requested resource version is
// gone (410, reason Expired or Gone) or newer than the server has seen: both
// mean relist from scratch.
func (e *APIError) expired() bool {
	if e.StatusCode == http.StatusGone || e.Reason == "Expired" || e.Reason == "Gone" {
		return true
	}
	for _, c := range e.causes {
		if c == "ResourceVersionTooLarge" {
			return true
		}
	}
	return strings.Contains(e.Message, "Too large resource version")
}

// status is the JSON of a metav1.Status.
type status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
	Details *struct {
		Causes []struct {
			Reason string `json:"reason"`
		} `json:"causes"`
		RetryAfterSeconds int `json:"retryAfterSeconds"`
	} `json:"details"`
}

// request names an API request for errors.
type request struct {
	verb, resource, namespace string
}

func (r request) error(s status, httpCode int) *APIError {
	e := &APIError{StatusCode: httpCode, Reason: s.Reason, Message: s.Message, Verb: r.verb, Resource: r.resource, Namespace: r.namespace}
	if e.StatusCode == 0 || e.StatusCode == http.StatusOK {
		e.StatusCode = s.Code
	}
	if s.Details != nil {
		e.retryAfter = time.Duration(s.Details.RetryAfterSeconds) * time.Second
		for _, c := range s.Details.Causes {
			e.causes = append(e.causes, c.Reason)
		}
	}
	return e
}

// client talks to one API server. It is safe for concurrent use.
type client struct {
	base  *url.URL
	http  *http.Client
	token *tokenFile   // nil: send no token
	ca    *caTransport // our own transport, when the CA is from a file
	conns *conns       // the connections of our own transport; nil with WithHTTPClient

	log    Logger   // nil: do not log
	warned sync.Map // API server warnings already logged
}

func newClient(o options) (*client, error) {
	inCluster := o.apiServer == ""
	server := o.apiServer
	if inCluster {
		host, port := o.getenv("KUBERNETES_SERVICE_HOST"), o.getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, ErrNotInCluster
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	base, err := url.Parse(server)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("selector: bad API server URL %q: want https://host:port, or http://host:port for kubectl proxy", server)
	}

	tokenPath, caPath := o.tokenFile, o.caFile
	if inCluster {
		if tokenPath == "" {
			tokenPath = o.saDir + "/token"
		}
		if caPath == "" {
			caPath = o.saDir + "/ca.crt"
		}
	}
	if o.httpClient != nil && o.httpClient.Timeout != 0 {
		return nil, fmt.Errorf("selector: WithHTTPClient: the client's Timeout (%v) would cut every watch short; set it to zero (each request has its own deadline)", o.httpClient.Timeout)
	}
	c := &client{base: base, http: o.httpClient}
	if tokenPath != "" {
		c.token = &tokenFile{path: tokenPath}
		if _, err := c.token.get(); err != nil {
			return nil, fmt.Errorf("selector: %w", err)
		}
	}
	if c.http == nil {
		c.conns = &conns{open: map[*trackedConn]bool{}}
		c.http, c.ca, err = newHTTPClient(caPath, c.conns, c)
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// close ends the connections of the client's own transport, once the watch
// has stopped.
func (c *client) close() {
	if c.conns != nil {
		c.conns.closeAll()
	}
}

// newHTTPClient returns a client with one transport of its own, configured as
// client-go configures its: dial, TLS and keep-alive timeouts, and HTTP/2 with
// pings, so a watch on a dead connection fails within about 45 seconds
// instead of lingering for the kernel's TCP timeout. With a CA file, the
// transport follows the file (see caTransport), logging to c.
func newHTTPClient(caPath string, cs *conns, c *client) (*http.Client, *caTransport, error) {
	t := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         cs.dial(&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}),
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: tlsTimeout,
		MaxIdleConnsPerHost: 25,
		// A custom TLSClientConfig turns HTTP/2 off unless it is forced.
		ForceAttemptHTTP2: true,
		HTTP2:             &http.HTTP2Config{SendPingTimeout: pingAfterIdle, PingTimeout: pingTimeout},
	}
	if caPath == "" {
		return &http.Client{Transport: t}, nil, nil
	}
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return nil, nil, fmt.Errorf("selector: read API server CA: %w", err)
	}
	if t.TLSClientConfig.RootCAs, err = certPool(caPath, pem); err != nil {
		return nil, nil, fmt.Errorf("selector: %w", err)
	}
	ca := &caTransport{path: caPath, client: c, t: t, pem: pem, readAt: time.Now()}
	return &http.Client{Transport: ca}, ca, nil
}

// certPool returns the certificates of pem, read from the CA file at path.
func certPool(path string, pem []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("API server CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// caTransport sends requests through a transport that trusts the CA in a
// file, and follows the file as client-go does (ClientsAllowCARotation). The
// file is read again when five minutes old, or at once after a certificate
// the CA does not verify (see expire); a changed CA moves new requests to a
// clone of the transport that trusts it. Requests under way, such as a
// watch, keep their connection. A file that cannot be read or parsed keeps
// the last good CA.
type caTransport struct {
	path   string
	client *client // for its log

	mu     sync.Mutex
	t      *http.Transport
	pem    []byte
	readAt time.Time
}

func (ca *caTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return ca.transport().RoundTrip(req)
}

func (ca *caTransport) transport() *http.Transport {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if time.Since(ca.readAt) < caReadPeriod {
		return ca.t
	}
	ca.readAt = time.Now()
	pem, err := os.ReadFile(ca.path)
	if err == nil && bytes.Equal(pem, ca.pem) {
		return ca.t
	}
	var pool *x509.CertPool
	if err == nil {
		pool, err = certPool(ca.path, pem)
	}
	if err != nil {
		if lg := ca.client.log; lg != nil {
			lg.Errorf("selector: keeping the API server CA: %v", err)
		}
		return ca.t
	}
	t := ca.t.Clone()
	t.TLSClientConfig.RootCAs = pool
	ca.t.CloseIdleConnections()
	ca.t, ca.pem = t, pem
	if lg := ca.client.log; lg != nil {
		lg.Infof("selector: the API server CA in %s changed; new connections trust it", ca.path)
	}
	return t
}

// expire makes the next request read the CA file again.
func (ca *caTransport) expire() {
	ca.mu.Lock()
	ca.readAt = time.Time{}
	ca.mu.Unlock()
}

// conns tracks a transport's open connections, so that close can end them.
// CloseIdleConnections is not enough: a watch cancelled by Close releases its
// HTTP/2 stream a moment after Close returns, and the connection, idle too
// late, would stay open with its reader goroutine until the API server
// dropped it.
type conns struct {
	mu     sync.Mutex
	open   map[*trackedConn]bool
	closed bool
}

type trackedConn struct {
	net.Conn
	cs *conns
}

func (c *trackedConn) Close() error {
	c.cs.mu.Lock()
	delete(c.cs.open, c)
	c.cs.mu.Unlock()
	return c.Conn.Close()
}

// dial returns d's DialContext, tracking the connections it makes.
func (cs *conns) dial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.closed { // a dial that finished after close
			c.Close()
			return nil, net.ErrClosed
		}
		tc := &trackedConn{Conn: c, cs: cs}
		cs.open[tc] = true
		return tc, nil
	}
}

// closeAll closes every connection, and any made later.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	open := cs.open
	cs.open, cs.closed = nil, true
	cs.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

// tokenFile is a bearer token read from a file, read again when it is a
// minute old or after a 401. Kubelet replaces projected tokens by swapping a
// symlink, so re-reading by time is what works; file events do not.
type tokenFile struct {
	path string

	mu     sync.Mutex
	token  string
	readAt time.Time
}

// get returns the token, reading the file if the token is stale. If a
// re-read fails, it keeps the last good token.
func (t *tokenFile) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && time.Since(t.readAt) < tokenReadPeriod {
		return t.token, nil
	}
	b, err := os.ReadFile(t.path)
	tok := strings.TrimSpace(string(b))
	switch {
	case err == nil && tok == "":
		err = fmt.Errorf("token file %s is empty", t.path)
	case err != nil:
		err = fmt.Errorf("read token: %w", err)
	}
	if err != nil {
		if t.token != "" {
			return t.token, nil
		}
		return "", err
	}
	t.token, t.readAt = tok, time.Now()
	return tok, nil
}

// expire makes the next get read the file again.
func (t *tokenFile) expire() {
	t.mu.Lock()
	t.readAt = time.Time{}
	t.mu.Unlock()
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
		if err != nil && c.ca != nil && errors.As(err, &unverified) && try == 0 {
			c.ca.expire() // the API server's CA may have rotated: read it again
			continue
		}
		if err != nil {
			return nil, err
		}
		// Such as "v1 Endpoints is deprecated in v1.33+": worth saying once.
		for _, w := range resp.Header.Values("Warning") {
			if _, seen := c.warned.LoadOrStore(w, true); !seen && c.log != nil {
				c.log.Infof("selector: the API server warns: %s", w)
			}
		}
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

// readError decodes a failed response's Status body and closes it.
func readError(resp *http.Response, r request) *APIError {
	defer resp.Body.Close()
	var s status
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(b, &s) != nil || s.Kind != "Status" {
		s = status{Reason: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(b))}
	}
	e := r.error(s, resp.StatusCode)
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.retryAfter = time.Duration(secs) * time.Second
	}
	return e
}

// list GETs a collection and decodes it into v.
func (c *client) list(ctx context.Context, path string, q url.Values, r request, v any) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decode %s list: %w", r.resource, err)
	}
	return nil
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

// event is one watch event; object is decoded by type.
type event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watchStream reads the events of one WATCH response.
type watchStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// watch starts a WATCH (a GET with watch=1) and returns its event stream once
// the server has answered 200. ctx bounds the whole stream.
func (c *client) watch(ctx context.Context, path string, q url.Values, r request) (*watchStream, error) {
	q.Set("watch", "1")
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return nil, err
	}
	return &watchStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// next returns the next event. A closed connection, a server timeout and the
// end of ctx all end the stream with io.EOF: the caller resumes from the last
// resource version. Malformed JSON is an error.
func (s *watchStream) next() (event, error) {
	var ev event
	err := s.dec.Decode(&ev)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		return ev, nil
	case errors.As(err, &syntax), errors.As(err, &typ):
		return ev, fmt.Errorf("decode watch event: %w", err)
	default:
		return ev, io.EOF
	}
}

func (s *watchStream) close() { s.body.Close() }

// The API objects, with only the fields the ServerList reads.

type objectMeta struct {
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
}

type listMeta struct {
	ResourceVersion string `json:"resourceVersion"`
}

type objectList struct {
	Metadata listMeta          `json:"metadata"`
	Items    []json.RawMessage `json:"items"`
}

type objectRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

type port struct {
	Name     *string `json:"name"`
	Port     *int32  `json:"port"`
	Protocol *string `json:"protocol"`
}

// endpointSlice is a discovery.k8s.io/v1 EndpointSlice.
type endpointSlice struct {
	Metadata    objectMeta `json:"metadata"`
	AddressType string     `json:"addressType"`
	Endpoints   []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready       *bool `json:"ready"`
			Serving     *bool `json:"serving"`
			Terminating *bool `json:"terminating"`
		} `json:"conditions"`
		Hostname  *string    `json:"hostname"`
		TargetRef *objectRef `json:"targetRef"`
	} `json:"endpoints"`
	Ports []port `json:"ports"`
}

// endpoints is a core/v1 Endpoints.
type endpoints struct {
	Metadata objectMeta `json:"metadata"`
	Subsets  []struct {
		Addresses []struct {
			IP        string     `json:"ip"`
			Hostname  string     `json:"hostname"`
			TargetRef *objectRef `json:"targetRef"`
		} `json:"addresses"`
		Ports []port `json:"ports"`
	} `json:"subsets"`
}
