package selector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// clientOptions are the Client's settings: gomemcache's knobs, failover and
// handoff, from the Client's options, which NewServerList refuses.
type clientOptions struct {
	conn              connConfig
	timeoutsUntilDown int
	probeMin          time.Duration // the first probe's delay
	probeMax          time.Duration
	maxDown           float64       // the share of the servers that may be down at once; negative: failover off
	standInTTL        time.Duration // the longest expiration a write sent to a stand-in keeps
	handoffWindow     time.Duration // how long a key that moved is read from where it was; 0: no handoff
	handoffTTL        time.Duration // the expiration of a value copied by a handoff; 0: none
	maxPast           int           // past rings kept for handoff, at least (see pastLimit)
	maxInvalidations  int           // keys a server's invalidation log holds
	maxLogged         int           // keys all the servers' logs hold
	departedKeep      time.Duration // how long a server that left is remembered
	learnWait         time.Duration // how long a learned floor waits (see gains.learn)
	pool              Pool
	moves             Moves   // how the mover moves keys (see Moves)
	metrics           Metrics // see WithMetrics; nil for none
}

// The defaults of the Client's settings.
const (
	defaultTimeouts      = 3
	defaultProbeFirst    = time.Second
	defaultProbeMax      = 30 * time.Second
	defaultMaxOut        = 0.5
	defaultStandInTTL    = 60 * time.Second
	defaultHandoffWindow = 5 * time.Minute
	defaultHandoffTTL    = 5 * time.Minute
	// How long a learned floor waits for the Client to see the change it
	// may be of (see gains.learn): longer than a Client takes to see a
	// change another saw first, with a loaded API server. A Client started
	// as slots come back, before any Client marked them, misses its keys of
	// them that long.
	defaultLearnWait    = 15 * time.Second
	maxExpiration       = 30 * 24 * time.Hour // memcached reads a longer one as a Unix time
	defaultMaxIdleConns = memcache.DefaultMaxIdleConns
	defaultTimeout      = memcache.DefaultTimeout
)

func defaultClientOptions() clientOptions {
	return clientOptions{
		conn:              connConfig{timeout: defaultTimeout, maxIdle: defaultMaxIdleConns},
		timeoutsUntilDown: defaultTimeouts,
		probeMin:          defaultProbeFirst,
		probeMax:          defaultProbeMax,
		maxDown:           defaultMaxOut,
		standInTTL:        defaultStandInTTL,
		handoffWindow:     defaultHandoffWindow,
		learnWait:         defaultLearnWait,
		handoffTTL:        defaultHandoffTTL,
		maxPast:           4,
		maxInvalidations:  10000,
		maxLogged:         100000,
		departedKeep:      time.Hour,
	}
}

// clientOpt returns an Option of the Client's, named name, which set
// applies: NewServerList refuses it, and a bad value is newOptions' error.
func clientOpt(name string, set func(c *clientOptions) error) Option {
	return func(o *options) {
		if o.clientOpt == "" {
			o.clientOpt = name
		}
		if err := set(&o.client); err != nil && o.clientErr == nil {
			o.clientErr = fmt.Errorf("%s: %w", name, err)
		}
	}
}

// WithTimeout sets the Client's socket read and write timeout and its dial
// timeout, as memcache.Client.Timeout; 0 means the default,
// memcache.DefaultTimeout (500 ms).
func WithTimeout(d time.Duration) Option {
	return clientOpt("WithTimeout", func(c *clientOptions) error {
		switch {
		case d < 0:
			return fmt.Errorf("want a positive duration, or 0 for the default (%v), got %v", defaultTimeout, d)
		case d == 0:
			d = defaultTimeout
		}
		c.conn.timeout = d
		return nil
	})
}

// WithMaxIdleConns sets the connections the Client keeps to each server; 0
// means the default, 2 (memcache.DefaultMaxIdleConns). Each connection is
// pipelined, carrying many requests at once, so the default serves a
// server's whole load (64 goroutines: BENCHMARKS.md); raise it only if
// large values hold your requests up behind them. Over the classic
// protocol (a server without the meta protocol) it is, as
// memcache.Client.MaxIdleConns, the idle connections kept per server: there,
// set it to your peak of concurrent requests to one server.
func WithMaxIdleConns(n int) Option {
	return clientOpt("WithMaxIdleConns", func(c *clientOptions) error {
		switch {
		case n < 0:
			return fmt.Errorf("want at least 1, or 0 for the default (%d), got %d", defaultMaxIdleConns, n)
		case n == 0:
			n = defaultMaxIdleConns
		}
		c.conn.maxIdle = n
		return nil
	})
}

// WithMaxItemSize bounds the values the Client reads, in bytes: a larger
// value fails its own request, and the connection it came on stays in use.
// 0, the default, means each server's own limit (memcached's -I, its
// item_size_max), read at the first contact; 1 MiB until it is known, or
// if the server does not say. At most 1 GiB, memcached's largest.
func WithMaxItemSize(n int) Option {
	return clientOpt("WithMaxItemSize", func(c *clientOptions) error {
		if n < 0 || n > 1<<30 {
			return fmt.Errorf("want at most 1 GiB (1073741824), or 0 for each server's own limit, got %d", n)
		}
		c.conn.maxItem = n
		return nil
	})
}

// WithDialContext makes the Client connect to memcached with dial, as
// memcache.Client.DialContext: use a tls.Dialer's DialContext for memcached
// with TLS. nil means the default, a net.Dialer's.
func WithDialContext(dial func(ctx context.Context, network, address string) (net.Conn, error)) Option {
	return clientOpt("WithDialContext", func(c *clientOptions) error {
		c.conn.dial = dial
		return nil
	})
}

