package selector

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// A server's record of the slots it lost is how a Client learns the part
// of a server's history it did not see. A Client that sees a change keeps
// every server from serving, for a slot it gained, a value from before the
// gain (see gains): a key that moves back to a server that held it finds
// there the value it had when it left, while its writes went elsewhere
// meanwhile. A Client started after the key moved back saw neither change,
// and would serve that value.
//
// So every Client that sees a server lose slots writes, at that server and
// before it routes by the change, the slots lost with a CAS floor taken
// there then (lostKey): a value of such a slot below the floor predates the
// loss. A Client reads the record of each server before it serves a value
// from it (Client.lossesKnown), and keeps the server from serving, in the
// slots the server owns again, the values below the floors, as if it had
// seen the change itself. Being written before any write the change routes
// elsewhere, the record is at the server before any value there can be
// older than an acknowledged write. A record of a server that restarted is
// dropped (its values went with it); the record is never deleted
// otherwise, as a value below its floor stays as old as it was.
//
// It covers the Client's own ring, whose slots it names; Ketama and Ch3
// have no slots (as gains).
const lostKey = "k8sms.lost"

// loss is the slots one server lost in a change (see gains.record).
type loss struct {
	s    *server
	runs []lostRun // floor 0: to be taken
	// Of runs, those lost as a member, not only as a server routed to (out
	// for this Client): the losses a return of the member marks as past
	// (see remark). Set by refresh.
	member []lostRun
}

// noteLosses writes each loss at its server, with a floor taken there now:
// before the routing of the change is published, and again (see
// noteLossesAgain). The servers are written at once, each within twice
// the Client's timeout, with the slots the server owes from earlier losses
// (see serverLosses). A write that fails before the change is routed by is
// done again by the second pass; the second pass tries up to lossTries
// times, a moment apart. A server it cannot write (one out for this
// Client, or gone and lost, is not tried) owes the slots until it is next
// reachable: its probe, its recovery, or a change that routes slots to it
// writes them (see writeOwed), and Close tries.
func (c *Client) noteLosses(ctx context.Context, ls []loss, again bool) {
	if ctx.Err() != nil || !c.routesByRing() {
		return
	}
	done := make(chan struct{}, len(ls))
	n := 0
	for _, l := range ls {
		if st := l.s.status(); st == down || st == gone && l.s.lost.Load() {
			if again {
				c.owe(l.s, l.runs)
				l.s.losses.oweMarks(l.member)
			}
			continue
		}
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			owed := l.s.losses.takeOwed()
			l.runs = unionLost(l.runs, owed)
			if len(l.runs) == 0 {
				return // a server that owed slots (see withOwed), written since
			}
			tries := 1
			if again {
				tries = lossTries
			}
			var err error
			for try := 0; try < tries && ctx.Err() == nil; try++ {
				if try > 0 && !sleep(ctx, rand.N(2*c.cfg.conn.timeout)) {
					break
				}
				tctx, cancel := context.WithTimeout(ctx, 2*c.cfg.conn.timeout)
				err = c.noteLoss(tctx, l, again || len(owed) > 0)
				cancel()
				if err == nil {
					var member []lostRun // lost as a member, and raised: to be marked again where owned again (see remark)
					if again {
						member = l.member
					}
					if len(owed) > 0 {
						member = unionLost(member, l.s.losses.takeMarks())
					}
					c.remark(ctx, l.s, member)
					return
				}
			}
			if !again {
				l.s.losses.owe(owed) // the second pass writes the change's own
				return
			}
			c.owe(l.s, l.runs)
			l.s.losses.oweMarks(l.member)
			if ctx.Err() == nil {
				c.log.Warn("cannot record the slots a server lost; written when it next answers, until then a client started after they move back may read its older values of them",
					keyServer, l.s.addr.str, keyError, err)
			}
		}()
	}
	for range n {
		<-done
	}
}

