// Package histcheck is a randomized history checker for the Client's
// consistency promise: no read returns a value older than one this client
// was told to write or delete.
//
// A run drives many goroutines over a small hot key space through a
// Target (the Client, or gomemcache's own client as the control) while a
// fault schedule, drawn at random from a seed, stops, kills, restarts and
// flushes real memcached processes on loopback and changes the ring. Every
// operation is recorded with its start and end (monotonic), result and
// error; Check then finds the stale reads in the history.
//
// # The rule
//
// A read is stale if it returns the value of a write w1 when another write
// or delete w2 of the same key began after w1 ended and was acknowledged
// before the read began. A miss is always allowed. A write that failed is
// unacknowledged: it may or may not have taken effect (a Set that timed out
// against a stopped server lands when the server resumes), so it never
// serves as w2, and as w1 its end is unknown: a read of its value is never
// flagged. An acknowledged FlushAll is a delete of every key.
//
// # Counters
//
// Counter keys have their own key space. A Set of a counter writes a base
// unique to that Set, j<<32 for the Set's write id j (its lineage), and
// Increments add 1, so every number names its lineage j and its offset n.
// A number is produced by the Set of its lineage (n = 0) or by the
// acknowledged Increments that returned it; an Increment that failed
// returned nothing, and in a linearizable store each number of a lineage is
// produced once, so the numbers it may have produced are the ones no
// acknowledged operation returned. A returned Increment reads the number
// before its own (x-1) at its start; a Get or GetMulti reads what it
// returns. A read of x in lineage j is stale if
//
//   - (producer rule) x's producers all succeeded, and an acknowledged write
//     w2 of the key began after the last of them ended and ended before the
//     read began, where w2 is a Set, a Delete or a FlushAll, an Increment of
//     another lineage, or an Increment of lineage j that returned more than
//     x (the count had passed x); an Increment of lineage j that returned x
//     or less does not count, as the count may legitimately climb to x
//     again after it; or
//   - (lineage rule) the Set of lineage j succeeded, and an acknowledged
//     write w2 of another lineage (a Set, Delete, FlushAll, or an Increment
//     that returned a number of another lineage) began after that Set ended
//     and ended before the read began: every number of lineage j was
//     replaced by w2, whichever increment produced it.
//
// The lineage rule is stricter than the register rule, and sound: an
// Increment that returned a number of lineage j ran on lineage j, so in any
// order of the operations that the store could have followed it comes
// before a write w2 that replaced the lineage (after w2 it would have
// returned another lineage's number, or missed), whether or not it
// overlapped w2 in time; a Set, which reads nothing, may instead be ordered
// after a w2 it overlaps, which is why the register rule needs w1 to end
// before w2 begins. It catches a counter copied to a replica after a newer
// Set or Delete reached it.
//
// An Increment that found no value (ErrCacheMiss) is a miss: neither a read
// nor a write. A Delete that found no value (ErrCacheMiss) is acknowledged.
//
// # Loads
//
// The schedules with loads add an application's cache-aside over a
// database, in a key space of their own: writers update a row and then
// Set, invalidate or Delete its key; readers call GetOrLoad (the control:
// Get, and on a miss load and Set). A writer's update and cache write are
// one Write of the new value, and a GetOrLoad is a Read of what it
// returned, so the rule above applies unchanged: a GetOrLoad must not
// return a value older than a write acknowledged before it began (a load
// in flight that it joined may have read the row before that write), and a
// load's set must not land over a newer write (a stale set, read later).
// loads.go says why this is sound; leaseAcross makes the servers' CAS
// counters meet, so that a lease's set sent to a server that did not issue
// it lands.
//
// # Abandoned writes
//
// The schedule abandon gives every operation a deadline (Params.Deadline)
// shorter than the stalls it makes on some connections (stallProxy): a
// write there is abandoned by its caller, who writes the key again, and
// lands when the stall ends. The Client promises that such a write lands,
// if at all, before the key's next write or delete by the same client,
// as it pins the key to the request's connection (meta.Pool); so the
// rule takes an abandoned write's end as an acknowledged write's
// (Event.Abandoned), though never as the newer write w2. The control,
// whose Timeout plays the deadline, sends the next write on another
// connection, and the abandoned value lands over it.
//
// # Errors after a kill
//
// The kill schedules name the phases after a SIGKILL (Schedule.KillPhases):
// the report states their errors, and TestHistory fails the Client on any
// but an Increment's on a broken connection, which may have been applied
// and so is not sent again. The bar is 0, as e2e's TestClientKill has it.
//
// # Pools
//
// Over a ServerList filled by SetServers, the pools the public API allows
// are Sharded and Replicated (a group per server). ByZone needs the zones
// that discovery reads from EndpointSlices, and SetServers gives none: over
// a static list a ByZone pool has one group, "", which exercises the pool's
// code over one sharded ring rather than a zone split (the
// client-byzone-static target, not in the bounded run). A zone split needs
// NewClient against an API server (e2e's TestPoolZones).
//
// # Layout
//
// No internal package imports the root, and this one's library does not:
// its non-test files are what stands alone (the history and its recorder,
// Check, the Report, the memcached processes, the workload and the loads,
// which drive a Target). What builds and drives the root's Client is the
// package's tests, in the same package: the runner (Run, newTarget), the
// Env that schedules use, the Schedules, the stale-set runs, the stall
// proxy and the Client's adapter to Loader (client_test.go). So go test
// ./internal/histcheck/ runs them all as before.
//
// # Following a stale read
//
// A failure prints the run's seed (-histcheck.seed reruns its schedules)
// and each stale read with its two writes. -histcheck.trace DIR writes, for
// each Client a run builds, every operation with the servers it went to
// (its failover, request, retry and handoff steps, from the Client's
// Metrics), and each copy and health change with its time: grep the file
// for the key to see where the stale value came from. -histcheck.log adds
// the Clients' log at debug level.
package histcheck
