package selector

import (
	"context"
	"time"
)

// This file is the library's metrics interface: what a Client and a
// ServerList report, as values an adapter turns into counters, histograms
// and gauges. The root module depends on no metrics library; adapters for
// OpenTelemetry and Prometheus are the modules extra/selectorotel and
// extra/selectorprometheus of this repository; the first also traces,
// through Begin, Step and End.

// Metrics receives what a Client and a ServerList do. Set it with
// WithMetrics; without it nothing is measured, and nothing is paid: no
// clock is read.
//
// The methods are called synchronously by the goroutine doing the work,
// Begin and End on every Client operation, and some with the Client's or the
// ServerList's lock held: they must be fast, safe for concurrent use, and
// must not call back into the Client or ServerList. Counting into atomics,
// as the adapters' instruments do, is the intended use. The events are
// values and hold nothing that the method may not keep.
//
// Stability: an implementation must embed NopMetrics. Methods are added to
// Metrics only so, with NopMetrics giving them a do-nothing default, and the
// events may gain fields; no other change is made to it before a new major
// version. A type that implements every method itself, without embedding
// NopMetrics, may stop compiling in a minor release.
type Metrics interface {
	// ServerError reports a request to one server that failed for the
	// server's reason (it timed out, could not be reached, broke the
	// connection), whether or not the operation then succeeded elsewhere.
	ServerError(ServerErrorEvent)
	// ServerHealth reports a server going out for a Client, failing but
	// kept in by WithFailover's cap on servers out, and coming back.
	ServerHealth(HealthEvent)
	// Invalidation reports the keys a Client logs for deletion at a server
	// that missed their write, and their replay when it returns.
	Invalidation(InvalidationEvent)
	// Handoff reports a key copied to its new server from where it was
	// (after a change of servers, or back to a server that returned).
	Handoff(HandoffEvent)
	// Ring reports a ServerList's new set of servers.
	Ring(RingEvent)
	// Discovery reports the state of a ServerList's list and watch.
	Discovery(DiscoveryEvent)
	// NotCached reports a value that GetOrLoad loaded and returned but
	// could not cache: its server refused it, as larger than the largest
	// item it stores (memcached's -I), or for want of memory.
	NotCached(NotCachedEvent)

	// Begin, Step and End are what a tracer needs. Begin is called as a
	// Client operation begins, with the context it was given
	// (context.Background() for the forms without one), and the operation
	// runs with the context Begin returns: a tracer starts the
	// operation's span there, a child of the caller's, and the operation's
	// steps, its End, and a GetOrLoad's call of its load get that
	// context. NopMetrics returns ctx.
	Begin(ctx context.Context, op string) context.Context
	// Step reports, with the context of the operation it happened in, a
	// request to a server, a retry, a failover or a handoff (see
	// StepEvent). A GetMulti's requests, one per server, are reported
	// from their goroutines, at once.
	Step(ctx context.Context, e StepEvent)
	// End reports a Client operation (Get, Set, GetMulti, ...) that
	// returned err: once per call, whatever it took inside (failover,
	// handoff, the groups of a pool), with the context Begin returned and
	// e, what a metric counts. Each Begin has one End, on the goroutine
	// that called Begin; the groups of a pool report none of their own
	// (see Pool).
	End(ctx context.Context, e RequestEvent, err error)
}

// NopMetrics implements Metrics with methods that do nothing. Embed it in
// an implementation (see Metrics), so that a method added later has a
// default; override the methods you want.
type NopMetrics struct{}

func (NopMetrics) ServerError(ServerErrorEvent)   {}
func (NopMetrics) ServerHealth(HealthEvent)       {}
func (NopMetrics) Invalidation(InvalidationEvent) {}
func (NopMetrics) Handoff(HandoffEvent)           {}
func (NopMetrics) Ring(RingEvent)                 {}
func (NopMetrics) Discovery(DiscoveryEvent)       {}
func (NopMetrics) NotCached(NotCachedEvent)       {}

func (NopMetrics) Begin(ctx context.Context, _ string) context.Context { return ctx }
func (NopMetrics) Step(context.Context, StepEvent)                     {}
func (NopMetrics) End(context.Context, RequestEvent, error)            {}

// WithMetrics makes a Client, or a ServerList from NewServerList, report
// to m (see Metrics). NewClient's ServerList reports to m too; a Client
// from NewClientFromList reports its own work, and a ServerList filled
// with SetServers reports to the first such Client's m (one from
// NewServerList reports to its own). nil means none, as without the option.
func WithMetrics(m Metrics) Option {
	return func(o *options) { o.metrics, o.client.metrics = m, m }
}

