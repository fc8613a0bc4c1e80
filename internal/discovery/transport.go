package discovery

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// This file is the API client's transport: client-go's settings, a CA file
// that is followed as it rotates, and connections that Close can end.

// newHTTPClient returns a client with one transport of its own, configured as
// client-go configures its: dial, TLS and keep-alive timeouts, and HTTP/2 with
// pings, so a watch on a dead connection fails within about 45 seconds
// instead of lingering for the kernel's TCP timeout. With a CA file, the
// transport follows the file (see caTransport), logging to log.
func newHTTPClient(caPath string, cs *conns, log *slog.Logger) (*http.Client, *caTransport, error) {
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
		return nil, nil, fmt.Errorf("read API server CA: %w", err)
	}
	if t.TLSClientConfig.RootCAs, err = certPool(caPath, pem); err != nil {
		return nil, nil, err
	}
	ca := &caTransport{path: caPath, log: log, t: t, pem: pem, readAt: time.Now()}
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
	path string
	log  *slog.Logger

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
		ca.log.Error("keeping the API server CA", keyError, err.Error())
		return ca.t
	}
	t := ca.t.Clone()
	t.TLSClientConfig.RootCAs = pool
	ca.t.CloseIdleConnections()
	ca.t, ca.pem = t, pem
	ca.log.Info("the API server CA changed; new connections trust it", "file", ca.path)
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
// dropped it. It tracks dials in progress too: net/http dials on a context
// detached from the request, so that the connection can serve the next
// one, and a dial that hangs would hold a goroutine and a socket for up to
// dialTimeout after Close.
type conns struct {
	mu      sync.Mutex
	open    map[*trackedConn]bool
	dialing map[*context.CancelFunc]bool
	closed  bool
}

func newConns() *conns {
	return &conns{open: map[*trackedConn]bool{}, dialing: map[*context.CancelFunc]bool{}}
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

// dial returns d's DialContext, tracking the dials and the connections it
// makes.
func (cs *conns) dial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cs.mu.Lock()
		closed := cs.closed
		if !closed {
			cs.dialing[&cancel] = true // for closeAll to cancel
		}
		cs.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		c, err := d.DialContext(ctx, network, addr)
		cs.mu.Lock()
		defer cs.mu.Unlock()
		delete(cs.dialing, &cancel)
		switch {
		case err != nil:
			return nil, err
		case cs.closed: // a dial that finished after close
			c.Close()
			return nil, net.ErrClosed
		}
		tc := &trackedConn{Conn: c, cs: cs}
		cs.open[tc] = true
		return tc, nil
	}
}

// closeAll ends every dial and closes every connection, and any made later.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	open, dialing := cs.open, cs.dialing
	cs.open, cs.dialing, cs.closed = nil, nil, true
	cs.mu.Unlock()
	for cancel := range dialing {
		(*cancel)()
	}
	for c := range open {
		c.Conn.Close()
	}
}
