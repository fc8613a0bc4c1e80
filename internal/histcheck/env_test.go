package histcheck

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// Params are the Client's settings for a run, short so that a run of a few
// seconds sees every mechanism act: outs, probes, returns, the handoff
// window closing.
type Params struct {
	Timeout       time.Duration // WithTimeout; gomemcache's Timeout too
	Timeouts      int           // WithFailover: timeouts until a server is out
	ProbeFirst    time.Duration // WithFailover: the first probe's delay
	ProbeMax      time.Duration
	MaxDown       float64
	HandoffWindow time.Duration // WithHandoff
	HandoffTTL    time.Duration
	Members       int // servers in the ring at the start
	Spares        int // servers running outside it, for ring changes
	// Deadline, if set, is every operation's deadline (the Client's
	// context; gomemcache's Timeout), and puts a stallProxy before each
	// server (see abandon).
	Deadline time.Duration
}

// DefaultParams are the bounded run's.
var DefaultParams = Params{
	Timeout:       100 * time.Millisecond,
	Timeouts:      2,
	ProbeFirst:    300 * time.Millisecond,
	ProbeMax:      time.Second,
	MaxDown:       0.5,
	HandoffWindow: time.Second,
	HandoffTTL:    time.Minute,
	Members:       4,
	Spares:        2,
}

// outage is how long a stop lasts to be noticed: past the timeouts that
// take a server out.
func (p Params) outage() time.Duration { return time.Duration(p.Timeouts+2) * p.Timeout }

// Env is what a schedule acts on: the servers, the ring, and the target
// (for FlushAll). Its random numbers come from the schedule's seed, so a
// seed gives the same steps.
type Env struct {
	Rng     *rand.Rand
	Round   int // the schedule's rounds so far
	Params  Params
	Servers []*Memcached // every process: the first Members in the ring at the start, then the spares
	members []int        // indexes into Servers of the ring's members
	list    *selector.ServerList
	d       *driver
	log     *Log
	st      *opStats
	end     time.Time
	steps   []string

	newTarget   func() (Target, func(), error)
	closeTarget func()
	closeNewer  func() // the client that joined, if one did (see Join)

	control bool              // the target is gomemcache's client
	pool    bool              // the target is a replicated pool, whose groups are not moved between
	still   map[string]string // the keys written once, never touched again, and their values (see WriteStill)
	stillN  int
	counts  []Count
	app     *memcache.Client // another application on the same servers (see sharedServers)
	met     [2]int           // lease sets across a change: the CAS meetings made, and tried (see leaseAcross)
	proxies []*stallProxy    // one a server, with Params.Deadline (see abandon)
}

// addr is the address the clients dial for server i: its proxy's, if it
// has one.
func (e *Env) addr(i int) string {
	if e.proxies != nil {
		return e.proxies[i].Addr()
	}
	return e.Servers[i].Addr
}

// Remaining reports whether the schedule has time left for another round.
func (e *Env) Remaining() bool { return time.Now().Before(e.end) }

// Phase names what happens from now on: operations are counted by the
// phase they began in.
func (e *Env) Phase(name string) { e.d.phase.Store(&name) }

// Sleep waits d.
func (e *Env) Sleep(d time.Duration) { time.Sleep(d) }

// Between returns a random duration in [lo, hi).
func (e *Env) Between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(e.Rng.Int64N(int64(hi-lo)+1))
}

// Step records what the schedule did, for the report.
func (e *Env) Step(format string, args ...any) {
	e.steps = append(e.steps, fmt.Sprintf("%6dms ", e.log.Now().Milliseconds())+fmt.Sprintf(format, args...))
}

// Member returns a random member, other than the ones given.
func (e *Env) Member(not ...int) int {
	for {
		i := e.members[e.Rng.IntN(len(e.members))]
		ok := true
		for _, n := range not {
			ok = ok && i != n
		}
		if ok {
			return i
		}
	}
}

