package selector

import (
	"context"
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

// Begin and End: the pool Client's operation has the span (Begin's
// context), which its groups' steps go to.
func (groupMetrics) Begin(ctx context.Context, _ string) context.Context { return ctx }
func (groupMetrics) End(context.Context, RequestEvent, error)            {}

// forGroup returns m for a pool's groups (see groupMetrics); nil stays nil,
// so that a pool without metrics pays nothing either.
func forGroup(m Metrics) Metrics {
	if m == nil {
		return nil
	}
	return groupMetrics{m}
}

// opStart is an operation begun: what done reports.
type opStart struct {
	op    string
	start time.Time
}

// begin begins op: it returns the context that the operation runs with,
// Metrics.Begin's (a tracer's span), and what done needs; without metrics,
// ctx, and no clock read. Each public method starts
//
//	ctx, st := c.begin(ctx, opNameGet)
//	defer c.done(ctx, st, &opErr)
//
// A closure captures a reassigned ctx by reference, which moves it to the
// heap where the closure escapes: so GetMultiContext, whose goroutines'
// closures do, runs its body in a function of its own (getMulti).
func (c *Client) begin(ctx context.Context, op string) (context.Context, opStart) {
	st := opStart{op: op}
	if c.cfg.metrics != nil { // inlined: without metrics, this is all
		ctx = c.beginOp(ctx, &st)
	}
	return ctx, st
}

func (c *Client) beginOp(ctx context.Context, st *opStart) context.Context {
	ctx = c.cfg.metrics.Begin(ctx, st.op)
	st.start = time.Now()
	return ctx
}

// done reports an operation begun as st, with begin's ctx, that returned
// *err.
func (c *Client) done(ctx context.Context, st opStart, err *error) {
	if c.cfg.metrics != nil { // inlined: without metrics, this is all
		c.report(ctx, st, *err)
	}
}

func (c *Client) report(ctx context.Context, st opStart, err error) {
	ev := RequestEvent{Op: st.op, Outcome: outcomeOf(err), Duration: time.Since(st.start)}
	if st.op == opNameGet || st.op == opNameGetAndTouch {
		if ev.Outcome == OutcomeOK {
			ev.Outcome, ev.Hits = OutcomeHit, 1
		} else {
			ev.Misses = 1
		}
	}
	c.cfg.metrics.End(ctx, ev, err)
}

// doneMulti is done for GetMulti, which counts the keys it found.
func (c *Client) doneMulti(ctx context.Context, st opStart, keys []string, found *map[string]*memcache.Item, err *error) {
	if m := c.cfg.metrics; m != nil {
		ev := RequestEvent{Op: opNameGetMulti, Outcome: outcomeOf(*err), Duration: time.Since(st.start), Hits: len(*found)}
		ev.Misses = max(len(keys)-ev.Hits, 0)
		if ev.Outcome == OutcomeOK {
			ev.Outcome = OutcomeHit
		}
		m.End(ctx, ev, *err)
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
func (c *Client) reportHandoff(p, s *server, cause handoffCause, r handoffResult) {
	if m := c.cfg.metrics; m != nil {
		m.Handoff(HandoffEvent{From: p.addr.str, To: s.addr.str, Cause: string(cause), Result: string(r)})
	}
}

// attempt reports a request of an operation to s (see Client.do), the key
// of hash h's server in rt or its stand-in, that returned err, and is sent
// again if retry.
func (c *Client) attempt(ctx context.Context, rt *routing, h uint64, s *server, err error, retry bool) {
	if c.cfg.metrics != nil { // inlined: without metrics, this is all
		c.stepAttempt(ctx, rt, h, s, err, retry)
	}
}

func (c *Client) stepAttempt(ctx context.Context, rt *routing, h uint64, s *server, err error, retry bool) {
	m := c.cfg.metrics
	if o := rt.baseOwner(h); o != nil && o != s {
		m.Step(ctx, StepEvent{Kind: StepFailover, Addr: s.addr.str, From: o.addr.str})
	}
	ev := StepEvent{Kind: StepRequest, Addr: s.addr.str}
	if retry {
		ev.Kind = StepRetry
	}
	ev.Outcome, ev.Err = stepOutcome(err)
	m.Step(ctx, ev)
}

// stepOutcome returns the Outcome of err, a request's, and the error a
// Client method would return for it.
func stepOutcome(err error) (Outcome, error) {
	o := outcomeOf(err)
	switch o {
	case OutcomeOK, OutcomeMiss, OutcomeNotStored, OutcomeCASConflict:
		return o, err // memcached's answers: appError would allocate its target for nothing
	}
	return o, appError(err)
}

// stepStart returns the start of a GetMulti's request to one server, or
// the zero Time without metrics.
func (c *Client) stepStart() time.Time {
	if c.cfg.metrics == nil {
		return time.Time{}
	}
	return time.Now()
}

// batchDone reports a GetMulti's request of keys keys to s, begun at start,
// that returned err.
func (c *Client) batchDone(ctx context.Context, s *server, keys int, start time.Time, err error) {
	if c.cfg.metrics != nil { // inlined: without metrics, this is all
		c.stepBatch(ctx, s, keys, start, err)
	}
}

func (c *Client) stepBatch(ctx context.Context, s *server, keys int, start time.Time, err error) {
	ev := StepEvent{Kind: StepRequest, Addr: s.addr.str, Keys: keys, Start: start, Duration: time.Since(start)}
	ev.Outcome, ev.Err = stepOutcome(err)
	c.cfg.metrics.Step(ctx, ev)
}

// handedOff reports a key that missed at s and was read at from, its
// server before, and copied (see Client.handoff), with err, the handoff's
// error. A handoff that read no server (from is nil) is not reported.
func (c *Client) handedOff(ctx context.Context, s, from *server, err error) {
	if m := c.cfg.metrics; m != nil && from != nil {
		ev := StepEvent{Kind: StepHandoff, Addr: s.addr.str, From: from.addr.str}
		ev.Outcome, ev.Err = stepOutcome(err)
		m.Step(ctx, ev)
	}
}
