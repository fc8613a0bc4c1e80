package histcheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is what one schedule's run found.
type Report struct {
	Schedule string
	Target   TargetKind
	Seed     uint64 // the schedule's seed (see ScheduleSeed)
	Elapsed  time.Duration
	Ops      map[string]int // by method
	Result   Result
	// Errors are the application's errors, by phase, then "method: kind".
	Errors map[string]map[string]int
	Steps  []string // what the schedule did, when
	// Start is how long the servers and the target took to start; Fill
	// how long writing the keys once took; Close how long the target's
	// Close took at the end (the Client's replays may hold it).
	Start, Fill, Close time.Duration
	// KillPhases are the schedule's phases after a SIGKILL (see
	// Schedule.KillPhases), and KillErrors the application's errors in
	// them, by "method: kind".
	KillPhases []string
	KillErrors map[string]int
	// Loads is how many times the loads read the database (see loads.go).
	Loads int
	// CASMet are the lease sets across a change that met a newer value
	// with the lease's CAS id, and the ones tried (see leaseAcross).
	CASMet [2]int
	// Stalls are the writes the stallProxies held, and Abandoned the
	// writes whose callers' deadlines passed, in a schedule of abandoned
	// writes (see Event.Abandoned).
	Stalls, Abandoned int
	// Counts are the keys the schedule checked at the end (see Env.Count).
	Counts   []Count
	Moves    string // the Client's MoveStats at the end
	getReads int    // Get and GetMulti values asked for
	getHits  int
}

// newReport sums up a run of the schedule name, whose phases after a
// SIGKILL are killPhases (see Schedule.KillPhases).
func newReport(name string, killPhases []string, k TargetKind, seed uint64, elapsed time.Duration, events []Event, res Result, stats []*opStats, steps []string) *Report {
	r := &Report{Schedule: name, Target: k, Seed: seed, Elapsed: elapsed, Ops: map[string]int{},
		Result: res, Errors: map[string]map[string]int{}, Steps: steps, KillPhases: killPhases}
	for _, st := range stats {
		for op, n := range st.ops {
			r.Ops[op] += n
		}
		for ph, kinds := range st.errors {
			if r.Errors[ph] == nil {
				r.Errors[ph] = map[string]int{}
			}
			for kind, n := range kinds {
				r.Errors[ph][kind] += n
			}
		}
	}
	if len(killPhases) > 0 {
		r.KillErrors = map[string]int{}
		for _, ph := range killPhases {
			for kind, n := range r.Errors[ph] {
				r.KillErrors[kind] += n
			}
		}
	}
	for _, e := range events {
		if e.Abandoned {
			r.Abandoned++
		}
		if e.Kind == Read {
			r.getReads++
			if e.Found {
				r.getHits++
			}
		}
	}
	return r
}

// TotalOps is the number of operations (a GetMulti is one).
func (r *Report) TotalOps() int {
	var n int
	for _, v := range r.Ops {
		n += v
	}
	return n
}

// TotalErrors is the number of operations that returned an error.
func (r *Report) TotalErrors() int {
	var n int
	for _, kinds := range r.Errors {
		for _, v := range kinds {
			n += v
		}
	}
	return n
}

// AvoidableKillErrors are the errors after a kill that a client could
// have spared the application (see unavoidable), by "method: kind".
func (r *Report) AvoidableKillErrors() map[string]int {
	m := map[string]int{}
	for kind, n := range r.KillErrors {
		if !unavoidable(kind) {
			m[kind] += n
		}
	}
	return m
}

// unavoidable reports whether an error of kind ("method: kind") may reach
// the application after a kill whatever the client does: an Increment
// whose connection broke may have been applied, so it is not sent again
// (docs/client.md, Retries); and a timeout, which a client does not retry
// by design (the server may be hung), comes from a live server slowed by
// the machine's load (the -race run on 2 cores), not from the kill. Every
// other method of the workload leaves the same state when run twice, and a
// request that could not connect was not sent, so it can go to the key's
// next server.
func unavoidable(kind string) bool {
	op, k, _ := strings.Cut(kind, ": ")
	return k == "timeout" || k == "connect timeout" || op == "incr" && (k == "EOF" || k == "connection reset" || k == "broken pipe")
}

// HitRate is the share of the values Get and GetMulti asked for that they
// found.
func (r *Report) HitRate() float64 {
	if r.getReads == 0 {
		return 0
	}
	return float64(r.getHits) / float64(r.getReads)
}