// owe notes that s owes runs to its record, and probes s until it takes
// them, if no probe runs (see probeLoop).
func (c *Client) owe(s *server, runs []lostRun) {
	s.losses.owe(runs)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probe(s, c.cfg.probeMin)
}

// withOwed adds to a change's losses the gaining servers that owe slots to
// their records (see serverLosses), so that noteLosses writes them before
// the change routes slots to them: a Client started after that would
// serve their older values of slots they own again.
func withOwed(ls []loss, gained []*gain) []loss {
	for _, e := range gained {
		if e.s.losses.owes() && !slices.ContainsFunc(ls, func(l loss) bool { return l.s == e.s }) {
			ls = append(ls, loss{s: e.s})
		}
	}
	return ls
}

// payOwed writes the slots s, which left, owes its record, within 4
// timeouts, and reports whether it owes none now.
func (c *Client) payOwed(s *server) bool {
	ctx, cancel := context.WithTimeout(c.ctx, 4*c.cfg.conn.timeout)
	defer cancel()
	return c.writeOwed(ctx, s)
}

// writeOwed writes the slots s owes its record (see serverLosses), if any,
// within ctx, and reports whether it owes none now.
func (c *Client) writeOwed(ctx context.Context, s *server) bool {
	if !s.losses.owes() || !c.routesByRing() {
		return true
	}
	owed := s.losses.takeOwed()
	if err := c.noteLoss(ctx, loss{s: s, runs: owed}, true); err != nil {
		s.losses.owe(owed)
		if s.losses.failed() {
			c.log.Warn("cannot record the slots a server lost while it was out; tried again while it is known, until then a client started after they move back may read its older values of them",
				keyServer, s.addr.str, keyError, err)
		}
		return false
	}
	s.losses.paid()
	c.remark(ctx, s, s.losses.takeMarks())
	return true
}

// owedWhileGone reports whether s, which left, owes slots to its record
// and is still to be written: while the Client remembers it (see
// Client.refresh), lost or not (a server that left is read for keys only
// while it drains; its record is written whenever it answers, so that a
// Client started when it returns finds it there).
func (c *Client) owedWhileGone(s *server) bool {
	if !s.losses.owes() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[s.addr.str] == s
}

// lossTries is how many times the second pass tries a server's record.
const lossTries = 3

// sleep waits d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// noteLossesAgain writes the losses again, with new floors, once the
// requests sent by the routing before the change have landed: a write in
// flight then, to a server that loses its key, may land after the first
// floor, and would be served, after the key moved back, by a Client that
// did not see the change (a histcheck run: 16 stale reads in 6 runs). A
// request lands within the timeout, or its connection is closed. The
// first pass leaves a record that covers the slots as it is (see
// noteLoss), which may be one from an earlier loss of the same slots: this
// pass is what puts the floor above the values written since, and Close
// runs it if the Client closes first (see againOnClose).
func (c *Client) noteLossesAgain(ls []loss) {
	if len(ls) == 0 || c.closed.Load() {
		return
	}
	id := c.lossesAgain.add(ls)
	// Spread over a second timeout, so that the clients that saw the
	// change at once (every pod of an application) do not all come at once.
	wait := c.cfg.conn.timeout + 10*time.Millisecond + rand.N(c.cfg.conn.timeout)
	c.wg.Go(func() {
		if sleep(c.ctx, wait) {
			if ls, ok := c.lossesAgain.take(id); ok {
				c.noteLosses(c.ctx, ls, true)
			}
		}
	})
}

