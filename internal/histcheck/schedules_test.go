package histcheck

import (
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Schedule is a kind of fault, repeated in rounds at random (from the
// run's seed) until the run's time is up. Each names its phases, so that
// errors are counted where they happen.
type Schedule struct {
	Name string
	// Control says whether gomemcache's client, which neither fails over
	// nor hands keys off, is expected to serve stale reads here (see
	// TestHistory): where a ring change sends keys back to a server that
	// holds values older than those written elsewhere meanwhile. A stop or
	// a kill cannot show it: gomemcache sends every key to its one server
	// throughout, so a write it could not make there failed (and a failed
	// write proves nothing), and a restarted server is empty.
	Control bool
	// Known, if set, says why the Client is expected to serve stale reads
	// in this schedule, where the consistency contract says it cannot know
	// better (docs/consistency.md), and what closes the gap: its stale
	// reads are reported, not failed.
	Known string
	// Loads adds the loads to the workload (see loads.go).
	Loads bool
	// KillPhases are the phases that follow a SIGKILL, whose errors the
	// report states apart and TestHistory judges: a Client must not let
	// one reach the application, but for what it cannot send twice (see
	// unavoidable).
	KillPhases []string
	// Moves is the Client's WithMoves, if not the zero value.
	Moves selector.Moves
	// Params, if set, changes the run's Params for this schedule.
	Params func(*Params)
	Round  func(e *Env) error
}

// Schedules are the fault kinds, one a subtest.
var Schedules = []Schedule{
	{Name: "none", Round: none},
	{Name: "stop", Round: stop},
	{Name: "kill-fast", KillPhases: killPhases, Round: killFast},
	{Name: "kill-slow", KillPhases: killPhases, Round: killSlow},
	{Name: "unnoticed-restart", Round: unnoticedRestart},
	{Name: "two-out", Round: twoOut},
	{Name: "ring-add-remove", Control: true, Round: addRemove},
	{Name: "ring-remove-add", Control: true, Round: removeAdd},
	{Name: "ring-replace", Control: true, Round: replace},
	{Name: "move-back", Control: true, Round: moveBack},
	{Name: "moves", Control: true, Round: moves},
	{Name: "unseen-change", Control: true, Round: unseenChange},
	{Name: "unseen-change-out", Control: true, Round: unseenChangeOut},
	{Name: "flush", Round: flush},
	{Name: "flush-departed", Control: true, Round: flushDeparted},
	{Name: "new-client", Control: true, Params: movesParams, Round: newClient},
	{Name: "flap-twice", Control: true, Params: movesParams, Round: flapTwice},
	{Name: "shared-servers", Control: true, Params: movesParams, Round: sharedServers},
	{Name: "shared-prefix", Control: true, Params: movesParams, Moves: selector.Moves{Prefix: keyPrefix}, Round: sharedServers},
	{Name: "absolute-exp", Control: true, Params: movesParams, Round: absoluteExpirations},
	{Name: "loads", Control: true, Loads: true, Round: loads},
	{Name: "loads-change", Control: true, Loads: true, Round: loadsChange},
	{Name: "loads-failover", Control: true, Loads: true, Round: loadsFailover},
	{Name: "abandon", Control: true, Params: abandonParams, Round: abandon},
}

// killPhases are a kill round's phases: from the SIGKILL to the restart,
// and the recovery after it (the phase "steady" between rounds lasts no
// time).
var killPhases = []string{"killed", "recovery"}

// settle lets the client settle between faults: probes, returns, replays.
func settle(e *Env) {
	e.Phase("recovery")
	e.Sleep(e.Between(400*time.Millisecond, 900*time.Millisecond))
	e.Phase("steady")
}

// none is no fault: the baseline, for hit rate and throughput.
func none(e *Env) error {
	e.Phase("steady")
	e.Sleep(500 * time.Millisecond)
	return nil
}

// stop SIGSTOPs a member past the timeouts that take it out, then
// SIGCONTs it: it returns with its values, and what was written to its
// stand-in meanwhile must not be shadowed by them.
func stop(e *Env) error {
	i := e.Member()
	e.Phase("stopped")
	e.Servers[i].Stop()
	e.Step("SIGSTOP %d", i)
	e.Sleep(e.Between(e.Params.outage(), 3*e.Params.outage()))
	e.Servers[i].Cont()
	e.Step("SIGCONT %d", i)
	settle(e)
	return nil
}

// killFast SIGKILLs a member and restarts it on its port, empty, inside
// the first probe's delay.
func killFast(e *Env) error {
	return kill(e, 10*time.Millisecond, e.Params.ProbeFirst/2)
}

// killSlow restarts it after several probes failed.
func killSlow(e *Env) error {
	return kill(e, 2*e.Params.ProbeFirst, 3*e.Params.ProbeMax)
}

func kill(e *Env, lo, hi time.Duration) error {
	i := e.Member()
	e.Phase("killed")
	e.Servers[i].Kill()
	e.Step("SIGKILL %d", i)
	e.Sleep(e.Between(lo, hi))
	if err := e.Servers[i].Start(); err != nil {
		return err
	}
	e.Step("restarted %d", i)
	settle(e)
	return nil
}

// unnoticedRestart restarts a member while the client is idle to it (the
// workers paused), so that the client may take the broken connections it
// then finds for a passing fault rather than a restart; an outage of the
// same server follows, which the client must not take for a restart.
func unnoticedRestart(e *Env) error {
	i := e.Member()
	e.Phase("idle-restart")
	var err error
	e.Pause(func() {
		e.Sleep(20 * time.Millisecond) // the last replies are read
		err = e.Servers[i].Restart()
	})
	if err != nil {
		return err
	}
	e.Step("restarted %d while idle", i)
	e.Phase("after-restart")
	e.Sleep(e.Between(200*time.Millisecond, 500*time.Millisecond))
	e.Phase("stopped")
	e.Servers[i].Stop()
	e.Step("SIGSTOP %d", i)
	e.Sleep(e.Between(e.Params.outage(), 3*e.Params.outage()))
	e.Servers[i].Cont()
	e.Step("SIGCONT %d", i)
	settle(e)
	return nil
}

// twoOut takes two members out at once: stopped or killed and restarted.
func twoOut(e *Env) error {
	a := e.Member()
	b := e.Member(a)
	e.Phase("two-out")
	kills := e.Rng.IntN(2) == 0
	for _, i := range []int{a, b} {
		if kills {
			e.Servers[i].Kill()
		} else {
			e.Servers[i].Stop()
		}
	}
	e.Step("out %d and %d (kill %v)", a, b, kills)
	e.Sleep(e.Between(e.Params.outage(), 3*e.Params.outage()))
	for _, i := range []int{b, a} {
		if kills {
			if err := e.Servers[i].Start(); err != nil {
				return err
			}
		} else {
			e.Servers[i].Cont()
		}
		e.Sleep(e.Between(0, e.Params.ProbeFirst))
	}
	e.Step("back %d and %d", a, b)
	settle(e)
	return nil
}

// inWindow is a wait shorter than the handoff window; pastWindow longer.
func inWindow(e *Env) time.Duration {
	return e.Between(e.Params.HandoffWindow/4, e.Params.HandoffWindow*3/4)
}

func pastWindow(e *Env) time.Duration {
	return e.Between(e.Params.HandoffWindow*3/2, e.Params.HandoffWindow*2)
}

// inOrPastWindow is either, at random.
func inOrPastWindow(e *Env) time.Duration {
	if e.Rng.IntN(2) == 0 {
		return inWindow(e)
	}
	return pastWindow(e)
}

// A ringStep is a phase of a ring schedule's round: what starts it (a
// change of the ring, mostly) and, if set, how long it then lasts. The
// wait is drawn after do, as do may draw from e.Rng too.
type ringStep struct {
	phase string
	do    func() error
	wait  func(*Env) time.Duration
}

// ringRound runs the steps in turn, up to the first that fails, and lets
// the client settle: the round of the schedules that change the ring and
// change it back.
func ringRound(e *Env, steps ...ringStep) error {
	for _, st := range steps {
		e.Phase(st.phase)
		if err := st.do(); err != nil {
			return err
		}
		if st.wait != nil {
			e.Sleep(st.wait(e))
		}
	}
	settle(e)
	return nil
}

// add and remove are ringSteps' changes: server i added to, or removed
// from, the ring.
func add(e *Env, i int) func() error    { return func() error { return e.Add(i) } }
func remove(e *Env, i int) func() error { return func() error { return e.Remove(i) } }

// inTurn does fs in turn, up to the first that fails.
func inTurn(fs ...func() error) func() error {
	return func() error {
		for _, f := range fs {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}

// addRemove adds a spare and removes it within the handoff window: the
// keys it took go back to where they were, which still holds their older
// values.
func addRemove(e *Env) error {
	s := e.Spare()
	return ringRound(e, ringStep{"added", add(e, s), inWindow}, ringStep{"removed", remove(e, s), nil})
}

// removeAdd removes a member and adds it back within the window: it
// returns with the values written before it left.
func removeAdd(e *Env) error {
	m := e.Member()
	return ringRound(e, ringStep{"removed", remove(e, m), inWindow}, ringStep{"returned", add(e, m), nil})
}

// replace replaces a member by a spare, and after a while, within or past
// the window, the spare by the member again: two changes each way (a
// removal, then an addition), not one as Env.Replace makes.
func replace(e *Env) error {
	m, s := e.Member(), e.Spare()
	return ringRound(e,
		ringStep{"replaced", inTurn(remove(e, m), add(e, s)), inOrPastWindow},
		ringStep{"replaced-back", inTurn(remove(e, s), add(e, m)), nil})
}

// moveBack adds a spare and removes it after the handoff window (issue
// 17, item 6): the keys move back to their former owners, which still hold
// the values they had before the spare took them, for the cold keys
// written only after the window closed; and the spare, when it is added
// again, holds the values of its last time in the ring. The client sees
// every change (one started after the first sees the next: TestMoveBack;
// one started after a move back, unseenChange).
func moveBack(e *Env) error {
	s := e.Spare()
	return ringRound(e, ringStep{"added", add(e, s), pastWindow}, ringStep{"moved-back", remove(e, s), nil})
}

// moves adds a spare and removes it after the Client's key moves ran
// each way (see selector.Moves), while the workload writes and deletes the
// keys being moved: a move must never land over a newer value, nor bring
// a deleted one back.
func moves(e *Env) error {
	s := e.Spare()
	return ringRound(e, ringStep{"added", add(e, s), movesRun}, ringStep{"removed", remove(e, s), movesRun})
}

// unseenChange moves keys back to a server that holds older values of
// them, and then starts a client, which never saw the keys leave: in one
// round a member is removed and, after the handoff window, while its keys
// were written elsewhere, added back with the values it had when it left
// (a pod that was NotReady for a while and is Ready again); in the other a
// spare is added and removed after the window (a scale-up, then a
// scale-down). The Client that saw the change serves none of the old
// values (its gains); the new one none either: the servers' records of the
// slots they lost tell it which are old (see the root package's lostKey).
func unseenChange(e *Env) error {
	m := e.Member()
	leave := ringStep{"removed", remove(e, m), pastWindow}
	back := add(e, m)
	if e.Round%2 != 0 {
		s := e.Spare()
		leave = ringStep{"added", add(e, s), pastWindow}
		back = remove(e, s)
	}
	renew := func() error { return e.Renew(nil) }
	return ringRound(e, leave, ringStep{"moved-back", inTurn(back, renew), nil})
}

// unseenChangeOut is unseenChange with the member hung (SIGSTOP) as it
// leaves, until the Client took it out: the Client cannot write the
// member's record of the slots it loses then, owes them, and writes them
// once the member answers again (see the root package's serverLosses).
// The member returns after the handoff window with the values it had, and
// a new Client starts, which must serve none of them.
func unseenChangeOut(e *Env) error {
	m := e.Member()
	e.Phase("stopped")
	e.Servers[m].Stop()
	e.Step("SIGSTOP %d", m)
	e.waitOut(m)
	e.Phase("removed")
	if err := e.Remove(m); err != nil {
		return err
	}
	e.Sleep(e.Params.outage())
	e.Servers[m].Cont()
	e.Step("SIGCONT %d", m)
	e.Sleep(pastWindow(e))
	e.Phase("moved-back")
	if err := e.Add(m); err != nil {
		return err
	}
	if err := e.Renew(nil); err != nil {
		return err
	}
	settle(e)
	return nil
}

// flush calls FlushAll with every member up, or with one stopped (it is to
// be flushed when it returns).
func flush(e *Env) error {
	e.Phase("flush")
	if e.Rng.IntN(2) == 0 {
		e.Flush()
		settle(e)
		return nil
	}
	i := e.Member()
	e.Phase("stopped-flush")
	e.Servers[i].Stop()
	e.Step("SIGSTOP %d", i)
	e.Sleep(e.Params.outage())
	e.Flush()
	e.Sleep(e.Between(0, e.Params.outage()))
	e.Servers[i].Cont()
	e.Step("SIGCONT %d", i)
	settle(e)
	return nil
}

// flushDeparted removes a member, calls FlushAll while the member's keys
// are handed off from it, and adds it back (issue 17, item 7): a flush
// reaches only the current members.
func flushDeparted(e *Env) error {
	m := e.Member()
	handingOff := func(e *Env) time.Duration { return e.Between(50*time.Millisecond, e.Params.HandoffWindow/4) }
	flush := func() error { e.Flush(); return nil }
	return ringRound(e,
		ringStep{"removed", remove(e, m), handingOff},
		ringStep{"flushed", flush, inWindow},
		ringStep{"returned", add(e, m), nil})
}

// abandonParams give every operation a deadline shorter than abandon's
// stalls, and the Client a timeout longer than them: a request that times
// out closes its connection, and the Client does not promise when what it
// had sent there lands (see meta.Pool), whereas one whose caller left it
// keeps its key pinned to the connection.
func abandonParams(p *Params) {
	p.Deadline = 100 * time.Millisecond
	p.Timeout = 3 * time.Second
}

// abandon stalls connections to the members for longer than the
// operations' deadline, each at the next write it carries: the writes on
// them are abandoned by their callers, who write their keys again
// meanwhile, and land when the stall ends. The Client must run its later
// writes of those keys after them; gomemcache's client, whose Timeout
// closes the connection, sends them on another, and the abandoned value
// lands over them.
func abandon(e *Env) error {
	d := e.Between(3*e.Params.Deadline, 8*e.Params.Deadline)
	n := 2 + e.Rng.IntN(3)
	e.Phase("stalled")
	for _, i := range e.members {
		e.proxies[i].Stall(d, n)
	}
	e.Step("stall the next write on %d connections to each member for %v", n, d)
	e.Sleep(d + e.Between(100*time.Millisecond, 300*time.Millisecond))
	e.Phase("steady")
	return nil
}