// Summary is one line: schedule, target, operations, stale reads, errors,
// hit rate, the keys kept of the ones the schedule checked.
func (r *Report) Summary() string {
	var kept string
	if r.KillErrors != nil {
		kept += fmt.Sprintf(" kill-errors=%d/%d", sum(r.AvoidableKillErrors()), sum(r.KillErrors))
	}
	if r.CASMet[1] > 0 {
		kept += fmt.Sprintf(" cas-met=%d/%d", r.CASMet[0], r.CASMet[1])
	}
	for _, c := range r.Counts {
		kept += fmt.Sprintf(" kept=%d/%d", c.Good, c.Of)
	}
	return fmt.Sprintf("%-18s %-21s ops=%-7d stale=%-5d errors=%-5d hit=%5.1f%% unknown=%d%s seed=%d (%.1fs)",
		r.Schedule, r.Target, r.TotalOps(), len(r.Result.Stale), r.TotalErrors(), 100*r.HitRate(),
		r.Result.Unknown, kept, r.Seed, r.Elapsed.Seconds())
}

// String is the full report: the summary, operations by method, errors by
// phase and kind, the first stale reads with the writes that prove them,
// and the schedule's steps.
func (r *Report) String() string {
	var b strings.Builder
	b.WriteString(r.Summary() + "\n")
	fmt.Fprintf(&b, "  start %v, fill %v, close %v\n", r.Start.Round(time.Millisecond), r.Fill.Round(time.Millisecond), r.Close.Round(time.Millisecond))
	b.WriteString("  ops:")
	for _, op := range slices.Sorted(maps.Keys(r.Ops)) {
		fmt.Fprintf(&b, " %s=%d", op, r.Ops[op])
	}
	b.WriteString("\n")
	for _, ph := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(&b, "  errors in %s:", ph)
		for _, k := range slices.Sorted(maps.Keys(r.Errors[ph])) {
			fmt.Fprintf(&b, " [%s]=%d", k, r.Errors[ph][k])
		}
		b.WriteString("\n")
	}
	if r.KillErrors != nil {
		fmt.Fprintf(&b, "  errors after the kills (phases %s): %d, of which a client could spare %d:", strings.Join(r.KillPhases, ", "),
			sum(r.KillErrors), sum(r.AvoidableKillErrors()))
		for _, k := range slices.Sorted(maps.Keys(r.KillErrors)) {
			fmt.Fprintf(&b, " [%s]=%d", k, r.KillErrors[k])
		}
		b.WriteString("\n")
	}
	if r.Stalls > 0 {
		fmt.Fprintf(&b, "  writes stalled: %d; writes abandoned by their callers: %d\n", r.Stalls, r.Abandoned)
	}
	if r.Loads > 0 {
		fmt.Fprintf(&b, "  database reads by the loads: %d\n", r.Loads)
	}
	if n := len(r.Result.Stale); n > 0 {
		byPhase := map[string]int{}
		for _, s := range r.Result.Stale {
			byPhase[s.Read.Phase]++
		}
		fmt.Fprintf(&b, "  stale reads by phase: %v\n", byPhase)
		for _, s := range r.Result.Stale[:min(n, 5)] {
			b.WriteString(FormatStale(s))
		}
	}
	for _, c := range r.Counts {
		b.WriteString("  kept " + c.String() + "\n")
	}
	if r.Moves != "" {
		b.WriteString("  moves " + r.Moves + "\n")
	}
	for _, s := range r.Steps {
		b.WriteString("  step " + s + "\n")
	}
	return b.String()
}

// FormatStale describes a stale read and its proof.
func FormatStale(s StaleRead) string {
	ev := func(e Event) string {
		v := e.Value
		if e.Kind == Delete || e.Kind == Flush {
			v = "-"
		}
		return fmt.Sprintf("%s %s=%s [%s, %s] (%s)", e.Op, e.Key, v, ms3(e.Start), ms3(e.End), e.Phase)
	}
	return fmt.Sprintf("  STALE (%s rule) %s\n    w1: %s\n    w2: %s\n", s.Rule, ev(s.Read), ev(s.W1), ev(s.W2))
}

func ms3(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d.Microseconds())/1000) }

func sum(m map[string]int) int {
	var n int
	for _, v := range m {
		n += v
	}
	return n
}

// Count is how many of a set of keys that a schedule checked at the end
// were as it wants them.
type Count struct {
	Name     string
	Good, Of int
	Floor    float64 // the share of Of below which the run fails; 0 asserts nothing
}

func (c Count) String() string {
	s := fmt.Sprintf("%s: %d of %d (%.1f%%)", c.Name, c.Good, c.Of, 100*float64(c.Good)/float64(max(c.Of, 1)))
	if c.Floor > 0 {
		s += fmt.Sprintf(", floor %.1f%%", 100*c.Floor)
	}
	return s
}

// Failed reports whether the count is below its floor.
func (c Count) Failed() bool { return float64(c.Good) < c.Floor*float64(c.Of) }
