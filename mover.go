package selector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

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
// The mover yields to the application: before it moves a server's keys it
// times a no-op (mn) on the application's connections to each server it
// uses, and again after each batch; while one takes more than twice as
// long as before the moves, plus a millisecond, it waits between batches,
// twice as long each time (from 5 ms, up to 200 ms), and otherwise
// shortens the wait by a quarter, to none. From a server that
// left (a terminating pod), whose keys are lost when it stops, it waits
// 5 ms at most: yielding more there moved 128 keys every 200 ms on a loaded
// machine, and a pod of a million keys lost most of them at the end of its
// grace period (e2e TestClientMovesAtScale, E2E_MOVES_PER_POD=1000000).
//
// A zero field means its default: no cap but the application's latency.
type Moves struct {
	// Rate caps the keys a second one client moves (0: no cap). Negative:
	// no moves; keys move when they are read.
	Rate int
	// Bandwidth caps the bytes a second of the values one client moves (0:
	// no cap).
	Bandwidth int
	// NoYield makes the mover go as fast as Rate, Bandwidth and the
	// servers allow, whatever the application's requests wait meanwhile.
	NoYield bool
	// Prefix, if set, is the prefix of every key this application writes:
	// the mover moves those alone. Set it where other applications share
	// the servers (see the mover's rule on foreign keys, in Moves' doc).
	Prefix string
}

// WithMoves sets how the Client moves keys after a change of servers (see
// Moves); the zero Moves is the default.
func WithMoves(m Moves) Option {
	return clientOpt("WithMoves", func(c *clientOptions) error {
		if m.Bandwidth < 0 {
			return fmt.Errorf("Moves.Bandwidth %d is negative: give the bytes a second, or 0 for no cap", m.Bandwidth)
		}
		c.moves = m
		return nil
	})
}

const (
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
		c.mover.forgetLeft() // the new round lists again
		// While another client holds a claim of this round, it may die:
		// once its claim has expired, run the round again, and take over
		// what it left. Keys this client left (a copy that failed under
		// load, or waited on another's placeholder) are listed again
		// sooner, backing off: a server that drains keeps none for want
		// of a round, and a try that moved some of them does not count
		// against the limit. A new change ends this.
		pending := -1
		for try, stalled := 0, 0; stalled < maxTakeOvers; try++ {
			held, left := c.moveRoundUntilChange()
			if !held && !left {
				break
			}
			if n := c.mover.totals().Pending; !held && (pending < 0 || n < pending) {
				stalled, pending = 0, n
			} else {
				stalled++
			}
			wait := c.mover.claim + time.Second
			if !held { // within the claim kept (see moveFrom): the same run resumes
				wait = min(time.Second<<min(try, 5), c.mover.claim/2)
			}
			select {
			case <-time.After(wait):
				continue
			case <-c.mover.kick:
				c.mover.signal()
			case <-c.ctx.Done():
				return
			}
			break
		}
		c.mover.idle()
	}
}