// Spare returns a running server outside the ring.
func (e *Env) Spare() int {
	var out []int
	for i := range e.Servers {
		if !e.isMember(i) {
			out = append(out, i)
		}
	}
	return out[e.Rng.IntN(len(out))]
}

func (e *Env) isMember(i int) bool {
	for _, m := range e.members {
		if m == i {
			return true
		}
	}
	return false
}

// SetMembers changes the ring to the servers given, by index, with
// ServerList.SetServers.
func (e *Env) SetMembers(idx ...int) error {
	addrs := make([]string, len(idx))
	for i, j := range idx {
		addrs[i] = e.addr(j)
	}
	if err := e.list.SetServers(addrs...); err != nil {
		return err
	}
	e.members = append([]int(nil), idx...)
	e.Step("ring %v", idx)
	return nil
}

// Replace puts spare s in member m's place, in one change.
func (e *Env) Replace(m, s int) error {
	var ms []int
	for _, i := range e.members {
		if i != m {
			ms = append(ms, i)
		}
	}
	return e.SetMembers(append(ms, s)...)
}

// Add adds server i to the ring.
func (e *Env) Add(i int) error { return e.SetMembers(append(append([]int(nil), e.members...), i)...) }

// Remove removes server i from the ring.
func (e *Env) Remove(i int) error {
	var ms []int
	for _, m := range e.members {
		if m != i {
			ms = append(ms, m)
		}
	}
	return e.SetMembers(ms...)
}

// Pause runs f with every worker quiesced: no operation in flight, so
// that the client is idle to every server while f runs.
func (e *Env) Pause(f func()) {
	e.d.gate.Lock()
	defer e.d.gate.Unlock()
	f()
}

// Flush calls FlushAll through the target, recorded as a delete of every
// key.
func (e *Env) Flush() {
	phase := *e.d.phase.Load()
	ev := Event{Kind: Flush, Op: "flush", Start: e.log.Now(), Phase: phase}
	err := e.d.t.FlushAll()
	ev.End, ev.OK, ev.Err = e.log.Now(), err == nil, errKind(err)
	e.log.Add(ev)
	e.st.count("flush", phase, err)
	e.Step("FlushAll: %v", err)
}

// Renew replaces the target by a new one of the same kind, with the
// workers quiesced: an application restarted, whose client knows nothing
// of the ring's past. change, if not nil, runs first, while they are: so
// the new client is the first to see the ring it makes.
func (e *Env) Renew(change func() error) error {
	var err error
	e.Pause(func() {
		if change != nil {
			if err = change(); err != nil {
				return
			}
		}
		var t Target
		var closeT func()
		if t, closeT, err = e.newTarget(); err != nil {
			return
		}
		e.closeTarget()
		e.d.t, e.closeTarget = t, closeT
	})
	e.Step("new client: %v", err)
	return err
}

// Applied waits until the target routes by the members: a Client applies
// a change of its ServerList in the background, which takes a while under
// the race detector (0.3 to 2 s for a ring of 5 on 2 cores).
func (e *Env) Applied() { e.applied(false) }

// applied is Applied; with up, it also waits until the target routes to
// each member, which for a member that returns after it left is once the
// member answers and its recovery is done (see Client's failover): until
// then the target writes its keys to stand-ins, as it would before a
// change it has not applied.
func (e *Env) applied(up bool) {
	c, ok := e.d.t.(*selector.Client)
	if !ok {
		return // gomemcache's client reads the list on every request
	}
	want := map[string]bool{}
	for _, m := range e.members {
		want[e.addr(m)] = true
	}
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		n := 0
		for _, s := range c.Stats().Servers {
			if want[s.Addr] != (s.State != "gone") || want[s.Addr] && up && s.State != "up" {
				n = -1
				break
			}
			if want[s.Addr] {
				n++
			}
		}
		if n == len(want) {
			e.Step("the target applied the change in %v", time.Since(start).Round(time.Millisecond))
			return
		}
		e.Sleep(5 * time.Millisecond)
	}
	e.Step("the target did not apply the change in 10s")
}