// The Client's operations, as RequestEvent.Op and Metrics.Begin name them:
// in snake case, as metric labels want them. DeleteAll is reported as
// "flush_all", which it is.
const (
	opNameGet            = "get"
	opNameGetAndTouch    = "get_and_touch"
	opNameGetMulti       = "get_multi"
	opNameSet            = "set"
	opNameAdd            = "add"
	opNameReplace        = "replace"
	opNameAppend         = "append"
	opNamePrepend        = "prepend"
	opNameCompareAndSwap = "compare_and_swap"
	opNameDelete         = "delete"
	opNameTouch          = "touch"
	opNameIncrement      = "increment"
	opNameDecrement      = "decrement"
	opNamePing           = "ping"
	opNameFlushAll       = "flush_all"
	opNameGetOrLoad      = "get_or_load"
	opNameInvalidate     = "invalidate"
)

// An Outcome is how an operation, or a request to one server, ended: a
// success (OutcomeOK, or for a read OutcomeHit), an answer of memcached's
// that is not a fault (a miss, not stored, a CAS conflict), or an error of
// some kind.
type Outcome string

const (
	OutcomeOK           Outcome = "ok"            // a write, delete or other operation succeeded
	OutcomeHit          Outcome = "hit"           // a Get or GetAndTouch found the key; a GetMulti returned without error
	OutcomeMiss         Outcome = "miss"          // memcache.ErrCacheMiss
	OutcomeNotStored    Outcome = "not_stored"    // memcache.ErrNotStored: Add of a key present, Replace of one absent
	OutcomeCASConflict  Outcome = "cas_conflict"  // memcache.ErrCASConflict
	OutcomeMalformedKey Outcome = "malformed_key" // memcache.ErrMalformedKey
	OutcomeNoServers    Outcome = "no_servers"    // ErrNoServers
	OutcomeTimeout      Outcome = "timeout"       // no reply in time
	OutcomeUnreachable  Outcome = "unreachable"   // the connection could not be made
	OutcomeBroken       Outcome = "broken"        // the connection broke
	OutcomeServerError  Outcome = "server_error"  // memcached answered with an error
	OutcomeError        Outcome = "error"         // any other error, such as ErrPoolCAS
)

// RequestEvent is a Client operation that returned.
type RequestEvent struct {
	// Op is the operation, in snake case, as metric labels want it: "get",
	// "get_and_touch", "get_multi", "set", "add", "replace", "append",
	// "prepend", "compare_and_swap", "delete", "touch", "increment",
	// "decrement", "ping", "flush_all" (DeleteAll too), "get_or_load" or
	// "invalidate".
	Op       string
	Outcome  Outcome
	Duration time.Duration
	// Hits and Misses are the keys a read found and did not find (or did not
	// read, for an error): 1 and 0, or 0 and 1, for Get and GetAndTouch; any
	// for GetMulti; 0 for the other operations.
	Hits, Misses int
}

// ServerErrorEvent is a request to one server that failed for the server's
// reason.
type ServerErrorEvent struct {
	Addr string  // the server's address, host:port
	Kind Outcome // OutcomeTimeout, OutcomeUnreachable or OutcomeBroken
}

// A ServerState is a server's state for a Client: what a HealthEvent says
// it became, and what ServerStats says it is.
type ServerState string

const (
	ServerOut     ServerState = "out"     // out for this client: its keys go to the next server
	ServerFailing ServerState = "failing" // failing, but kept in: as many servers are out as WithFailover allows
	ServerUp      ServerState = "up"      // in: back in, or no longer failing
	ServerGone    ServerState = "gone"    // left the servers (ServerStats only: it is remembered a while, with its invalidations)
)

// HealthEvent is a change of a server's health for a Client.
type HealthEvent struct {
	Addr  string
	State ServerState
	// Reason is why: for ServerOut and ServerFailing the Outcome of the
	// error ("timeout", "unreachable"), or "replay_failed" (it answered, but
	// deleting its invalidations failed: it stays out); for ServerUp
	// "probe" (it answered a probe, and its invalidations were replayed),
	// "restarted" (it answered, and restarted empty: nothing to replay) or
	// "answered" (a server kept in answered a request).
	Reason string
}

// An InvalidationKind is what an InvalidationEvent reports.
type InvalidationKind string

const (
	InvalidationLogged     InvalidationKind = "logged"     // keys were logged: the server missed their write or delete
	InvalidationOverflowed InvalidationKind = "overflowed" // the log overflowed: the server will be flushed instead
	InvalidationReplayed   InvalidationKind = "replayed"   // the server returned, and its logged keys were deleted there
	InvalidationFlushed    InvalidationKind = "flushed"    // the server returned, and was flushed (its log had overflowed)
)

