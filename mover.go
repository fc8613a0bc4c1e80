package selector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// Moves are how a Client moves keys with their slots. After a change of
// servers, a read of a key that moved finds it where it was (see Handoff);
// a key nobody reads stays there, and is lost when that server goes. So,
// after each change, the Client lists the keys of the servers that may
// hold keys they no longer own (memcached's lru_crawler metadump), and
// moves each such key to its owner as a read would: copied with its
// value, flags and exact remaining expiration, never over a newer value
// nor after a delete, and deleted where it was. One client of the cache
// moves each server's keys: it claims the server for the new set of
// servers with a key added there, renewed while it works, which another
// client takes over if it dies.
//
// The mover moves only what the Client placed: a key listed at a server
// is the Client's if that server owned the key's slot in a ring the Client
// routed by (and, with Moves.Prefix, if it has the prefix). Other keys
// there are foreign: another application's, with its own hashing, or
// junk. They are left alone and counted (MoveStats.Foreign). As another
// hashing's keys also fall, by chance, in slots the server did own (one
// in as many as there are servers), a server where more than 1% of the
// keys listed, and at least 10, are foreign is not moved from at all: the
// Client logs one warning naming the cause and the fixes (Moves.Prefix, or
// no moves) and counts it in MoveStats.Refused; its keys move when read.
//
// A zero field means its default.
type Moves struct {
	// Rate is how many keys a second one client moves at most (default
	// 5000). Negative: no moves; keys move when they are read.
	Rate int
	// Prefix, if set, is the prefix of every key this application writes:
	// the mover moves those alone. Set it where other applications share
	// the servers (see the mover's rule on foreign keys, in Moves' doc).
	Prefix string
}

// WithMoves sets how the Client moves keys after a change of servers (see
// Moves); the zero Moves is the default.
func WithMoves(m Moves) ClientOption {
	return clientOption{"WithMoves", func(c *clientOptions) error {
		c.moveRate, c.movePrefix = m.Rate, m.Prefix
		if m.Rate == 0 {
			c.moveRate = defaultMoveRate
		}
		return nil
	}}
}

const (
	defaultMoveRate = 5000
	moveWorkers     = 16                     // keys moved at once
	moveSettle      = 500 * time.Millisecond // a burst of changes is moved once
	defaultClaimTTL = 10 * time.Second       // how long a dead mover's claim holds
	maxTakeOvers    = 5                      // rounds a client runs again for a set of members whose mover may have died
	maxListings     = 3                      // listings of one server in a round
	claimPrefix     = "k8sms.move."          // the claim keys, skipped by the listing
)

// moveLoop runs a round of moves after each change of servers, until Close.
func (c *Client) moveLoop() {
	for {
		select {
		case <-c.mover.kick:
		case <-c.ctx.Done():
			return
		}
		select {
		case <-time.After(moveSettle):
		case <-c.ctx.Done():
			return
		}
		select { // the changes meanwhile are in this round
		case <-c.mover.kick:
		default:
		}
		// While another client holds a claim of this round, it may die:
		// once its claim has expired, run the round again, and take over
		// what it left. A new change ends this.
		for range maxTakeOvers {
			if !c.moveRoundUntilChange() {
				break
			}
			select {
			case <-time.After(c.mover.claim + time.Second):
				continue
			case <-c.mover.kick:
				c.mover.signal()
			case <-c.ctx.Done():
				return
			}
			break
		}
	}
}

// moveRoundUntilChange runs a round of moves, which a new change of
// servers ends: the next round starts over from the new rings, with the
// servers that stop serving first (a rolling restart removes a pod a
// moment after it adds one, and the pod removed has the least time).
func (c *Client) moveRoundUntilChange() (held bool) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		select {
		case <-c.mover.kick:
			c.mover.signal() // for moveLoop: the next round
			cancel()
		case <-ended:
		}
	}()
	return c.moveRound(ctx)
}

