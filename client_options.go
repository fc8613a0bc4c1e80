package selector

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// clientOptions are the Client's settings: gomemcache's knobs, failover and
// handoff. NewServerList refuses them (see options.clientOnly).
type clientOptions struct {
	conn              connConfig
	timeoutsUntilDown int
	probeMin          time.Duration // the first probe's delay
	probeMax          time.Duration
	maxDown           float64       // the share of the servers that may be down at once
	handoffWindow     time.Duration // how long a key that moved is read from where it was
	handoffTTL        time.Duration // the expiration of a value copied by a handoff
	maxPast           int           // past rings kept for handoff
	maxInvalidations  int           // keys a server's invalidation log holds
	maxLogged         int           // keys all the servers' logs hold
	departedKeep      time.Duration // how long a server that left is remembered
	pool              Pool
	metrics           Metrics // see WithMetrics; nil for none
}

func defaultClientOptions() clientOptions {
	return clientOptions{
		conn:              connConfig{timeout: memcache.DefaultTimeout, maxIdle: memcache.DefaultMaxIdleConns},
		timeoutsUntilDown: 3,
		probeMin:          time.Second,
		probeMax:          30 * time.Second,
		maxDown:           0.5,
		handoffWindow:     5 * time.Minute,
		handoffTTL:        5 * time.Minute,
		maxPast:           4,
		maxInvalidations:  10000,
		maxLogged:         100000,
		departedKeep:      time.Hour,
	}
}

// clientOption returns an Option that only NewClient takes.
func clientOption(name string, f func(*clientOptions) error) Option {
	return func(o *options) {
		if o.clientOnly == "" {
			o.clientOnly = name
		}
		if err := f(&o.client); err != nil && o.clientErr == nil {
			o.clientErr = fmt.Errorf("%s: %w", name, err)
		}
	}
}

// WithTimeout sets the Client's socket read and write timeout and its dial
// timeout, as memcache.Client.Timeout (default memcache.DefaultTimeout,
// 500 ms). A Client option.
func WithTimeout(d time.Duration) Option {
	return clientOption("WithTimeout", func(c *clientOptions) error {
		if d <= 0 {
			return fmt.Errorf("want a positive duration, got %v", d)
		}
		c.conn.timeout = d
		return nil
	})
}

// WithMaxIdleConns sets the idle connections the Client keeps per server,
// as memcache.Client.MaxIdleConns (default 2): set it above your peak of
// concurrent requests to one server. A Client option.
func WithMaxIdleConns(n int) Option {
	return clientOption("WithMaxIdleConns", func(c *clientOptions) error {
		if n < 1 {
			return fmt.Errorf("want at least 1, got %d", n)
		}
		c.conn.maxIdle = n
		return nil
	})
}

// WithDialContext makes the Client connect to memcached with dial, as
// memcache.Client.DialContext: use a tls.Dialer's DialContext for memcached
// with TLS. A Client option.
func WithDialContext(dial func(ctx context.Context, network, address string) (net.Conn, error)) Option {
	return clientOption("WithDialContext", func(c *clientOptions) error {
		if dial == nil {
			return fmt.Errorf("nil dial function")
		}
		c.conn.dial = dial
		return nil
	})
}

// WithFailover sets when the Client takes a server out and how it probes
// it: after timeouts consecutive timeouts (default 3, as mcrouter's
// --timeouts-until-tko; a connection refused or not made takes it out at
// once), with probes from first up to most apart (default 1 s to 30 s),
// and with at most maxDown of the servers out at once (default 0.5). A
// Client option.
func WithFailover(timeouts int, first, most time.Duration, maxDown float64) Option {
	return clientOption("WithFailover", func(c *clientOptions) error {
		switch {
		case timeouts < 1:
			return fmt.Errorf("want at least 1 timeout, got %d", timeouts)
		case first <= 0 || most < first:
			return fmt.Errorf("want 0 < first <= most, got %v and %v", first, most)
		case maxDown < 0 || maxDown > 1:
			return fmt.Errorf("want a share of the servers from 0 to 1, got %v", maxDown)
		}
		c.timeoutsUntilDown, c.probeMin, c.probeMax, c.maxDown = timeouts, first, most, maxDown
		return nil
	})
}

// WithHandoff sets how long after a key moves the Client reads it from
// where it was (default 5 minutes), and the expiration it gives a value it
// copies from there (default 5 minutes; 0 for none). A copy cannot keep
// the value's own expiration, which gomemcache does not read: if your
// expirations bound how stale a value may be, use your shortest. A Client
// option.
func WithHandoff(window, expiration time.Duration) Option {
	return clientOption("WithHandoff", func(c *clientOptions) error {
		switch {
		case window < 0:
			return fmt.Errorf("want a window of 0 (off) or more, got %v", window)
		case expiration < 0 || expiration > 30*24*time.Hour:
			return fmt.Errorf("want an expiration from 0 to 30 days, got %v", expiration)
		}
		c.handoffWindow, c.handoffTTL = window, expiration
		return nil
	})
}