// moveRoundUntilChange runs a round of moves, which a new change of
// servers ends: the next round starts over from the new rings, with the
// servers that stop serving first (a rolling restart removes a pod a
// moment after it adds one, and the pod removed has the least time).
func (c *Client) moveRoundUntilChange() (held, left bool) {
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
// another client held the claim of a server and had not finished, and
// whether this client left keys at a server that a later round may move.
func (c *Client) moveRound(ctx context.Context) (held, left bool) {
	rt := c.rt.Load()
	if rt == nil || rt.live == nil || len(rt.past) == 0 {
		return false, false
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
			return false, false
		}
		if !p.readable() {
			continue
		}
		h, l := c.moveFrom(ctx, p, id)
		held, left = held || h, left || l
	}
	if ctx.Err() == nil { // a round a change ended is not one run
		c.mover.add(func(st *MoveStats) { st.Rounds++ })
	}
	return held, left
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
// another client holds the claim and has not finished, and whether this
// client left keys at p that a later round may move: it keeps its claim
// then, and the later round resumes it.
func (c *Client) moveFrom(ctx context.Context, p *server, id string) (held, left bool) {
	if p.proto.Load() == protoClassic {
		c.refused(p, "it does not speak the meta protocol, whose copies are exact")
		return false, false
	}
	key := claimPrefix + id
	won, resumed, done, err := c.claim(ctx, p, key)
	switch {
	case err != nil: // the claim may be this client's: the next round (see moveLoop) finds out
		c.log.Debug("moving keys: the claim failed", keyServer, p.addr.str, "error", err)
		return ctx.Err() == nil, false
	case !won:
		c.mover.add(func(st *MoveStats) { st.Claimed++ })
		return !done, false
	}
	start := time.Now()
	before := c.mover.totals()
	listed := 0
	retry := c.mover.takeLeft(p.addr.str) // what an earlier round of these members left at p
	defer func() { c.mover.setPending(p.addr.str, len(c.mover.leftAt(p.addr.str))) }()
	var mc moveConns
	defer mc.close()
	pc := newPace(c.mover.Moves, p.status() == gone)
	seen := map[string]bool{}
	for _, k := range retry {
		seen[k] = true
	}
	// A listing taken while the server serves can miss items (see
	// meta.List): list again until a listing finds nothing more to move.
	// A key a pass left is tried again even where the next listing misses
	// it (an item a move read is likelier missed).
	for pass, nheld := 0, 0; pass < maxListings; pass++ {
		if nheld > 0 {
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
				return false, false
			}
		}
		l, err := c.listMovable(ctx, p)
		if errors.Is(err, meta.ErrNoListing) {
			c.refused(p, err.Error())
		}
		if err != nil {
			c.log.Warn("moving keys: listing failed; they move when read", keyServer, p.addr.str, "error", err)
			c.mover.keepLeft(p.addr.str, retry) // the keys known are tried again
			return false, len(retry) > 0
		}
		if pass == 0 {
			if l.shared() {
				c.refused(p, fmt.Sprintf("%d of the %d keys listed there are not in slots it owned: another application "+
					"with another hashing shares the server, and the mover would move its keys; set Moves.Prefix to the prefix "+
					"of this application's keys, or turn moves off (Moves.Rate -1)", l.foreign, l.foreign+l.ours))
				c.finishClaim(ctx, p, key)
				return false, false
			}
			if !resumed { // a server is counted once a set of members
				c.mover.add(func(st *MoveStats) { st.Foreign += l.foreign + l.others; st.Sources++ })
			}
		}
		var fresh int // keys not listed before: a key left is listed again
		for _, k := range l.keys {
			if !seen[k] {
				seen[k] = true
				fresh++
			}
		}
		c.mover.add(func(st *MoveStats) { st.Listed += fresh })
		keys := withLeft(l.keys, retry)
		if len(keys) == 0 {
			break
		}
		listed += len(keys)
		c.mover.setPending(p.addr.str, len(keys))
		var ok bool
		if ok, retry, nheld = c.moveKeys(ctx, &mc, pc, p, key, keys); !ok {
			return false, false // lost the claim: another client moves the rest
		}
	}
	if left = len(retry) > 0; left {
		c.mover.keepLeft(p.addr.str, retry)
		c.renewClaim(ctx, p, key, c.mover.token, c.mover.claim) // for the next round (see moveLoop)
	} else {
		c.finishClaim(ctx, p, key)
	}
	c.mover.add(func(st *MoveStats) { st.Took += time.Since(start) })
	after := c.mover.totals()
	c.log.Info("moved keys with their slots", keyServer, p.addr.str, "listed", listed,
		"moved", after.Moved-before.Moved, "left", after.Left-before.Left, "took", time.Since(start).Round(time.Millisecond))
	return false, left
}

// withLeft returns keys, and those of left it lacks.
func withLeft(keys, left []string) []string {
	if len(left) == 0 {
		return keys
	}
	listed := make(map[string]bool, len(keys))
	for _, k := range keys {
		listed[k] = true
	}
	out := slices.Clip(keys)
	for _, k := range left {
		if !listed[k] {
			out = append(out, k)
		}
	}
	return out
}

// refused notes that p's keys cannot be moved, and logs why once.
func (c *Client) refused(p *server, why string) {
	c.mover.add(func(st *MoveStats) { st.Refused++ })
	if c.mover.firstRefusal(p.addr.str) {
		c.log.Warn("cannot move keys from this server; they move when read", keyServer, p.addr.str, "reason", why)
	}
}
