package selector

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// moveKeys moves keys, listed at p, in batches (see moveBatch) at the
// pace pc sets, renewing this client's claim (key) as it goes. It
// reports false if the claim was lost or ctx ended; the keys a later try
// may move (see moveKey), and how many of them another copy held.
func (c *Client) moveKeys(ctx context.Context, mc *moveConns, pc *pace, p *server, key string, keys []string) (_ bool, retry []string, held int) {
	work := make(chan []string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range moveBatches {
		wg.Go(func() {
			for batch := range work {
				res, owners, bytes := c.moveBatch(ctx, mc, p, batch)
				pc.sent(0, bytes)
				pc.probe(ctx, append(owners, p))
				for i, r := range res {
					if r == moveDone {
						c.mover.movedOne(p.addr.str)
						continue
					}
					mu.Lock()
					retry = append(retry, batch[i])
					if r == moveHeld {
						held++
					}
					mu.Unlock()
				}
			}
		})
	}
	ok := c.feed(ctx, pc, p, key, keys, work)
	close(work)
	wg.Wait()
	return ok, retry, held
}

const (
	// moveBatchSize is how many keys a batch moves at most: a batch's
	// step is one write and one read of its pipeline at each server.
	moveBatchSize = 128
	// moveBatches is how many batches move at once, so that the
	// servers' work overlaps the round trips.
	moveBatches = 4
)

// feed sends keys to work in batches, as pc paces them, renewing the
// claim key at p as it goes. It reports false if the claim was lost or
// ctx ended.
func (c *Client) feed(ctx context.Context, pc *pace, p *server, key string, keys []string, work chan<- []string) bool {
	size := pc.batchSize()
	renew := time.Now().Add(c.mover.claim / 3)
	for len(keys) > 0 {
		if now := time.Now(); now.After(renew) {
			if !c.renewClaim(ctx, p, key, c.mover.token, c.mover.claim) {
				return false
			}
			renew = now.Add(c.mover.claim / 3)
		}
		if !pc.wait(ctx) {
			return false
		}
		n := min(size, len(keys))
		select {
		case work <- keys[:n:n]:
		case <-ctx.Done():
			return false
		}
		pc.sent(n, 0)
		keys = keys[n:]
	}
	return true
}

// moveResult is what moveKey did with a key.
type moveResult int

const (
	moveDone   moveResult = iota // at its owner now, or nothing at p to move (gone, or a value no read serves)
	moveHeld                     // p keeps it: another copy was under way
	moveFailed                   // p keeps it: a server failed, the owner is out, or the copy was undone
)

// moveKey moves key, listed at p, to its owner s, as a read that missed
// there would (see handoff), and deletes it at p once s has it: a value s
// has already is newer than p's. Where the handoff did not copy it, p
// keeps its own, for a later try: another copy may be under way (a
// read's, whose check of p a delete would fail: held), a server failed,
// or the owner is out.
func (c *Client) moveKey(ctx context.Context, p *server, key string) moveResult {
	h := c.hash(key)
	s := movableTo(c.rt.Load(), h)
	switch {
	case s == p:
		return moveDone
	case s == nil:
		c.mover.add(func(st *MoveStats) { st.Left++ })
		c.log.Debug("moving keys: a key stays where it was: its owner is out", keyServer, p.addr.str, "key", key)
		return moveFailed
	}
	_, res, err := c.handoffFrom(ctx, h, key, s, c.handoffTTL(), false, handoffMove)
	switch {
	case res.at:
		err = nil
		if res.from != p { // the copy deleted it at its source; p's is older, or s's own
			err = p.call(func(w wire) error { return w.Delete(ctx, key) })
			if errors.Is(err, memcache.ErrCacheMiss) {
				err = nil
			}
		}
	case err == nil:
		err = errNotMoved
	}
	switch {
	case err == nil:
		c.mover.add(func(st *MoveStats) { st.Moved++ })
		return moveDone
	case res.from == nil && !res.failed && errors.Is(err, memcache.ErrCacheMiss):
		return moveDone // p holds no value a read would serve: nothing to move, now or later
	}
	c.mover.add(func(st *MoveStats) { st.Left++ })
	c.log.Debug("moving keys: a key stays where it was", keyServer, p.addr.str, "key", key, "to", s.addr.str, "error", err)
	if errors.Is(err, errNotMoved) {
		return moveHeld
	}
	return moveFailed
}

// errNotMoved is why a key stays at its source where the handoff says no
// more: another copy held the key's server, or the source failed.
var errNotMoved = errors.New("selector: the key's server does not hold it")

// movableTo is the server that a key of hash h moves to: its owner among
// the members, if this client routes to it; else nil.
func movableTo(rt *routing, h uint64) *server {
	s, newStandIn := rt.ownerNow(h)
	if s == nil || newStandIn || s != rt.baseOwner(h) {
		return nil
	}
	return s
}
