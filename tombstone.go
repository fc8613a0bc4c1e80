package selector

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

// Tombstones keep a delete from being undone by a copy. A Client deletes
// a key that moved where it was as well as at its server (see
// Client.afterWrite), so that a copy's check of the old server sees the
// delete. A Client started after a change cannot: it has no past rings,
// and its Delete reaches the key's server alone; another Client, which saw
// the change, would then copy the old value from where it was, over the
// delete. So, for as long as other clients may hand keys off for changes
// it did not see (the handoff window from its start), a Client's Delete
// also leaves a tombstone of the key at the key's server: a key of its own
// (the key's hash, under tombPrefix), which every copy checks before it
// fills its placeholder. The key itself is deleted as before, so no other
// operation sees the tombstone.
//
// The order makes it hold: Delete writes the tombstone, then deletes the
// key; a copy reserves the key (a placeholder), then checks the tombstone,
// then fills the placeholder by its CAS. A delete after the reservation
// removes the placeholder, and the fill fails; one before it left its
// tombstone before the check.
const tombPrefix = "k8sms.del."

// tombKey is the key of key's tombstone: its hash, so that it fits
// memcached's 250 bytes whatever key's length. Two keys of one hash make a
// copy of the other key undone, a miss: no wrong value.
func tombKey(key string) string {
	return tombPrefix + strconv.FormatUint(xxhash.Sum64String(key), 36)
}

// tombs says whether a Client's deletes leave tombstones.
type tombs struct {
	born   time.Time     // when the Client started
	window time.Duration // the handoff window: how long other clients copy after a change
}

// needed reports whether a delete now leaves a tombstone, and for how
// long: the handoff window, past which no client copies for a change made
// before this Client started.
func (t tombs) needed(now time.Time) (time.Duration, bool) {
	return t.window, t.window > 0 && now.Sub(t.born) < t.window
}

// entombAt leaves the tombstone of key, of hash h, at its server, if this
// Client's deletes need one. A tombstone that fails to land leaves the
// delete as it was without: the key's server failed, and the delete's own
// request fails over.
func (c *Client) entombAt(ctx context.Context, h uint64, key string) {
	ttl, ok := c.tombs.needed(time.Now())
	if !ok {
		return
	}
	if s, _ := c.rt.Load().ownerNow(h); s != nil {
		c.entomb(ctx, s, key, ttl)
	}
}

// entomb leaves key's tombstone at s for ttl.
func (c *Client) entomb(ctx context.Context, s *server, key string, ttl time.Duration) error {
	it := &memcache.Item{Key: tombKey(key), Expiration: int32(max(ttl/time.Second, 1))}
	return s.call(func(w wire) error { return w.Store(ctx, opSet, it) })
}

// entombed reports whether s holds key's tombstone, or an error if s
// cannot tell: the copy is then undone (a miss, never a value a delete
// removed), but its source keeps the key.
func (c *Client) entombed(ctx context.Context, s *server, key string) (bool, error) {
	err := s.call(func(w wire) error { _, err := w.Get(ctx, tombKey(key)); return err })
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}