// moveRound moves the keys of every server of the recent rings that may
// hold keys it does not own, one server at a time. It reports whether
// another client held the claim of a server and had not finished.
func (c *Client) moveRound(ctx context.Context) (held bool) {
	rt := c.rt.Load()
	if rt == nil || rt.live == nil || len(rt.past) == 0 {
		return false
	}
	id := ringID(rt)
	srcs := losers(rt)
	// Servers that left first: they stop serving at the end of their
	// grace period; the members keep what they hold.
	slices.SortStableFunc(srcs, func(a, b *server) int {
		return cmpBool(a.status() != gone, b.status() != gone)
	})
	for _, p := range srcs {
		if ctx.Err() != nil {
			return false
		}
		if p.readable() && c.moveFrom(ctx, p, id) {
			held = true
		}
	}
	if ctx.Err() == nil { // a round a change ended is not one run
		c.mover.add(func(st *MoveStats) { st.Rounds++ })
	}
	return held
}

// losers returns the servers that may hold keys they do not own: those
// that own, in one of rt's past rings, a slot that rt's live ring gives to
// another server. Where a ring has no slot table (Ketama, Ch3), every
// server of the past rings.
func losers(rt *routing) []*server {
	var out []*server
	add := func(s *server) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, p := range rt.past {
		if p.r.alt != nil || rt.live.alt != nil {
			for _, s := range p.srv {
				add(s)
			}
			continue
		}
		for slot := uint64(0); slot < 1<<slotBits; slot++ {
			h := slot << (64 - slotBits)
			if was := p.srv[p.r.owner(h)]; was != rt.liveSrv[rt.live.owner(h)] {
				add(was)
			}
		}
	}
	return out
}

// moveFrom moves the keys that p holds and does not own to their owners,
// if this client claims p for the members id names. It reports whether
// another client holds the claim and has not finished.
func (c *Client) moveFrom(ctx context.Context, p *server, id string) (held bool) {
	if p.proto.Load() == protoClassic {
		c.refused(p, "it does not speak the meta protocol, whose copies are exact")
		return false
	}
	key := claimPrefix + id
	won, resumed, done, err := c.claim(ctx, p, key)
	switch {
	case err != nil: // the claim may be this client's: the next round (see moveLoop) finds out
		c.log.Debug("moving keys: the claim failed", keyServer, p.addr.str, "error", err)
		return ctx.Err() == nil
	case !won:
		c.mover.add(func(st *MoveStats) { st.Claimed++ })
		return !done
	}
	start := time.Now()
	before := c.mover.totals()
	listed := 0
	seen := map[string]bool{}
	// A listing taken while the server serves can miss items (see
	// meta.List): list again until a listing finds nothing more to move.
	for pass, held := 0, 0; pass < maxListings; pass++ {
		if held > 0 {
			// A key another copy held (see moveKey) waits for it: a read's
			// handoff ends in milliseconds, but a copy whose reply was
			// lost holds its placeholder for reserveTTL. A server that
			// stops serving soon is listed again sooner.
			wait := 100 * time.Millisecond
			if pass == maxListings-1 && p.status() != gone {
				wait = time.Duration(c.reserveTTL()) * time.Second
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return false
			}
		}
		l, err := c.listMovable(ctx, p)
		if errors.Is(err, meta.ErrNoListing) {
			c.refused(p, err.Error())
		}
		if err != nil {
			c.log.Warn("moving keys: listing failed; they move when read", keyServer, p.addr.str, "error", err)
			return false
		}
		if pass == 0 {
			if l.shared() {
				c.refused(p, fmt.Sprintf("%d of the %d keys listed there are not in slots it owned: another application "+
					"with another hashing shares the server, and the mover would move its keys; set Moves.Prefix to the prefix "+
					"of this application's keys, or turn moves off (Moves.Rate -1)", l.foreign, l.foreign+l.ours))
				c.finishClaim(ctx, p, key)
				return false
			}
			c.mover.add(func(st *MoveStats) {
				st.Foreign += l.foreign + l.others
				if !resumed { // a server is counted once a set of members
					st.Sources++
				}
			})
		}
		var fresh int // keys not listed before: a key left is listed again
		for _, k := range l.keys {
			if !seen[k] {
				seen[k] = true
				fresh++
			}
		}
		c.mover.add(func(st *MoveStats) { st.Listed += fresh })
		keys := l.keys
		if len(keys) == 0 {
			break
		}
		listed += len(keys)
		var ok bool
		if ok, held = c.moveKeys(ctx, p, key, keys); !ok {
			return false // lost the claim: another client moves the rest
		}
	}
	c.finishClaim(ctx, p, key)
	c.mover.add(func(st *MoveStats) { st.Took += time.Since(start) })
	after := c.mover.totals()
	c.log.Info("moved keys with their slots", keyServer, p.addr.str, "listed", listed,
		"moved", after.Moved-before.Moved, "left", after.Left-before.Left, "took", time.Since(start).Round(time.Millisecond))
	return false
}

