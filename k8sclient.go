package selector

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
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

// clientConfig is the API server and its credentials.
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

// Bounds on what the API server may send, so that a broken or hostile one
// cannot exhaust memory. etcd keeps objects of at most 1.5 MiB; one
// Service's EndpointSlices list in kilobytes to a few megabytes, and a ring
// takes at most maxMembers servers. A list is bounded in items too, since a
// tiny item such as 0 costs more in memory than in JSON.
const (
	maxListBytes  = 64 << 20
	maxListItems  = 100_000
	maxEventBytes = 8 << 20 // a watch event, and each value in a list
)

// errTooLarge is a response over one of the bounds above.
var errTooLarge = errors.New("too large")

// limitReader reads from r until max bytes have been read since the count
// was last set, then fails with errTooLarge.
type limitReader struct {
	r           io.Reader
	n, max      int
	what        string // for the error: "a watch event"
	tooLargeFor string // "a Kubernetes object"
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n >= l.max {
		return 0, l.err()
	}
	p = p[:min(len(p), l.max-l.n)]
	n, err := l.r.Read(p)
	l.n += n
	return n, err
}

func (l *limitReader) err() error {
	return fmt.Errorf("%s is over %d MiB, %w for %s: is the API server URL (WithAPIServer) a Kubernetes API server's?", l.what, l.max>>20, errTooLarge, l.tooLargeFor)
}

// list GETs a collection and decodes it into l. (The transport inflates
// gzip first, so the bounds are on the inflated size.)
func (c *client) list(ctx context.Context, path string, q url.Values, r request, l *objectList) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	all := &limitReader{r: resp.Body, max: maxListBytes, what: "the " + r.resource + " list", tooLargeFor: "the list of one Service"}
	if resp.ContentLength > maxListBytes {
		err = all.err() // said so at once: no need to read it
	} else {
		err = decodeList(all, l)
	}
	if err != nil {
		return fmt.Errorf("decode %s list: %w", r.resource, err)
	}
	return nil
}

// decodeList decodes a list from r into l, one value at a time: decoding
// the list as one value would take twice its size in buffers, and up to 80
// times its size for tiny items. Each value is at most maxEventBytes, and
// the items at most maxListItems. Only the fields of objectList are read.
func decodeList(r io.Reader, l *objectList) error {
	d := &listDecoder{one: &limitReader{r: r, max: maxEventBytes, what: "a value in the list", tooLargeFor: "a Kubernetes object"}}
	d.dec = json.NewDecoder(d.one)
	if err := d.delim('{'); err != nil {
		return err
	}
	for d.dec.More() {
		key, err := d.token()
		if err != nil {
			return err
		}
		switch key {
		case "kind":
			err = d.value(&l.Kind)
		case "metadata":
			err = d.value(&l.Metadata)
		case "items":
			err = d.items(l)
		default:
			var skip json.RawMessage
			err = d.value(&skip)
		}
		if err != nil {
			return err
		}
	}
	return d.delim('}')
}

// listDecoder reads a list's JSON, bounding each value it decodes.
type listDecoder struct {
	dec *json.Decoder
	one *limitReader // reads dec's input, and counts the current value's bytes
}

func (d *listDecoder) value(v any) error {
	err := d.dec.Decode(v)
	d.one.n = buffered(d.dec) // what is read ahead belongs to the next value
	return err
}

func (d *listDecoder) token() (json.Token, error) {
	t, err := d.dec.Token()
	d.one.n = buffered(d.dec)
	return t, err
}

// delim reads the delimiter want.
func (d *listDecoder) delim(want json.Delim) error {
	t, err := d.token()
	if err == nil && t != want {
		err = fmt.Errorf("found %v where the list has %v", t, want)
	}
	return err
}

// items decodes the items array of l, or null.
func (d *listDecoder) items(l *objectList) error {
	l.Items = nil // a repeated key replaces the items, as in encoding/json
	t, err := d.token()
	if err != nil || t == nil {
		return err
	}
	if t != json.Delim('[') {
		return fmt.Errorf("found %v where the list has its items array", t)
	}
	for d.dec.More() {
		if len(l.Items) == maxListItems {
			return fmt.Errorf("the list has over %d items, %w for the list of one Service: is the API server URL (WithAPIServer) a Kubernetes API server's?", maxListItems, errTooLarge)
		}
		var item json.RawMessage
		if err := d.value(&item); err != nil {
			return err
		}
		l.Items = append(l.Items, item)
	}
	return d.delim(']')
}

// buffered returns how many bytes dec has read ahead of what it decoded.
func buffered(dec *json.Decoder) int {
	if r, ok := dec.Buffered().(interface{ Len() int }); ok { // a *bytes.Reader: no copy
		return r.Len()
	}
	n, _ := io.Copy(io.Discard, dec.Buffered())
	return int(n)
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

// watchStream reads the events of one WATCH response, each of at most
// maxEventBytes.
type watchStream struct {
	body  io.ReadCloser
	limit *limitReader
	buf   *bufio.Reader
	dec   *json.Decoder
}

// watch starts a WATCH (a GET with watch=1) and returns its event stream once
// the server has answered 200. ctx bounds the whole stream.
func (c *client) watch(ctx context.Context, path string, q url.Values, r request) (*watchStream, error) {
	q.Set("watch", "1")
	resp, err := c.get(ctx, path, q, r)
	if err != nil {
		return nil, err
	}
	return newWatchStream(resp.Body), nil
}

func newWatchStream(body io.ReadCloser) *watchStream {
	s := &watchStream{body: body, limit: &limitReader{r: body, max: maxEventBytes, what: "a watch event", tooLargeFor: "a Kubernetes object"}}
	// A large buffer takes in a burst of events with one read, so that more
	// can tell that they arrived together.
	s.buf = bufio.NewReaderSize(s.limit, 64<<10)
	s.dec = json.NewDecoder(s.buf)
	return s
}

// next returns the next event. A closed connection, a server timeout and the
// end of ctx all end the stream with io.EOF: the caller resumes from the last
// resource version. Malformed JSON and an event over maxEventBytes are
// errors.
func (s *watchStream) next() (event, error) {
	var ev event
	err := s.dec.Decode(&ev)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		// What is read ahead belongs to the next event.
		s.limit.n = s.buf.Buffered() + buffered(s.dec)
		return ev, nil
	case errors.As(err, &syntax), errors.As(err, &typ), errors.Is(err, errTooLarge):
		return ev, fmt.Errorf("decode watch event: %w", err)
	default:
		return ev, io.EOF
	}
}

// more reports whether the next event has already arrived, at least in
// part: bytes other than the newlines between events are waiting. It reads
// only up to the first such byte, since the decoder may hold megabytes.
func (s *watchStream) more() bool {
	if s.buf.Buffered() > 0 {
		return true
	}
	r := s.dec.Buffered() // a view: reading it leaves the decoder's bytes in place
	var b [1]byte
	for {
		if n, _ := r.Read(b[:]); n == 0 {
			return false
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
		default:
			return true
		}
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

// objectList is a list, as decodeList reads it: only these fields.
type objectList struct {
	Kind     string            `json:"kind"`
	Metadata listMeta          `json:"metadata"`
	Items    []json.RawMessage `json:"items"`
}
