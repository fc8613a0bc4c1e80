package selector

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// server is one memcached server as the Client sees it: its own
// connections (so that they can be closed when it leaves; see wire), and
// its health for this client.
//
// A server outlives the rings it is in: the Client keeps it, with its
// invalidation log, while it is a member, and for a while after it leaves
// (see Client.forget), so that a server that returns is known.
type server struct {
	addr    *staticAddr
	meta    metaWire    // the meta protocol, unless noMeta
	classic classicWire // gomemcache's: for a server without meta commands, and for flush_all
	log     *slog.Logger
	timeout time.Duration
	dial    func(ctx context.Context) (net.Conn, error) // a connection of its own, for a key listing (see Client.moveFrom)

	proto     atomic.Int32  // a protocol: unknown until the first contact (see call)
	itemMax   atomic.Int64  // its item_size_max, read at the first contact; 0 until then, or if it did not say (see fits)
	state     atomic.Int32  // a serverState
	timeouts  atomic.Int32  // consecutive timeouts
	inflight  atomic.Int32  // requests running on it
	retired   atomic.Bool   // left and no longer read: close its connections once idle
	lost      atomic.Bool   // left, and no longer serves or failed since: not read or written any more
	keptIn    atomic.Bool   // failing, but kept in by the cap on servers out
	contacted atomic.Bool   // a request of the Client's succeeded there
	pending   atomic.Bool   // its invalidation log is not empty (see invalLog)
	floor     atomic.Uint64 // values with a lower CAS id predate a lost history: never served (see Client.servable)
	started   atomic.Int64  // the process start (unix seconds, from stats) that floor was taken in
	checked   atomic.Int64  // when a value below floor last made the Client check for a restart (unix nanos)

	floorMu  sync.Mutex // guards floorGen, and the floor's move from pending to known
	floorGen uint64     // the floors asked for (see askFloor)

	lossesKnown atomic.Bool  // its record of the slots it lost was read (see Client.lossesKnown)
	losses      serverLosses // the slots that record owes, and its highest floor known

	// Guarded by Client.mu.
	left     time.Time     // when it left the ring; zero while a member
	downAt   time.Time     // when it went out for this client
	soft     bool          // out after timeouts, which count toward the cap on servers out
	probing  bool          // a prober goroutine runs
	draining bool          // a goroutine deletes its logged keys
	learning chan struct{} // closed when its record of lost slots is read; nil if no read runs
}

type serverState int32

const (
	up   serverState = iota // routed to
	down                    // out for this client: failed, probed until it answers
	gone                    // not a member: left the ring
)

func (s serverState) String() string {
	return [...]string{"up", "out", "gone"}[s] // as ServerState
}

func (s *server) status() serverState { return serverState(s.state.Load()) }

// askFloor makes s's floor pending (math.MaxUint64: nothing served) until
// one taken from now on is set with the number it returns (see setFloor).
func (s *server) askFloor() uint64 {
	s.floorMu.Lock()
	defer s.floorMu.Unlock()
	s.floorGen++
	s.floor.Store(math.MaxUint64)
	return s.floorGen
}

// floorAsked returns the number of the floor asked for last, and whether
// it is still pending.
func (s *server) floorAsked() (gen uint64, pending bool) {
	s.floorMu.Lock()
	defer s.floorMu.Unlock()
	return s.floorGen, s.floor.Load() == math.MaxUint64
}

// setFloor sets f, taken in the process that started at start, as s's
// floor, if it is the floor asked for last and still pending. A floor
// taken for an older request could be below values that a newer one must
// exclude; and once one is set, a second, higher one would exclude the
// values written since the first.
func (s *server) setFloor(gen uint64, start int64, f uint64) bool {
	s.floorMu.Lock()
	defer s.floorMu.Unlock()
	if gen != s.floorGen || s.floor.Load() != math.MaxUint64 {
		return false
	}
	s.started.Store(start)
	s.floor.Store(f)
	return true
}

