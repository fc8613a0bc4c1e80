package selector

import (
	"errors"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// This file is the Client's side of Metrics: the helpers that its methods
// call to report, kept apart so that the Client's files each call them in a
// line or two.

// groupMetrics is the Metrics of a pool's groups, whose operations are the
// pool Client's own and reported by it, once: the groups report the rest.
type groupMetrics struct{ Metrics }

func (groupMetrics) Request(RequestEvent) {}

// forGroup returns m for a pool's groups (see groupMetrics); nil stays nil,
// so that a pool without metrics pays nothing either.
func forGroup(m Metrics) Metrics {
	if m == nil {
		return nil
	}
	return groupMetrics{m}
}

// begin returns the start of an operation for metrics, or the zero Time
// without them, so that a Client without metrics reads no clock.
func (c *Client) begin() time.Time {
	if c.cfg.metrics == nil {
		return time.Time{}
	}
	return time.Now()
}

// done reports an operation that began at start and returned *err. It is
// deferred at the top of each public method: `defer c.done(OpGet, c.begin(), &err)`.
func (c *Client) done(op Op, start time.Time, err *error) {
	if c.cfg.metrics != nil { // inlined: without metrics, this is all
		c.report(op, start, *err)
	}
}

func (c *Client) report(op Op, start time.Time, err error) {
	if m := c.cfg.metrics; m != nil {
		ev := RequestEvent{Op: op, Outcome: outcomeOf(err), Duration: time.Since(start)}
		if op == OpGet || op == OpGetAndTouch {
			if ev.Outcome == OutcomeOK {
				ev.Outcome, ev.Hits = OutcomeHit, 1
			} else {
				ev.Misses = 1
			}
		}
		m.Request(ev)
	}
}

// doneMulti is done for GetMulti, which counts the keys it found.
func (c *Client) doneMulti(start time.Time, keys []string, found *map[string]*memcache.Item, err *error) {
	if m := c.cfg.metrics; m != nil {
		ev := RequestEvent{Op: OpGetMulti, Outcome: outcomeOf(*err), Duration: time.Since(start), Hits: len(*found)}
		ev.Misses = max(len(keys)-ev.Hits, 0)
		if ev.Outcome == OutcomeOK {
			ev.Outcome = OutcomeHit
		}
		m.Request(ev)
	}
}

// outcomeOf returns the Outcome of err, an error a Client method returns.
func outcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, memcache.ErrCacheMiss):
		return OutcomeMiss
	case errors.Is(err, memcache.ErrNotStored):
		return OutcomeNotStored
	case errors.Is(err, memcache.ErrCASConflict):
		return OutcomeCASConflict
	case errors.Is(err, memcache.ErrMalformedKey):
		return OutcomeMalformedKey
	case errors.Is(err, ErrNoServers):
		return OutcomeNoServers
	case errors.Is(err, memcache.ErrServerError):
		return OutcomeServerError
	case dialed(err): // appError took off the dialError mark
		return OutcomeUnreachable
	}
	if k := failureKind(failureOf(err)); k != "" {
		return k
	}
	return OutcomeError
}

// dialed reports whether err is the dialer's. It is apart from outcomeOf,
// whose every call would otherwise allocate the target of errors.As.
func dialed(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// failureKind returns the Outcome of a server's failure, or "" if healthy.
func failureKind(f failure) Outcome {
	switch f {
	case unreachable:
		return OutcomeUnreachable
	case timedOut:
		return OutcomeTimeout
	case connectTimeout:
		return OutcomeTimeout
	case broken:
		return OutcomeBroken
	}
	return ""
}

// reportFailure reports a request to s that failed with f, if it did.
func (c *Client) reportFailure(s *server, f failure) {
	if f != healthy && c.cfg.metrics != nil { // inlined: a healthy reply costs this test
		c.serverError(s, f)
	}
}

func (c *Client) serverError(s *server, f failure) {
	c.cfg.metrics.ServerError(ServerErrorEvent{Addr: s.addr.str, Kind: failureKind(f)})
}

// reportHealth reports that s became st, for reason (see HealthEvent), or
// for err's kind of failure when reason is "".
func (c *Client) reportHealth(s *server, st ServerState, reason string, err error) {
	if m := c.cfg.metrics; m != nil {
		if reason == "" {
			reason = string(failureKind(failureOf(err)))
		}
		m.ServerHealth(HealthEvent{Addr: s.addr.str, State: st, Reason: reason})
	}
}

// reportBack reports that s is back (see recover).
func (c *Client) reportBack(s *server, restarted bool) {
	reason := "probe"
	if restarted {
		reason = "restarted"
	}
	c.reportHealth(s, ServerUp, reason, nil)
}

// reportLogged reports keys added to s's invalidations, or that they
// overflowed.
func (c *Client) reportLogged(s *server, keys int, overflowed bool) {
	if m := c.cfg.metrics; m != nil {
		switch {
		case overflowed:
			m.Invalidation(InvalidationEvent{Addr: s.addr.str, Kind: InvalidationOverflowed})
		case keys > 0:
			m.Invalidation(InvalidationEvent{Addr: s.addr.str, Kind: InvalidationLogged, Keys: keys})
		}
	}
}

// reportReplay reports that n logged keys were deleted at s.
func (c *Client) reportReplay(s *server, n int) {
	if m := c.cfg.metrics; m != nil && n > 0 {
		m.Invalidation(InvalidationEvent{Addr: s.addr.str, Kind: InvalidationReplayed, Keys: n})
	}
}

// reportHandoff reports a copy of a key from p to s (see copyTo).
func (c *Client) reportHandoff(p, s *server, cause HandoffCause, r HandoffResult) {
	if m := c.cfg.metrics; m != nil {
		m.Handoff(HandoffEvent{From: p.addr.str, To: s.addr.str, Cause: cause, Result: r})
	}
}