// InvalidationEvent is a change of a server's invalidation log.
type InvalidationEvent struct {
	Addr string
	Kind InvalidationKind
	Keys int // the keys logged or replayed; 0 for overflowed and flushed
}

// A handoffResult is how a copy of a key to its new server ended: see
// HandoffEvent.Result.
type handoffResult string

const (
	handoffCopied  handoffResult = "copied"
	handoffPresent handoffResult = "present"
	handoffUndone  handoffResult = "undone"
	handoffFailed  handoffResult = "failed"
)

// A handoffCause is why a key was copied: see HandoffEvent.Cause.
type handoffCause string

const (
	handoffRead   handoffCause = "read"
	handoffReplay handoffCause = "replay"
	handoffMove   handoffCause = "move"
)

// HandoffEvent is a key copied from one server to another.
type HandoffEvent struct {
	From, To string
	// Cause is why: "read" (a read missed at the key's new server after a
	// change of servers, and found it where it was), "replay" (a server
	// returned, and a key written while it was out moved back to it) or
	// "move" (a change of servers moved the key's slot, and the Client that
	// moves the slots' keys copied it: see Moves).
	Cause string
	// Result is how the copy ended: "copied" (added at the new server, and
	// deleted where it was), "present" (the new server had the key already;
	// where it was keeps it), "undone" (a write or delete raced with the
	// copy, which was taken back) or "failed" (the new server failed; where
	// it was keeps it).
	Result string
}

// RingEvent is a ServerList's new set of servers.
type RingEvent struct {
	Service string // "namespace/name" for NewServerList, "" for SetServers
	Servers int    // the servers now
	Added   int
	Removed int
	// Lag is how long after Kubernetes saw the change the ServerList
	// published it: from the newest endpoints.kubernetes.io/last-change-trigger-time
	// of the EndpointSlices that changed, as kube-proxy measures its
	// programming latency. 0 where it is not known: SetServers, the lists,
	// slices without the annotation.
	Lag time.Duration
}

// A DiscoveryKind is what a DiscoveryEvent reports.
type DiscoveryKind string

const (
	DiscoverySynced       DiscoveryKind = "synced"        // listed, and watching: HasSynced is true from now on
	DiscoveryRelist       DiscoveryKind = "relist"        // a LIST after the first
	DiscoveryWatchRestart DiscoveryKind = "watch_restart" // a WATCH after the first
	DiscoveryError        DiscoveryKind = "error"         // a LIST or WATCH failed; the servers stay as they were
	DiscoveryRecovered    DiscoveryKind = "recovered"     // the API server answered after an error
)

// DiscoveryEvent is a change of the state of a ServerList's discovery.
type DiscoveryEvent struct {
	Service string // "namespace/name"
	Kind    DiscoveryKind
	Err     error // for DiscoveryError; an *APIError when the API server answered with one
}

// NotCachedEvent is a value that GetOrLoad loaded and its server refused.
type NotCachedEvent struct {
	Addr string // the server's address, host:port
	Size int    // the value's length, in bytes
}

// A StepKind is what a StepEvent reports.
type StepKind string

const (
	StepRequest  StepKind = "request"  // a request to a server returned: the operation's last to it, or one of a GetMulti's
	StepRetry    StepKind = "retry"    // a request to a server failed for the server's reason, and is sent again to its key's server then: the same, or the next
	StepFailover StepKind = "failover" // a request goes to Addr, not to its key's server From, which is out for this client
	StepHandoff  StepKind = "handoff"  // a key missed at Addr, its server, and was read where it was, From, and copied (see HandoffEvent)
)

// StepEvent is something that happened within a Client operation (see
// Metrics.Step): what a tracer records in the operation's span.
type StepEvent struct {
	Kind StepKind
	Addr string // the server, host:port
	From string // for StepFailover, the key's server, out; for StepHandoff, where the key was
	// Keys is the count of keys of a GetMulti's request to Addr, which
	// began at Start and took Duration: a tracer gives it a span of its
	// own. They are zero for the request of an operation on one key,
	// whose time is the operation's.
	Keys     int
	Start    time.Time
	Duration time.Duration
	// Outcome is how the request or handoff ended: a success (OutcomeOK;
	// a handoff then served the value it copied), one of memcached's
	// answers (OutcomeMiss), or the kind of Err; Err is nil for OutcomeOK.
	Outcome Outcome
	Err     error
}
