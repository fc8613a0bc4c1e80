package selector

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

// The claims of the mover: one client of the cache moves the keys of a
// server for a set of members, the one whose key, named by the members, it
// added there first (see Moves).

// ringID names the members of rt, the same in every client that sees
// them, whatever its view of their health: the claim of a server is for
// one set of members.
func ringID(rt *routing) string {
	addrs := make([]string, 0, len(rt.baseSrv))
	for _, s := range rt.baseSrv {
		addrs = append(addrs, s.addr.str)
	}
	slices.Sort(addrs)
	var b [8]byte
	h := xxhash.Sum64String(strings.Join(addrs, ","))
	for i := range b {
		b[i] = byte(h >> (8 * i))
	}
	return hex.EncodeToString(b[:])
}

// liveChanged reports whether new routes to a member old did not: one
// back in the live ring. One taken out needs no moves: its keys stay where
// they are until it returns.
func liveChanged(old, new *routing) bool {
	if old == nil || old.live == new.live {
		return false
	}
	for _, s := range new.liveSrv {
		if !slices.Contains(old.liveSrv, s) {
			return true
		}
	}
	return false
}

// claim adds key at p, claiming p's keys for this client, or finds it
// this client's own (resumed). If another client holds it, won is false,
// and done tells whether that client finished.
//
// A claim is named by the members, and a set of members can repeat (a pod
// NotReady, then Ready, twice): a finished claim older than this client's
// view of the members is of an earlier change, and is claimed again. Its
// age is read by the server's clock (the expiration it was given, less
// what is left of it, to the second), against the time since this client
// saw the members by its own: no two clocks are compared.
func (c *Client) claim(ctx context.Context, p *server, key string) (won, resumed, done bool, err error) {
	it := &memcache.Item{Key: key, Value: []byte(c.mover.token), Expiration: int32(max(c.mover.claim/time.Second, 1))}
	for attempt := 0; ; attempt++ {
		err = p.call(func(w wire) error { return w.Store(ctx, opAdd, it) })
		switch {
		case err == nil:
			return true, false, false, nil
		case ctx.Err() != nil:
			return false, false, false, err
		}
		// Not stored, or no reply: an add whose reply was lost (a timeout
		// under load) may have claimed p for this client all the same, and
		// the others wait for the claim to expire.
		var got *memcache.Item
		if gerr := p.call(func(w wire) (err error) { got, _, err = w.GetForCopy(ctx, key, 0); return }); gerr != nil {
			if errors.Is(err, memcache.ErrNotStored) {
				err = nil // gone since, or unreadable: try again later
			}
			return false, false, false, err
		}
		if string(got.Value) == c.mover.token {
			// this client's: its add's, or from a round that ended early
			return true, errors.Is(err, memcache.ErrNotStored), false, nil
		}
		ttl, finished := doneTTL(got.Value)
		if !finished {
			return false, false, false, nil
		}
		age := time.Duration(ttl-got.Expiration) * time.Second
		if attempt > 0 || ttl == 0 || age <= c.mover.sinceMembers()+time.Second {
			return false, false, true, nil
		}
		// Of an earlier change: gone once deleted, unless another client
		// claimed it again meanwhile.
		if derr := p.call(func(w wire) error { return w.DeleteCAS(ctx, key, got.CasID) }); derr != nil && !errors.Is(derr, memcache.ErrCASConflict) &&
			!errors.Is(derr, memcache.ErrCacheMiss) {
			return false, false, false, derr
		}
	}
}

// finishClaim marks this client's claim key at p finished, for as long as
// a past ring is kept, so that clients that see the same members later do
// not list p again.
func (c *Client) finishClaim(ctx context.Context, p *server, key string) {
	exp := max(c.cfg.handoffWindow, c.mover.claim)
	c.renewClaim(ctx, p, key, "done "+strconv.Itoa(int(exp/time.Second)), exp)
}

// doneTTL reports whether v is a finished claim's value, and the
// expiration, in seconds, it was given (0: unknown, from a client before
// claims had one).
func doneTTL(v []byte) (int32, bool) {
	rest, ok := strings.CutPrefix(string(v), "done")
	if !ok {
		return 0, false
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(rest, " "))
	return int32(n), true
}

// renewClaim sets key at p to value, with an expiration of exp, if it is
// still this client's claim. It reports false if the claim is another
// client's or gone; a request that failed (a timeout under load) keeps it,
// as other clients wait for it to expire before they take over.
func (c *Client) renewClaim(ctx context.Context, p *server, key, value string, exp time.Duration) bool {
	var got *memcache.Item
	err := p.call(func(w wire) (err error) { got, err = w.Get(ctx, key); return })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return false // expired: another client may have taken over
	case err != nil:
		return ctx.Err() == nil // a slow reply is no lost claim: the next renewal tries again
	case string(got.Value) != c.mover.token:
		return false
	}
	got.Value, got.Expiration = []byte(value), int32(exp/time.Second)
	err = p.call(func(w wire) error { return w.Store(ctx, opCAS, got) })
	return err == nil || ctx.Err() == nil && failureOf(err) != healthy
}