// moveKeys moves keys, listed at p, at most the mover's rate a second,
// renewing this client's claim (key) as it goes. It reports false if the
// claim was lost or ctx ended, and how many keys another copy held.
func (c *Client) moveKeys(ctx context.Context, p *server, key string, keys []string) (_ bool, held int) {
	work := make(chan string)
	var wg sync.WaitGroup
	var nheld atomic.Int32
	for range moveWorkers {
		wg.Go(func() {
			for k := range work {
				if c.moveKey(ctx, p, k) {
					nheld.Add(1)
				}
			}
		})
	}
	ok := c.feed(ctx, p, key, keys, work)
	close(work)
	wg.Wait()
	return ok, int(nheld.Load())
}

// feed sends keys to work at most the mover's rate a second, renewing the
// claim key at p as it goes. It reports false if the claim was lost or ctx
// ended.
func (c *Client) feed(ctx context.Context, p *server, key string, keys []string, work chan<- string) bool {
	every := time.Second / time.Duration(max(c.mover.rate, 1))
	next, renew := time.Now(), time.Now().Add(c.mover.claim/3)
	for _, k := range keys {
		if now := time.Now(); now.After(renew) {
			if !c.renewClaim(ctx, p, key, c.mover.token, c.mover.claim) {
				return false
			}
			renew = now.Add(c.mover.claim / 3)
		}
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		next = next.Add(every)
		if ctx.Err() != nil {
			return false
		}
		work <- k
	}
	return true
}

// refused notes that p's keys cannot be moved, and logs why once.
func (c *Client) refused(p *server, why string) {
	c.mover.add(func(st *MoveStats) { st.Refused++ })
	if c.mover.firstRefusal(p.addr.str) {
		c.log.Warn("cannot move keys from this server; they move when read", keyServer, p.addr.str, "reason", why)
	}
}

// moveKey moves key, listed at p, to its owner s, as a read that missed
// there would (see handoff), and deletes it at p once s has it: a value s
// has already is newer than p's. Where the handoff did not copy it, p
// keeps its own: another copy may be under way (a read's, whose check of
// p a delete would fail: held), or p's value is one no read will serve.
func (c *Client) moveKey(ctx context.Context, p *server, key string) (held bool) {
	h := c.hash(key)
	s := movableTo(c.rt.Load(), h)
	switch {
	case s == p:
		return false
	case s == nil:
		c.mover.add(func(st *MoveStats) { st.Left++ })
		c.log.Debug("moving keys: a key stays where it was: its owner is out", keyServer, p.addr.str, "key", key)
		return false
	}
	_, res, err := c.handoffFrom(ctx, h, key, s, c.handoffTTL(), false, HandoffMove)
	if res.at {
		err = nil
		if res.from != p { // the copy deleted it at its source; p's is older, or s's own
			err = p.call(func(w wire) error { return w.Delete(ctx, key) })
			if errors.Is(err, memcache.ErrCacheMiss) {
				err = nil
			}
		}
	} else if err == nil {
		err = errNotMoved
	}
	c.mover.add(func(st *MoveStats) {
		if err == nil {
			st.Moved++
		} else {
			st.Left++
		}
	})
	if err != nil {
		c.log.Debug("moving keys: a key stays where it was", keyServer, p.addr.str, "key", key, "to", s.addr.str, "error", err)
	}
	return errors.Is(err, errNotMoved)
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