// againOnClose runs the second passes still waiting (see noteLossesAgain)
// as the Client closes, within 4 timeouts: the calls have returned, so
// their requests have landed. Skipped, a Client that closes just after a
// change (an application pod that rolls as a memcached pod leaves) would
// leave a record whose floor is from an earlier loss of the same slots,
// and a Client started after they move back would serve the server's
// values written in between (histcheck unseen-change: 168 stale reads in a
// long run).
//
// It also writes what servers out or gone owe their records (see
// serverLosses), whether this Client took them for back or not: an
// application pod that rolls while a memcached pod is out is the common
// case, and the Client started in its place has no other way to learn
// them (histcheck unseen-change-out).
func (c *Client) againOnClose() {
	var ls []loss
	for _, pass := range c.lossesAgain.takeAll() {
		ls = append(ls, pass...)
	}
	var owing []*server
	c.mu.Lock()
	for _, s := range c.servers {
		if s.losses.owes() {
			owing = append(owing, s)
		}
	}
	c.mu.Unlock()
	if len(ls) == 0 && len(owing) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeReplayTime*c.cfg.conn.timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range owing {
		wg.Go(func() { c.writeOwed(ctx, s) })
	}
	c.noteLosses(ctx, ls, true)
	wg.Wait()
}

// pendingLosses are the second passes not yet run (see noteLossesAgain).
type pendingLosses struct {
	mu     sync.Mutex
	n      int
	passes map[int][]loss
}

func (p *pendingLosses) add(ls []loss) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.passes == nil {
		p.passes = map[int][]loss{}
	}
	p.n++
	p.passes[p.n] = ls
	return p.n
}

// take removes the pass numbered id, and reports whether it was there.
func (p *pendingLosses) take(id int) ([]loss, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls, ok := p.passes[id]
	delete(p.passes, id)
	return ls, ok
}

func (p *pendingLosses) takeAll() map[int][]loss {
	p.mu.Lock()
	defer p.mu.Unlock()
	all := p.passes
	p.passes = nil
	return all
}

// noteLoss merges l into its server's record, by CAS, trying again while
// other clients write it too. Before the change is routed by (again
// false), a record that has every slot of l already is enough: another
// client that saw the change first wrote it, and the floor this one takes
// again once its requests in flight landed covers what it wrote there
// since. That spares the record's server most of the clients' writes
// when every pod of an application sees a change at once.
func (c *Client) noteLoss(ctx context.Context, l loss, again bool) error {
	var start int64
	var floor uint64   // this client's, taken once a write is due
	var runs []lostRun // l's, with that floor
	for attempt := 0; ; attempt++ {
		var got *memcache.Item
		err := l.s.call(func(w wire) (err error) { got, err = w.Get(ctx, lostKey); return })
		var old lostRecord
		decoded := false
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
		case err != nil:
			return err
		default:
			old, err = decodeLost(got.Value)
			decoded = err == nil
		}
		if decoded {
			l.s.losses.noteFloor(old.start, highest(old.runs))
		}
		if !again && decoded && covers(old.runs, l.runs) {
			return nil
		}
		if runs == nil {
			if start, floor, err = c.floorOf(ctx, l.s); err != nil {
				return err
			}
			runs = slices.Clone(l.runs)
			for i := range runs {
				runs[i].floor = floor
			}
		}
		rec := lostRecord{start: start}
		if decoded && old.start == start {
			rec = old
		}
		merged := mergeLost(rec.runs, runs)
		if got != nil && slices.Equal(merged, rec.runs) {
			return nil // another client's floors, taken after this one's, cover these slots already
		}
		rec.runs = merged
		it := &memcache.Item{Key: lostKey, Value: rec.encode()}
		kind := opAdd
		if got != nil {
			kind, it.CasID = opCAS, got.CasID
		}
		err = l.s.call(func(w wire) error { return w.Store(ctx, kind, it) })
		if err == nil {
			l.s.losses.noteFloor(start, floor)
			return nil
		}
		if !errors.Is(err, memcache.ErrNotStored) && !errors.Is(err, memcache.ErrCASConflict) && !errors.Is(err, memcache.ErrCacheMiss) {
			return err
		}
		// Another client wrote it meanwhile: read it again.
		select {
		case <-ctx.Done():
			return fmt.Errorf("still written by other clients after %d tries: %w", attempt+1, ctx.Err())
		case <-time.After(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))):
		}
	}
}
