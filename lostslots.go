package selector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// lostRun is a run of slots, lo to hi, and its floor.
type lostRun struct {
	lo, hi uint32
	floor  uint64
}

// lostRecord is a server's record: the floors of the slots it lost, taken
// in the process that started at start (see serverStart).
type lostRecord struct {
	start int64
	runs  []lostRun // in slot order, disjoint
}

// maxLostRuns bounds a record (about 10 bytes a run): beyond it, neighbour
// runs are joined (see coarsen).
const maxLostRuns = 1 << 15

// mergeLost returns the runs of a and b, each in slot order and disjoint,
// with each slot's higher floor: a value below it predates the later loss.
func mergeLost(a, b []lostRun) []lostRun {
	var cuts []uint32 // where a floor may change
	for _, rs := range [][]lostRun{a, b} {
		for _, r := range rs {
			cuts = append(cuts, r.lo, r.hi+1)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []lostRun
	i, j := 0, 0
	for k := 0; k+1 < len(cuts); k++ {
		lo, hi := cuts[k], cuts[k+1]-1
		for i < len(a) && a[i].hi < lo {
			i++
		}
		for j < len(b) && b[j].hi < lo {
			j++
		}
		var f uint64
		if i < len(a) && a[i].lo <= lo {
			f = a[i].floor
		}
		if j < len(b) && b[j].lo <= lo {
			f = max(f, b[j].floor)
		}
		if f == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].floor == f && out[n-1].hi+1 == lo {
			out[n-1].hi = hi
		} else {
			out = append(out, lostRun{lo, hi, f})
		}
	}
	return coarsen(out)
}

// coarsen joins neighbour runs, two by two, until there are at most
// maxLostRuns: a joined run covers the slots between them too, at the
// higher floor, which only keeps more old values from being served.
func coarsen(runs []lostRun) []lostRun {
	for len(runs) > maxLostRuns {
		out := runs[:0]
		for i := 0; i < len(runs); i += 2 {
			r := runs[i]
			if i+1 < len(runs) {
				r.hi, r.floor = runs[i+1].hi, max(r.floor, runs[i+1].floor)
			}
			out = append(out, r)
		}
		runs = out
	}
	return runs
}

// lostVersion starts an encoded record.
const lostVersion = 1

// encode returns r as a record's value: the version, the start, then each
// run as varints: its distance from the end of the one before, its length
// less one, its floor.
func (r lostRecord) encode() []byte {
	b := make([]byte, 0, 16+len(r.runs)*10)
	b = append(b, lostVersion)
	b = binary.AppendVarint(b, r.start)
	b = binary.AppendUvarint(b, uint64(len(r.runs)))
	next := uint32(0)
	for _, x := range r.runs {
		b = binary.AppendUvarint(b, uint64(x.lo-next))
		b = binary.AppendUvarint(b, uint64(x.hi-x.lo))
		b = binary.AppendUvarint(b, x.floor)
		next = x.hi + 1
	}
	return b
}

// decodeLost reads a record's value. Any other application's value under
// lostKey, or a record of another version, is an error.
func decodeLost(b []byte) (lostRecord, error) {
	var r lostRecord
	if len(b) == 0 || b[0] != lostVersion {
		return r, errors.New("not a record of lost slots of this version")
	}
	b = b[1:]
	next := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errors.New("truncated")
		}
		b = b[n:]
		return v, nil
	}
	start, n := binary.Varint(b)
	if n <= 0 {
		return r, errors.New("truncated start")
	}
	b, r.start = b[n:], start
	count, err := next()
	if err != nil {
		return r, err
	}
	if count > maxLostRuns || count > uint64(len(b)) { // a run takes 3 bytes or more
		return r, fmt.Errorf("%d runs in %d bytes", count, len(b))
	}
	r.runs = make([]lostRun, 0, count)
	at := uint64(0) // the first slot a run may start at
	for range count {
		gap, err1 := next()
		length, err2 := next()
		floor, err3 := next()
		if err := errors.Join(err1, err2, err3); err != nil {
			return r, err
		}
		lo := at + gap
		hi := lo + length
		if gap >= 1<<slotBits || length >= 1<<slotBits || hi >= 1<<slotBits || floor == 0 {
			return r, fmt.Errorf("a run of slots %d to %d, floor %d", lo, hi, floor)
		}
		r.runs = append(r.runs, lostRun{uint32(lo), uint32(hi), floor})
		at = hi + 1
	}
	if len(b) != 0 {
		return r, fmt.Errorf("%d bytes after the runs", len(b))
	}
	return r, nil
}

// loss is the slots one server lost in a change (see gains.record).
type loss struct {
	s    *server
	runs []lostRun // floor 0: to be taken
}

