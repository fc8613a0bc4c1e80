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

	state    atomic.Int32  // a serverState
	timeouts atomic.Int32  // consecutive timeouts
	inflight atomic.Int32  // requests running on mc
	retired  atomic.Bool   // left: close its connections once idle
	lost     atomic.Bool   // left, and no longer serves or failed since: not read or written any more
	maxCAS   atomic.Uint64 // the highest CAS id a reply carried, to tell a restart
	pending  atomic.Bool   // its invalidations are not empty: check a value read from it (see Client.suspect)
	failing  atomic.Bool   // up, failing, but kept in: as many servers are out as the Client allows (see Client.takeOut)

	// Guarded by Client.mu.
	log      invalidations
	left     time.Time // when it left the ring; zero while a member
	probing  bool      // a prober goroutine runs
	failures int       // consecutive failed probes, for the backoff
}

type serverState int32

const (
	up        serverState = iota // routed to
	down                         // out for this client: failed, probed until it answers
	replaying                    // answered a probe; its invalidation log is being replayed
	gone                         // not a member: left the ring
)

func (s serverState) String() string {
	return [...]string{"up", "down", "replaying", "gone"}[s]
}

func (s *server) status() serverState { return serverState(s.state.Load()) }

// stateName is the state ServerStats shows: the status, or "failing" for a
// server up only because the cap on servers out keeps it in.
func (s *server) stateName() string {
	if st := s.status(); st != up || !s.failing.Load() {
		return st.String()
	}
	return "failing"
}

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

// seenCAS notes a CAS id the server returned. memcached numbers its CAS ids
// from 1 when it starts, so a server whose new ids are below one seen
// before has restarted (see Client.recover).
func (s *server) seenCAS(id uint64) {
	if id > s.maxCAS.Load() {
		s.maxCAS.Store(id)
	}
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
	healthy     failure = iota // a reply, or an error that is not the server's (a miss, a bad key)
	unreachable                // the connection could not be made: nothing was sent
	timedOut                   // no reply in time: the request may have run
	broken                     // the connection broke: the request may have run
)

// failureOf returns what err, from a request to a server, says about it.
func failureOf(err error) failure {
	var de *dialError
	var cte *memcache.ConnectTimeoutError
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrNotStored),
		errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrMalformedKey):
		return healthy
	case errors.As(err, &de), errors.As(err, &cte):
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
	return healthy // a server error or an unexpected reply: the server answered
}

// appError returns err as gomemcache would have returned it.
func appError(err error) error {
	var de *dialError
	if errors.As(err, &de) {
		return de.err
	}
	return err
}

// invalidations is the keys a server must forget before it is routed to
// again: those written or deleted elsewhere while it was out. Past max keys
// it is overflowed, and the server is flushed instead.
type invalidations struct {
	keys       map[string]struct{}
	overflowed bool
}

func (l *invalidations) add(key string, max int) {
	switch {
	case l.overflowed:
	case len(l.keys) >= max:
		l.keys, l.overflowed = nil, true
	default:
		if l.keys == nil {
			l.keys = map[string]struct{}{}
		}
		l.keys[key] = struct{}{}
	}
}

func (l *invalidations) has(key string) bool {
	_, ok := l.keys[key]
	return l.overflowed || ok
}
