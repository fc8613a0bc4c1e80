package selector

import (
	"context"
	"math"
	"sync"
)

// The floors of gains (see gains): taken when the change comes, before the
// routing it makes is published; else fallen back on the server's record of
// lost slots; else, while that record is owed, taken before the first write
// or copy to the gain.

// takeFloors learns the floor of each gain: a CAS id its server hands out
// now, before the routing that gains are of is published, so that every
// value this Client writes there afterwards is above it. The servers are
// asked at once, each within twice the Client's timeout. It returns the
// gains whose server did not answer in time (see fallBack). It observes no
// failure: its caller, refresh, is what a failure asks for.
func (c *Client) takeFloors(gs []*gain) (failed []*gain) {
	if len(gs) == 0 || c.closed.Load() {
		return nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, e := range gs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
			defer cancel()
			if c.take(ctx, e) != nil {
				mu.Lock()
				failed = append(failed, e)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// take takes e's floor at its server, unless it is known.
func (c *Client) take(ctx context.Context, e *gain) error {
	e.taking.Lock()
	defer e.taking.Unlock()
	if e.floor.Load() != math.MaxUint64 {
		return nil
	}
	start, f, err := c.floorOf(ctx, e.s)
	if err != nil {
		return err
	}
	e.started.Store(start)
	e.floor.Store(f)
	return nil
}

// awaitGain takes the floor of s's gain of h's slot now if it is pending
// (see fallBack), before a write or a copy of the key goes to s: written
// first, the value would be below the floor taken after it, and deleted as
// one from before the gain.
func (c *Client) awaitGain(ctx context.Context, s *server, h uint64) error {
	if e := c.gains.pending(s, h); e != nil {
		return c.take(ctx, e)
	}
	return nil
}

// pending returns s's gain of the slot of hash h if its floor is not
// known yet, or nil.
func (g *gains) pending(s *server, h uint64) *gain {
	if e, moved := g.last(h); moved && e.s == s && e.floor.Load() == math.MaxUint64 && e.later == 0 { // one that waits is not taken (see learn)
		return e
	}
	return nil
}

// fallBack gives each gain of failed, whose server did not answer for its
// floor in time, the highest floor known of the server's record of lost
// slots, and marks it to be raised when the record is read (see raise). A
// floor taken in the background later would be above the values written
// and copied there since the change, which the gate would then delete, the
// mover's copies too (e2e TestDemo's rolling restart found 86% of its keys
// so, on a loaded machine). The record's is below every value written
// since the gain, and above every value of a slot from before its last
// loss there (see docs/consistency.md).
//
// Not while the server owes its record slots (see serverLosses): the
// record's floor is then older than its values of the slots it lost last,
// which it took as their stand-in or owner since that floor; a value it
// held of them would be served, and the mover would copy it over a newer
// one at their owner (histcheck two-out on 1.6.45 under load). Such a
// gain's floor stays pending: none of its values is served, and the first
// write or copy of one of its keys takes it (see awaitGain), so that what
// is written there is above it. Called after the change's losses are
// written (see noteLosses), which pays what the servers owed if they can.
func (g *gains) fallBack(failed []*gain) {
	for _, e := range failed {
		if e.s.losses.owes() {
			continue
		}
		e.taking.Lock()
		if e.floor.Load() == math.MaxUint64 { // or a write took it meanwhile
			g.mu.Lock()
			start, f := e.s.losses.lastFloor()
			e.fallen = true
			e.started.Store(start)
			e.floor.Store(f)
			g.mu.Unlock()
		}
		e.taking.Unlock()
	}
}

// raise gives the gains of s that fell back on its record (see fallBack)
// the record's highest floor, now known: a Client that has not read the
// record yet when the change comes (one started since the slots last moved
// back, on a loaded machine) would otherwise serve, at a stand-in, the
// values it held from before they left it (histcheck unseen-change-out).
// The gate reads the record before it serves a value from s (see
// Client.lossesKnown), so that no value is served below the floor before
// it is raised.
func (g *gains) raise(s *server) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start, f := s.losses.lastFloor()
	p := g.events.Load()
	if p == nil || f == 0 {
		return
	}
	for _, e := range *p { // the past rings' gains included (see compact)
		if e != nil && e.s == s && e.fallen && (start > e.started.Load() || start == e.started.Load() && f > e.floor.Load()) {
			e.started.Store(start)
			e.floor.Store(f)
		}
	}
}

// floorOf returns s's process start (see serverStart) and a CAS id it hands
// out now (see casNow): a floor, and the process it holds in.
func (c *Client) floorOf(ctx context.Context, s *server) (start int64, floor uint64, err error) {
	if start, err = serverStart(ctx, s, c.cfg.conn); err == nil {
		floor, err = c.casNow(ctx, s)
	}
	return start, floor, err
}