// noteLosses writes each loss at its server, with a floor taken there now,
// before the routing of the change is published. The servers are written
// at once, each within twice the Client's timeout; a server out or lost
// is not written (it is not read either), and one that fails to take its
// record is logged: a Client started after it moves back may then read its
// older values of those slots (see docs/consistency.md).
func (c *Client) noteLosses(ls []loss) {
	if c.closed.Load() || !c.routesByRing() {
		return
	}
	done := make(chan struct{}, len(ls))
	n := 0
	for _, l := range ls {
		if st := l.s.status(); st == down || st == gone && l.s.lost.Load() {
			continue
		}
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
			defer cancel()
			if err := c.noteLoss(ctx, l); err != nil && c.ctx.Err() == nil {
				c.log.Warn("cannot record the slots a server lost; a client started after they move back may read its older values of them",
					keyServer, l.s.addr.str, keyError, err)
			}
		}()
	}
	for range n {
		<-done
	}
}

// noteLossesAgain writes the losses again, with new floors, once the
// requests sent by the routing before the change have landed: a write in
// flight then, to a server that loses its key, may land after the first
// floor, and would be served, after the key moved back, by a Client that
// did not see the change (a histcheck run: 16 stale reads in 6 runs). A
// request lands within the timeout, or its connection is closed.
func (c *Client) noteLossesAgain(ls []loss) {
	if len(ls) == 0 || c.closed.Load() {
		return
	}
	c.wg.Go(func() {
		t := time.NewTimer(c.cfg.conn.timeout + 10*time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
			c.noteLosses(ls)
		case <-c.ctx.Done():
		}
	})
}

// noteLoss merges l into its server's record, by CAS, trying again while
// other clients write it too.
func (c *Client) noteLoss(ctx context.Context, l loss) error {
	start, f, err := c.floorOf(ctx, l.s)
	if err != nil {
		return err
	}
	runs := slices.Clone(l.runs)
	for i := range runs {
		runs[i].floor = f
	}
	for attempt := 0; ; attempt++ {
		var got *memcache.Item
		err := l.s.call(func(w wire) (err error) { got, err = w.Get(ctx, lostKey); return })
		rec := lostRecord{start: start}
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
		case err != nil:
			return err
		default:
			if old, err := decodeLost(got.Value); err == nil && old.start == start {
				rec = old
			}
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

// lossesKnown reports whether s's record of the slots it lost is known to
// this Client, reading it if it is not (once; see learnLosses): until then
// no value of s is served. ctx bounds the wait; the read goes on.
func (c *Client) lossesKnown(ctx context.Context, s *server) bool {
	if s.lossesKnown.Load() {
		return true
	}
	if c.closed.Load() {
		return false
	}
	c.mu.Lock()
	ch := c.learn(s)
	c.mu.Unlock()
	if ch == nil { // known now
		return true
	}
	select {
	case <-ch:
		return s.lossesKnown.Load()
	case <-ctx.Done():
		return false
	}
}

// learn starts learnLosses of s unless it runs or s's record is known,
// and returns the channel closed when it ends, or nil if it is known. The Client's refresh starts it for each new member,
// so that the first request there seldom waits for it. Called with c.mu
// held.
func (c *Client) learn(s *server) <-chan struct{} {
	if !c.routesByRing() { // its pool's groups read and write the servers
		s.lossesKnown.Store(true)
	}
	if s.learning == nil && !s.lossesKnown.Load() {
		ch := make(chan struct{})
		s.learning = ch
		c.wg.Go(func() {
			c.learnLosses(s)
			c.mu.Lock()
			s.learning = nil
			c.mu.Unlock()
			close(ch)
		})
	}
	return s.learning
}

// routesByRing reports whether the Client routes keys by its own ring:
// the records of lost slots are of that ring. A replicated or zoned pool's
// Client routes by its groups' rings, each its own Client (one a pod, one
// a zone): their records are theirs.
func (c *Client) routesByRing() bool { return c.cfg.pool.kind == sharded }

// learnLosses reads s's record and adds its floors to the gains of the
// slots s owns now that this Client saw no change of (see gains.learn),
// within twice the timeout. A record no Client of this version wrote is
// logged and taken for none. A read that fails leaves the record unknown,
// to be read again by the next request.
func (c *Client) learnLosses(s *server) {
	ctx, cancel := context.WithTimeout(c.ctx, 2*c.cfg.conn.timeout)
	defer cancel()
	var got *memcache.Item
	err := s.call(func(w wire) (err error) { got, err = w.Get(ctx, lostKey); return })
	var rec lostRecord
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
	case err != nil:
		return
	default:
		if rec, err = decodeLost(got.Value); err != nil {
			c.log.Warn("the record of the slots a server lost cannot be read; taken for none", keyServer, s.addr.str, keyError, err)
			rec = lostRecord{}
		}
	}
	// Under refreshing, so that no change is recorded meanwhile from a
	// routing this does not see (see gains.learn).
	c.refreshing.Lock()
	c.gains.learn(s, c.rt.Load(), rec)
	c.refreshing.Unlock()
	s.lossesKnown.Store(true)
}
