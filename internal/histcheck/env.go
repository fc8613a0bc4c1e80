package histcheck

import (
	"fmt"
	"math/rand/v2"
	"time"

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
		addrs[i] = e.Servers[j].Addr
	}
	if err := e.list.SetServers(addrs...); err != nil {
		return err
	}
	e.members = append([]int(nil), idx...)
	e.Step("ring %v", idx)
	return nil
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