// Failover is when a Client takes a server out, how it probes it until it
// answers, and what the server's stand-in keeps. A server that is out is
// skipped, for this client only, as if it had been removed: its keys go to
// the next server along the ring, their stand-in. A zero field means its
// default; a negative MaxOut turns failover off.
type Failover struct {
	// Timeouts is how many timeouts in a row take a server out (default
	// 3, as mcrouter's --timeouts-until-tko). A connection refused or not
	// made takes it out at once.
	Timeouts int

	// ProbeFirst is how long after it went out a server is first probed
	// (default 1 s); the probes then back off up to ProbeMax apart
	// (default 30 s).
	ProbeFirst, ProbeMax time.Duration

	// MaxOut is the share of the servers that may be out at once after
	// timeouts, from 0 to 1 (default 0.5), so that a fault of this
	// client's own network, or a machine starved of CPU, cannot move the
	// whole cache: past it, requests go to their servers and return their
	// errors. The last server up is never taken out after timeouts. A
	// server that refuses connections is out whatever the count.
	// Negative: no server is ever taken out, which turns failover off.
	MaxOut float64

	// StandInExpiration is the longest expiration a write sent to a
	// stand-in keeps (default 60 s, as mcrouter's failover_exptime): a
	// longer one, or none, is cut to it, so that what the stand-in holds
	// expires soon after the server is back. At most 30 days.
	StandInExpiration time.Duration
}

// WithFailover sets the Client's failover (see Failover); the zero
// Failover is the default. Each WithFailover sets every field: a zero one
// is its default, not what an earlier WithFailover gave it.
func WithFailover(f Failover) Option {
	return clientOpt("WithFailover", func(c *clientOptions) error {
		f := f
		f.Timeouts = cmp.Or(f.Timeouts, defaultTimeouts)
		f.ProbeFirst = cmp.Or(f.ProbeFirst, defaultProbeFirst)
		f.ProbeMax = cmp.Or(f.ProbeMax, defaultProbeMax)
		f.MaxOut = cmp.Or(f.MaxOut, defaultMaxOut)
		f.StandInExpiration = cmp.Or(f.StandInExpiration, defaultStandInTTL)
		switch {
		case f.Timeouts < 0:
			return fmt.Errorf("Timeouts %d: want 1 or more, or 0 for the default (%d); to turn failover off, set MaxOut to -1", f.Timeouts, defaultTimeouts)
		case f.ProbeFirst < 0 || f.ProbeMax < 0:
			return fmt.Errorf("ProbeFirst %v, ProbeMax %v: want positive durations, or 0 for the defaults (%v, %v)", f.ProbeFirst, f.ProbeMax, defaultProbeFirst, defaultProbeMax)
		case f.ProbeMax < f.ProbeFirst:
			return fmt.Errorf("ProbeFirst %v is after ProbeMax %v: set ProbeMax to ProbeFirst or more (0 means %v)", f.ProbeFirst, f.ProbeMax, defaultProbeMax)
		case f.MaxOut > 1:
			return fmt.Errorf("MaxOut %v: want a share of the servers up to 1, 0 for the default (%v), or -1 to turn failover off", f.MaxOut, defaultMaxOut)
		case f.StandInExpiration < 0 || f.StandInExpiration > maxExpiration:
			return fmt.Errorf("StandInExpiration %v: want up to 30 days, or 0 for the default (%v)", f.StandInExpiration, defaultStandInTTL)
		}
		c.timeoutsUntilDown, c.probeMin, c.probeMax, c.maxDown = f.Timeouts, f.ProbeFirst, f.ProbeMax, f.MaxOut
		c.standInTTL = f.StandInExpiration
		return nil
	})
}

// Handoff is how a Client reads a key that moved to another server from
// the server it was on, for a while, so that a change of servers does not
// empty the cache; a hit there is copied to the key's new server with add.
// A zero field means its default; a negative Window turns handoff off.
type Handoff struct {
	// Window is how long after a key moves the Client reads it from where
	// it was (default 5 minutes). Negative: no handoff.
	Window time.Duration

	// Expiration is the expiration of a value the Client copies from a
	// server without the meta protocol (default 5 minutes, at most 30
	// days), whose classic protocol cannot read a value's own: if your
	// expirations bound how stale a value may be, use your shortest.
	// Negative: none, the copy does not expire. Over the meta protocol a
	// copy keeps the value's remaining expiration.
	Expiration time.Duration
}

// WithHandoff sets the Client's handoff (see Handoff); the zero Handoff is
// the default. Each WithHandoff sets every field: a zero one is its
// default, not what an earlier WithHandoff gave it.
func WithHandoff(h Handoff) Option {
	return clientOpt("WithHandoff", func(c *clientOptions) error {
		if h.Expiration > maxExpiration {
			return fmt.Errorf("Expiration %v: want up to 30 days, 0 for the default (%v), or -1 for none", h.Expiration, defaultHandoffTTL)
		}
		c.handoffWindow = max(cmp.Or(h.Window, defaultHandoffWindow), 0)
		c.handoffTTL = max(cmp.Or(h.Expiration, defaultHandoffTTL), 0)
		return nil
	})
}

// errDiscoveryOption is NewClientFromList's error for an Option of
// discovery, which its ServerList has.
func errDiscoveryOption(name string) error {
	return fmt.Errorf("NewClientFromList: %s is an option of discovery, which the ServerList has already: give it to NewServerList, or give NewClient the Service's address and %s", name, name)
}

var errNilServerList = errors.New("NewClientFromList: nil ServerList: give a ServerList from NewServerList, or one filled with SetServers")