// Settled waits until the target's members are all up and its moves are
// done (MoveStats.Busy false, no key pending; 60 s at most), so that a
// count of the keys kept measures what the moves kept, not how far they
// got: a member back in the ring is out until it answers, and its keys
// move to it then; keys a round left are tried again seconds later.
func (e *Env) Settled() {
	c, ok := e.d.t.(*selector.Client)
	if !ok {
		return
	}
	start := time.Now()
	for time.Since(start) < 60*time.Second {
		e.Sleep(100 * time.Millisecond)
		st := c.Stats()
		up := true
		for _, s := range st.Servers {
			up = up && (s.State == "up" || s.State == "gone")
		}
		if up && !st.Moves.Busy && st.Moves.Pending == 0 {
			e.Step("the target's moves settled in %v", time.Since(start).Round(time.Millisecond))
			return
		}
	}
	st := c.Stats().Moves
	e.Step("the target's moves did not settle in 60s: busy %v, %d keys pending", st.Busy, st.Pending)
}

// Join makes change, with the workers quiesced, and then starts a second
// client of the target's kind, which never saw the ring before (an
// application pod started after the change): from then on, until Leave,
// it makes the workload's Sets and Deletes, and the target, which saw the
// change, the rest (reads, which hand keys off, and Increments). The
// target applies the change first: until it does, it routes by the ring
// before, and reads there what the new client deleted elsewhere, which no
// client can help (discovery's lag). A member that returns after it left
// is part of the change once the target routes to it (see applied): under
// load its recovery took seconds, while the new client wrote to it at once
// and the target to its stand-in (61 stale reads in a long run).
func (e *Env) Join(change func() error) error {
	var err error
	e.Pause(func() {
		if err = change(); err != nil {
			return
		}
		e.applied(true)
		var t Target
		if t, e.closeNewer, err = e.newTarget(); err == nil {
			e.d.newer = t
		}
	})
	e.Step("new client joined: %v", err)
	return err
}

// Leave closes the client that joined; the target makes every operation
// again.
func (e *Env) Leave() {
	e.Pause(func() { e.d.newer = nil })
	if e.closeNewer != nil {
		e.closeNewer()
		e.closeNewer = nil
	}
	e.Step("new client left")
}

// Delete deletes keys through t, one after another, recorded as the
// workload's deletes are.
func (e *Env) Delete(t Target, keys []string) {
	for _, k := range keys {
		phase := *e.d.phase.Load()
		ev := Event{Kind: Delete, Op: "delete", Key: k, Counter: isCounter(k), Start: e.log.Now(), Phase: phase}
		err := ignoreMiss(t.Delete(k))
		ev.End, ev.OK, ev.Err = e.log.Now(), err == nil, errKind(err)
		e.log.Add(ev)
		e.st.count("delete", phase, err)
	}
	e.Step("deleted %d keys", len(keys))
}

// Count records a count for the report, and for judge.
func (e *Env) Count(name string, good, of int, floor float64) {
	e.counts = append(e.counts, Count{name, good, of, floor})
	e.Step("%v", e.counts[len(e.counts)-1])
}

// shardedFloor is clientFloor for the sharded Client alone: a replicated
// pool's member that returns is a group of its own, not moved to, cold for
// the reads that find it first (without miss failover).
func (e *Env) shardedFloor(floor float64) float64 {
	if e.pool {
		return 0
	}
	return e.clientFloor(floor)
}

// clientFloor is floor for the Client, and nothing for the control, which
// neither fails over nor moves keys: it may lose the keys that change
// server.
func (e *Env) clientFloor(floor float64) float64 {
	if e.control {
		return 0
	}
	return floor
}
