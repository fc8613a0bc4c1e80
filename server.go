package selector

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// server is one memcached server as the Client sees it: its own gomemcache
// client (so that each server has its own idle connections, which can be
// closed when it leaves), and its health for this client.
//
// A server outlives the rings it is in: the Client keeps it, with its
// invalidation log, while it is a member, and for a while after it leaves
// (see Client.forget), so that a server that returns is known.
type server struct {
	addr *staticAddr
	mc   *memcache.Client

	state     atomic.Int32  // a serverState
	timeouts  atomic.Int32  // consecutive timeouts
	inflight  atomic.Int32  // requests running on mc
	retired   atomic.Bool   // left: close its connections once idle
	lost      atomic.Bool   // left, and no longer serves or failed since: not read or written any more
	keptIn    atomic.Bool   // failing, but kept in by the cap on servers out
	contacted atomic.Bool   // a request of the Client's succeeded there
	pending   atomic.Bool   // its invalidation log is not empty (see invalLog)
	floor     atomic.Uint64 // values with a lower CAS id predate a lost history: never served (see Client.servable)
	started   atomic.Int64  // the process start (unix seconds, from stats) that floor was taken in
	checked   atomic.Int64  // when a value below floor last made the Client check for a restart (unix nanos)

	// Guarded by Client.mu.
	left     time.Time // when it left the ring; zero while a member
	downAt   time.Time // when it went out for this client
	soft     bool      // out after timeouts, which count toward the cap on servers out
	probing  bool      // a prober goroutine runs
	draining bool      // a goroutine deletes its logged keys
}

type serverState int32

const (
	up   serverState = iota // routed to
	down                    // out for this client: failed, probed until it answers
	gone                    // not a member: left the ring
)

func (s serverState) String() string {
	return [...]string{"up", "down", "gone"}[s]
}

func (s *server) status() serverState { return serverState(s.state.Load()) }

// newServer returns a server at a, with its own gomemcache client built
// from the Client's connection settings.
func newServer(a *staticAddr, cc connConfig) *server {
	s := &server{addr: a}
	s.mc = memcache.NewFromSelector(fixed{a})
	s.mc.Timeout = cc.timeout
	s.mc.MaxIdleConns = cc.maxIdle
	dial := cc.dial
	if dial == nil {
		d := &net.Dialer{}
		dial = d.DialContext
	}
	s.mc.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, &dialError{err}
		}
		return c, nil
	}
	return s
}

// connConfig is gomemcache's knobs, as the Client's options give them.
type connConfig struct {
	timeout time.Duration
	maxIdle int
	dial    func(ctx context.Context, network, address string) (net.Conn, error)
}

// call runs f on the server's gomemcache client, counting it in flight so
// that a server that left closes its connections only once they are idle.
func (s *server) call(f func(*memcache.Client) error) error {
	s.inflight.Add(1)
	err := f(s.mc)
	if s.inflight.Add(-1) == 0 && s.retired.Load() {
		s.mc.Close()
	}
	if err == nil && !s.contacted.Load() {
		s.contacted.Store(true)
	}
	return err
}

// retire closes the server's idle connections now, and those in use as
// they come back (see call): gomemcache would keep them open for ever
// (gomemcache issue #118).
func (s *server) retire() {
	s.retired.Store(true)
	if s.inflight.Load() == 0 {
		s.mc.Close()
	}
}

// unretire makes a server that returned keep its connections again.
func (s *server) unretire() { s.retired.Store(false); s.lost.Store(false) }

// readable reports whether a value read from s can be used for a handoff:
// it is up, or it left but still serves (a terminating pod in its grace
// period; see Client.refresh).
func (s *server) readable() bool {
	st := s.status()
	return st == up || st == gone && !s.lost.Load()
}

// fixed is a memcache.ServerSelector of one server.
type fixed struct{ a net.Addr }

func (f fixed) PickServer(string) (net.Addr, error) { return f.a, nil }
func (f fixed) Each(fn func(net.Addr) error) error  { return fn(f.a) }

// dialError marks an error of the dialer: the request was not sent, so it
// can go to another server whatever it was. It keeps the dialer's Timeout,
// which gomemcache turns into a *memcache.ConnectTimeoutError.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }
func (e *dialError) Timeout() bool {
	var ne net.Error
	return errors.As(e.err, &ne) && ne.Timeout()
}
func (e *dialError) Temporary() bool { return false }

// failure is what an error says about the server that returned it.
type failure int

const (
	healthy        failure = iota // a reply, or an error that is not the server's (a miss, a bad key)
	unreachable                   // the connection was refused: nothing was sent
	connectTimeout                // the connection was not made in time: nothing was sent, but the server may only be slow
	timedOut                      // no reply in time: the request may have run
	broken                        // the connection broke: the request may have run
	refused                       // the server answered with an error: the request did not run
	local                         // this machine's resources ran out: nothing was sent, no server is to blame
)

// failureOf returns what err, from a request to a server, says about it.
func failureOf(err error) failure {
	if err == nil {
		return healthy
	}
	return classifyErr(err)
}

// classifyErr is failureOf for an error, out of line so that the request path
// for a nil error does not pay for errors.As.
func classifyErr(err error) failure {
	var de *dialError
	var cte *memcache.ConnectTimeoutError
	var ne net.Error
	switch {
	case errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored),
		errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrMalformedKey):
		return healthy
	case localError(err):
		return local
	case errors.As(err, &cte), errors.As(err, &de) && de.Timeout():
		return connectTimeout
	case errors.As(err, &de):
		return unreachable
	case errors.As(err, &ne) && ne.Timeout():
		return timedOut
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return broken
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return broken
	}
	// A server error (SERVER_ERROR out of memory, object too large) or an
	// unexpected reply: the server answered. The request failed there, and
	// is not tried elsewhere: another server would hold a copy its home
	// does not know of.
	return refused
}

// localError reports whether err is this machine's, not the server's: out
// of file descriptors, ports or buffers. mcrouter does not count those
// against a server either; every server would fail alike.
func localError(err error) bool {
	for _, e := range [...]syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.EADDRNOTAVAIL, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// appError returns err as gomemcache would have returned it.
func appError(err error) error {
	if err == nil {
		return nil
	}
	var de *dialError
	if errors.As(err, &de) {
		return de.err
	}
	return err
}