// newServer returns a server at a, with connections of its own built from
// the Client's connection settings. Nothing is dialed yet.
func newServer(a *staticAddr, cc connConfig) *server {
	dial := cc.dialer()
	return &server{addr: a, meta: newMetaWire(a, cc), classic: newClassicWire(a, cc), log: cc.log, timeout: cc.timeout,
		dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, a.network, a.str) }}
}

// connConfig is the connections' knobs, as the Client's options give them.
type connConfig struct {
	timeout time.Duration
	maxIdle int // connections kept per server
	maxItem int // the bound on a value read (WithMaxItemSize); 0: each server's own
	dial    func(ctx context.Context, network, address string) (net.Conn, error)
	log     *slog.Logger
}

// dialer returns the dial function, the default one if none was given.
func (cc connConfig) dialer() func(ctx context.Context, network, address string) (net.Conn, error) {
	if cc.dial != nil {
		return cc.dial
	}
	d := &net.Dialer{}
	return d.DialContext
}

// The protocols a server is spoken to in.
const (
	protoUnknown int32 = iota // not contacted yet
	protoMeta                 // memcached 1.6 or later
	protoClassic              // no meta commands: gomemcache's protocol
)

// wire returns the protocol s is spoken to in, and learns it at the first
// contact: a server that answers mn (the meta no-op) speaks the meta
// protocol; one that answers ERROR does not. A contact that fails leaves it
// unknown, for the next request to learn.
func (s *server) wire() wire {
	switch s.proto.Load() {
	case protoMeta:
		return s.meta
	case protoClassic:
		return s.classic
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	itemMax, err := s.meta.contact(ctx)
	cancel()
	switch {
	case err == nil:
		s.itemMax.Store(int64(itemMax))
		s.proto.CompareAndSwap(protoUnknown, protoMeta)
	case errors.Is(err, meta.ErrUnknownCommand):
		s.useClassic()
		return s.classic
	}
	return s.meta
}

// useClassic speaks to s in the classic protocol from now on, and says so
// once.
func (s *server) useClassic() {
	if s.proto.Swap(protoClassic) != protoClassic && s.log != nil {
		s.log.Warn(noMetaNote, keyServer, s.addr.str)
	}
}

// call runs f on the server's wire, counting it in flight so that a server
// that left closes its connections only once they are idle. A server that
// answers a meta command with ERROR predates the meta protocol: from then
// on it is spoken to in the classic protocol, and f runs again there (the
// command was not run). flush_all, which has no meta command, always goes
// by the classic protocol.
func (s *server) call(f func(w wire) error) error {
	s.inflight.Add(1)
	w := s.wire()
	err := f(w)
	switch {
	case err == nil:
	case errors.Is(err, errNoMetaFlush):
		err = f(s.classic)
	case errors.Is(err, meta.ErrUnknownCommand) && w != wire(s.classic):
		s.useClassic() // it was replaced by an older one since its first contact
		err = f(s.classic)
	}
	s.end(err)
	return err
}

// end ends a request that began with s.inflight.Add(1), with err, its
// error: call's end, and a GetMulti batch's (see Client.getMulti).
func (s *server) end(err error) {
	if s.inflight.Add(-1) == 0 && s.retired.Load() {
		s.closeIdle()
	}
	if err == nil && !s.contacted.Load() {
		s.contacted.Store(true)
	}
}

// closeIdle closes the server's idle connections, in both protocols.
func (s *server) closeIdle() {
	s.meta.CloseIdle()
	s.classic.CloseIdle()
}

// retire closes the server's idle connections now, and those in use as
// they come back (see call): gomemcache would keep them open for ever
// (gomemcache issue #118). The Client retires a server that left once it
// is no longer read: lost, or in no past ring (see Client.refresh).
func (s *server) retire() {
	s.retired.Store(true)
	if s.inflight.Load() == 0 {
		s.closeIdle()
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
	abandoned                     // the caller's context ended: the request may have run; no server is to blame
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
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return abandoned
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
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		errors.Is(err, meta.ErrConnClosed), errors.Is(err, meta.ErrProtocol):
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
