package histcheck

import (
	"fmt"
	"sync"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// The schedules of the loads (issue 27, items 2 and 7; see loads.go):
// GetOrLoad with writers, with no fault, across changes of the ring, and
// across a failover.

// loads is the loads with no fault: a GetOrLoad that starts after the
// caller's own write of a key must not join a load of it in flight from
// before the write (item 2), and no load may set its value over a newer
// write; the control's cache-aside does.
func loads(e *Env) error {
	e.Phase("steady")
	e.Sleep(500 * time.Millisecond)
	return nil
}

// loadsChange changes the ring during loads, at random a spare added, a
// member removed or a member replaced by a spare (at random rather than by
// turns: the bounded run has time for one round), and undoes the change
// within the handoff window; during each change a GetOrLoad holds a lease
// at the server a key leaves (see leaseAcross).
func loadsChange(e *Env) error {
	before := e.members
	var phase string
	var after []int
	switch e.Rng.IntN(3) {
	case 0:
		phase, after = "added", append(append([]int(nil), before...), e.Spare())
	case 1:
		phase, after = "removed", without(before, e.Member())
	default:
		phase, after = "replaced", append(without(before, e.Member()), e.Spare())
	}
	change := func() error {
		if err := e.SetMembers(after...); err != nil {
			return err
		}
		e.Applied()
		return nil
	}
	return ringRound(e,
		ringStep{phase, func() error { return leaseAcross(e, before, after, change) }, inWindow},
		ringStep{"undone", func() error { return e.SetMembers(before...) }, nil})
}

// loadsFailover stops or kills a member during loads, long enough for the
// Client to take it out, and brings it back (restarted empty, if killed);
// meanwhile a GetOrLoad holds a lease at it (see leaseAcross).
func loadsFailover(e *Env) error {
	m := e.Member()
	kill := e.Rng.IntN(2) == 0
	e.Phase("out")
	out := func() error {
		if kill {
			e.Servers[m].Kill()
		} else {
			e.Servers[m].Stop()
		}
		e.Step("out %d (kill %v)", m, kill)
		e.waitOut(m)
		return nil
	}
	if err := leaseAcross(e, e.members, without(e.members, m), out); err != nil {
		return err
	}
	e.Sleep(e.Between(e.Params.outage(), 2*e.Params.outage()))
	if kill {
		if err := e.Servers[m].Start(); err != nil {
			return err
		}
	} else {
		e.Servers[m].Cont()
	}
	e.Step("back %d", m)
	settle(e)
	return nil
}

// casLead is how far a lease's server's CAS counter is brought ahead of
// the server its key goes to: more than the stores the other takes until
// the newer value is written there (a few thousand a second at most).
const casLead = 20000

// leaseAcross runs fault, which makes B the server of a loaded key whose
// server was A (a change of the ring, or A out), while a GetOrLoad of the
// key holds its lease at A; and before that load returns, writes a newer
// value of the key through the target, which lands at B with the CAS id
// of A's lease token. Each server counts its own CAS ids from 1, so two
// servers' counts meet by chance; here they are made to: the load's set,
// a compare-and-swap on the token, must not go to B (item 7), where it
// would replace the newer value with the older one it loaded. The key is
// then read through the target. Only the sharded Client gets this:
// gomemcache has no leases, and a replicated pool takes its leases in a
// group of one server here, which no change or failover moves a key off.
func leaseAcross(e *Env, before, after []int, fault func() error) error {
	if _, ok := e.d.t.(*selector.Client); !ok || e.pool {
		return fault()
	}
	key, a, b, err := e.movingKey(before, after)
	if err != nil || key == "" {
		e.Step("no loaded key changes server: %v", err)
		return fault()
	}
	e.d.reserved.Store(&key) // the workers leave it alone: a load of theirs would take the lease
	defer e.d.reserved.Store(nil)
	e.Pause(func() {}) // and none is still at it
	if err := lead(e.Servers[a], e.Servers[b]); err != nil {
		e.Step("CAS ids of %d ahead of %d: %v", a, b, err)
		return fault()
	}
	phase := *e.d.phase.Load()
	e.d.dbWrite(e.d.t, e.log, e.st, key, phase, "delete") // the next GetOrLoad misses, and takes the lease at A
	h := e.d.db.holdNext(key)
	release := sync.OnceFunc(func() { close(h.release) })
	defer release()
	log, st := e.d.rec.Log(), newOpStats()
	e.d.stats = append(e.d.stats, st)
	loaded := make(chan Event, 1)
	go func() { loaded <- e.d.readThrough(e.d.t, log, st, key, phase) }()
	select {
	case <-h.started:
	case ev := <-loaded:
		e.Step("GetOrLoad of %s loaded nothing: %+v", key, ev)
		return fault()
	}
	token, casErr := e.Servers[a].CAS(key)
	e.Step("GetOrLoad of %s holds its lease at %d: CAS id %d (%v)", key, a, token, casErr)
	if err := fault(); err != nil {
		return err
	}
	if casErr == nil && token != 0 {
		e.met[1]++
		var met bool
		e.Pause(func() { met = e.newerWithCAS(key, b, token) })
		if met {
			e.met[0]++
		}
	}
	release()
	<-loaded // what it returns began before the newer write: any value
	e.d.readThrough(e.d.t, e.log, e.st, key, phase)
	e.readKey(key)
	return nil
}

// lead brings a's CAS counter casLead ahead of b's.
func lead(a, b *Memcached) error {
	ca, err := a.Pump(1)
	if err != nil {
		return err
	}
	cb, err := b.Pump(1)
	if err != nil {
		return err
	}
	if ca < cb+casLead {
		_, err = a.Pump(int(cb + casLead - ca))
	}
	return err
}

// newerWithCAS, with the workers paused, brings server b's CAS counter to
// token-1 and writes a newer value of key through the target, which b
// then holds with the CAS id token if nothing else stored at b meanwhile.
// It reports whether it does.
func (e *Env) newerWithCAS(key string, b int, token uint64) bool {
	cb, err := e.Servers[b].Pump(1)
	if err == nil && cb+1 < token {
		cb, err = e.Servers[b].Pump(int(token - 1 - cb))
	}
	if err != nil || cb+1 != token {
		e.Step("CAS ids of %d at %d, not %d: %v", b, cb, token-1, err)
		return false
	}
	e.d.dbWrite(e.d.t, e.log, e.st, key, *e.d.phase.Load(), "set")
	got, err := e.Servers[b].CAS(key)
	e.Step("the newer value of %s at %d has CAS id %d, the lease's %d (%v)", key, b, got, token, err)
	return got == token
}

// readKey Gets key through the target, recorded.
func (e *Env) readKey(key string) {
	phase := *e.d.phase.Load()
	ev := Event{Kind: Read, Op: "get", Key: key, DB: true, Start: e.log.Now(), Phase: phase}
	it, err := e.d.t.Get(key)
	ev.End = e.log.Now()
	read(&ev, it, err)
	e.log.Add(ev)
	e.st.count("get", phase, ignoreMiss(err))
}

// movingKey returns a loaded key whose server in the ring of members
// before is a, and in the ring of after b, another (both by index), at
// random; "" if none moves.
func (e *Env) movingKey(before, after []int) (key string, a, b int, err error) {
	from, err := e.owners(before)
	if err != nil {
		return "", 0, 0, err
	}
	to, err := e.owners(after)
	if err != nil {
		return "", 0, 0, err
	}
	var moving []string
	for i := range e.d.w.LoadKeys {
		if k := loadKey(i); from[k] != to[k] {
			moving = append(moving, k)
		}
	}
	if len(moving) == 0 {
		return "", 0, 0, nil
	}
	key = moving[e.Rng.IntN(len(moving))]
	return key, from[key], to[key], nil
}

// owners returns each loaded key's server, by index, in the ring of the
// members idx: the ring the Client routes by, when all of them are up.
func (e *Env) owners(idx []int) (map[string]int, error) {
	byAddr := map[string]int{}
	addrs := make([]string, len(idx))
	for i, j := range idx {
		addrs[i] = e.addr(j)
		byAddr[addrs[i]] = j
	}
	var ring selector.ServerList
	if err := ring.SetServers(addrs...); err != nil {
		return nil, err
	}
	owner := map[string]int{}
	for i := range e.d.w.LoadKeys {
		a, err := ring.PickServer(loadKey(i))
		if err != nil {
			return nil, err
		}
		j, ok := byAddr[a.String()]
		if !ok {
			return nil, fmt.Errorf("PickServer(%s) = %v, not a member", loadKey(i), a)
		}
		owner[loadKey(i)] = j
	}
	return owner, nil
}

// waitOut waits until the target takes server i out (3 s at most): the
// workers' requests to it time out or are refused. gomemcache's client
// has no outs.
func (e *Env) waitOut(i int) {
	c, ok := e.d.t.(*selector.Client)
	if !ok {
		e.Sleep(e.Params.outage())
		return
	}
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		for _, s := range c.Stats().Servers {
			if s.Addr == e.addr(i) && s.State != "up" {
				e.Step("the target took %d out in %v", i, time.Since(start).Round(time.Millisecond))
				return
			}
		}
		e.Sleep(5 * time.Millisecond)
	}
	e.Step("the target did not take %d out in 3s", i)
}

// without returns ms without i.
func without(ms []int, i int) []int {
	var out []int
	for _, m := range ms {
		if m != i {
			out = append(out, m)
		}
	}
	return out
}
