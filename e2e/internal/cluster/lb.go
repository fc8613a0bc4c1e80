package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// HealthCheck is how an LB decides that its backend may take connections.
type HealthCheck int

const (
	// CheckTCP: the backend's port accepts TCP connections. A starting
	// kube-apiserver binds its port seconds before it serves, so
	// connections made meanwhile wait in its accept queue, as they do
	// when clients dial a single API server directly.
	CheckTCP HealthCheck = iota
	// CheckReady: the backend answers /readyz, as an HA load balancer's
	// health check does (HAProxy's "option httpchk GET /readyz").
	CheckReady
)

func (c HealthCheck) String() string {
	if c == CheckReady {
		return "readyz"
	}
	return "tcp"
}

// lbProbeInterval is how often an LB checks its backend.
const lbProbeInterval = 50 * time.Millisecond

// LB is a TCP load balancer on APIServerIP in front of one API server, as in
// front of the API servers of an HA control plane: TLS passes through it
// unchanged, so a client trusts the API server's own CA. While the backend
// passes its health check the LB listens and forwards each connection;
// otherwise it does not listen, so connections are refused, as by a port
// nothing listens on.
type LB struct {
	URL string // https://10.244.255.254:PORT

	backend *APIServer
	addr    string // the LB's
	target  string // the backend's host:port

	mu       sync.Mutex
	check    HealthCheck
	ln       net.Listener
	conns    map[net.Conn]bool
	accepted []time.Time
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup

	http *http.Client // of the readyz probe; used by the probe goroutine only
}

// NewLB starts an LB on port in front of backend, with health check c.
func NewLB(backend *APIServer, port int, c HealthCheck) (*LB, error) {
	host, backendPort, err := net.SplitHostPort(backend.URL[len("https://"):])
	if err != nil {
		return nil, fmt.Errorf("LB: backend URL %s: %w", backend.URL, err)
	}
	addr := net.JoinHostPort(APIServerIP, strconv.Itoa(port))
	lb := &LB{
		URL:     "https://" + addr,
		backend: backend,
		addr:    addr,
		target:  net.JoinHostPort(host, backendPort),
		check:   c,
		conns:   map[net.Conn]bool{},
		stop:    make(chan struct{}),
	}
	// Fail early if the port is taken.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("LB: %w", err)
	}
	ln.Close()
	lb.wg.Go(lb.probe)
	return lb, nil
}

// SetCheck changes the health check from the next probe on.
func (lb *LB) SetCheck(c HealthCheck) {
	lb.mu.Lock()
	lb.check = c
	lb.mu.Unlock()
}

// Accepted returns the times of the connections the LB accepted.
func (lb *LB) Accepted() []time.Time {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return append([]time.Time(nil), lb.accepted...)
}

// Close stops the LB and closes every connection through it.
func (lb *LB) Close() {
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return
	}
	lb.closed = true
	close(lb.stop)
	if lb.ln != nil {
		lb.ln.Close()
		lb.ln = nil
	}
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
}

// probe checks the backend every lbProbeInterval, and listens while it is
// healthy.
func (lb *LB) probe() {
	t := time.NewTicker(lbProbeInterval)
	defer t.Stop()
	for {
		lb.mu.Lock()
		c := lb.check
		lb.mu.Unlock()
		healthy := lb.healthy(c)
		lb.mu.Lock()
		switch {
		case lb.closed:
		case healthy && lb.ln == nil:
			if ln, err := net.Listen("tcp", lb.addr); err == nil {
				lb.ln = ln
				lb.wg.Go(func() { lb.accept(ln) })
			}
		case !healthy && lb.ln != nil:
			lb.ln.Close() // connections under way stay
			lb.ln = nil
		}
		lb.mu.Unlock()
		select {
		case <-lb.stop:
			if lb.http != nil {
				lb.http.CloseIdleConnections()
			}
			return
		case <-t.C:
		}
	}
}

func (lb *LB) healthy(c HealthCheck) bool {
	if c == CheckReady {
		return lb.ready()
	}
	conn, err := net.DialTimeout("tcp", lb.target, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// ready asks the backend's /readyz, over one kept-alive connection.
func (lb *LB) ready() bool {
	if lb.http == nil {
		ca, err := os.ReadFile(lb.backend.CAFile)
		if err != nil {
			return false
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return false
		}
		lb.http = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", lb.backend.URL+lb.backend.readyz, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := lb.http.Do(req)
	if err != nil {
		lb.http.CloseIdleConnections()
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (lb *LB) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		lb.mu.Lock()
		if lb.closed {
			lb.mu.Unlock()
			c.Close()
			return
		}
		lb.accepted = append(lb.accepted, time.Now())
		lb.conns[c] = true
		lb.mu.Unlock()
		lb.wg.Go(func() { lb.forward(c) })
	}
}

// forward pipes c to a new connection to the backend, until either side
// closes; if the backend refuses, c is closed at once.
func (lb *LB) forward(c net.Conn) {
	defer func() {
		lb.mu.Lock()
		delete(lb.conns, c)
		lb.mu.Unlock()
		c.Close()
	}()
	b, err := net.DialTimeout("tcp", lb.target, 5*time.Second)
	if err != nil {
		return
	}
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		b.Close()
		return
	}
	lb.conns[b] = true
	lb.mu.Unlock()
	defer func() {
		lb.mu.Lock()
		delete(lb.conns, b)
		lb.mu.Unlock()
		b.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { io.Copy(b, c); done <- struct{}{} }()
	go func() { io.Copy(c, b); done <- struct{}{} }()
	<-done // either side ended: end both
}
