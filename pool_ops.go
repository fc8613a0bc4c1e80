package selector

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// get reads key from the groups in this client's order (see Pool). A
// repair that outlives ctx goes on in the background (see detach).
func (pl *pooled) get(ctx context.Context, key string, get func(c *Client) (*memcache.Item, error)) (*memcache.Item, error) {
	var missed []*group
	err := ErrNoServers
	// A repair (with miss failover) is registered before the reads it
	// copies from (see copies), and ended by it.
	var st *copyState
	repairing := false
	if pl.miss {
		st = pl.copies.begin(key)
		defer func() {
			if !repairing {
				pl.copies.done(key, st)
			}
		}()
	}
	for _, g := range pl.view.Load().reads {
		it, gerr := get(g.c)
		switch {
		case gerr == nil && len(missed) > 0: // with miss failover: st is registered
			ok := false
			repairing = true
			if err := detach(ctx, nil, &pl.wg, func() {
				defer pl.copies.done(key, st)
				ok = pl.repair(missed, g, it, st)
			}); err != nil {
				return nil, err
			}
			if !ok {
				return nil, memcache.ErrCacheMiss
			}
			return it, nil
		case gerr == nil:
			if pl.copies.check(st) { // a write or delete overtook the read
				return nil, memcache.ErrCacheMiss
			}
			return it, nil
		case errors.Is(gerr, memcache.ErrMalformedKey):
			return nil, gerr
		case errors.Is(gerr, memcache.ErrCacheMiss):
			if !pl.miss {
				return nil, gerr
			}
			missed = append(missed, g)
			err = gerr
		case !errors.Is(err, memcache.ErrCacheMiss):
			err = gerr // an error is reported only if no group answered
		}
	}
	return nil, err
}

// repair copies it, found in group g, to the groups that missed it, and
// reports whether it may be served. A write or delete may run between the
// read at g and a copy, and the copy would bring an old value back: so
// each copy first reserves the key in its group (a placeholder, which
// readers take for a miss, and which a write or delete there replaces or
// removes; see wire.Reserve), then g is read again, and the copies fill
// their placeholders only if g's value is unchanged and no write or delete
// of this client's overtook the repair (see copies), which else serves a
// miss. Over the classic protocol, which has no placeholders, the copy is
// added first and deleted (or logged for deletion) after such a check. A
// Delete on a pool with miss failover deletes twice (see pooled.delete),
// so that a classic copy that another client added before the first pass
// ended is gone after the second.
func (pl *pooled) repair(missed []*group, g *group, it *memcache.Item, st *copyState) bool {
	holds := make([]copyHold, len(missed))
	for i, m := range missed {
		holds[i] = m.c.reserveCopy(it) // it has its remaining expiration (see Client.getItem)
	}
	now, err := g.c.Get(it.Key)
	if err != nil || now.CasID != it.CasID || pl.copies.check(st) {
		for i, m := range missed {
			m.c.dropCopy(holds[i], it.Key)
		}
		return false
	}
	for i, m := range missed {
		m.c.fillCopy(holds[i], it)
	}
	return true
}

// copyHold is a copy that reserveCopy started at s: a placeholder of CAS
// stub to fill, or (over the classic protocol) a copy added already.
type copyHold struct {
	s     *server
	stub  uint64
	added bool
}

// reserveCopy starts a copy of it at its key's server for c (see
// pooled.repair). The zero copyHold is no copy: the key is there already,
// another copy holds it, or the server failed.
func (c *Client) reserveCopy(it *memcache.Item) copyHold {
	h := c.hash(it.Key)
	s, newStandIn := c.rt.Load().ownerNow(h)
	if s == nil || newStandIn {
		return copyHold{}
	}
	var stub uint64
	var reserved bool
	err := s.call(func(w wire) (err error) { _, stub, reserved, err = w.Reserve(c.ctx, it.Key, c.reserveTTL()); return })
	switch {
	case errors.Is(err, errNoReserve):
		cp := c.copyOf(s, it)
		return copyHold{s: s, added: s.call(func(w wire) error { return w.Store(c.ctx, opAdd, &cp) }) == nil}
	case err != nil || !reserved:
		return copyHold{}
	}
	return copyHold{s: s, stub: stub}
}

// fillCopy ends the copy ch of it: its placeholder is filled, unless a
// write or delete replaced or removed it.
func (c *Client) fillCopy(ch copyHold, it *memcache.Item) {
	if ch.s == nil || ch.added {
		return
	}
	cp := c.copyOf(ch.s, it)
	cp.CasID = ch.stub
	ch.s.call(func(w wire) error { return w.Store(c.ctx, opCAS, &cp) })
}

// dropCopy undoes the copy ch of key: its placeholder is removed, or the
// classic copy deleted (or logged for deletion, where that fails).
func (c *Client) dropCopy(ch copyHold, key string) {
	switch {
	case ch.s == nil:
	case ch.added:
		if err := c.Delete(key); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			c.forget(key)
		}
	default:
		ch.s.call(func(w wire) error { return w.DeleteCAS(c.ctx, key, ch.stub) })
	}
}

// copyOf returns the copy of it to write at s: its expiration capped at a
// stand-in (see standInExp).
func (c *Client) copyOf(s *server, it *memcache.Item) memcache.Item {
	cp := *it
	if c.rt.Load().baseOwner(c.hash(it.Key)) != s {
		cp.Expiration = c.standInExp(cp.Expiration)
	}
	return cp
}

// delete deletes key in every group; with miss failover, twice (see repair).
func (pl *pooled) delete(key string) error {
	pl.copies.written(key) // a repair that lands after it must not be served (see copies)
	err := pl.all(key, func(g *Client) error { return g.Delete(key) })
	if pl.miss {
		pl.all(key, func(g *Client) error { return g.Delete(key) })
	}
	return err
}

// getMulti asks the groups in this client's order for the keys not found
// yet: after an error, or, with WithMissFailover, a miss, when a hit is
// copied back to the groups that missed it, as get does.
func (pl *pooled) getMulti(keys []string) (map[string]*memcache.Item, error) {
	found := map[string]*memcache.Item{}
	var err error
	want := keys
	var asked []*group             // the groups that missed want
	sts := map[string]*copyState{} // repairs, registered before the reads (see copies)
	for _, k := range keys {
		if pl.miss && sts[k] == nil {
			sts[k] = pl.copies.begin(k)
		}
	}
	defer func() {
		for k, st := range sts {
			pl.copies.done(k, st)
		}
	}()
	for _, g := range pl.view.Load().reads {
		items, gerr := g.c.GetMulti(want)
		if errors.Is(gerr, memcache.ErrMalformedKey) {
			return nil, gerr
		}
		for k, it := range items {
			if pl.repair(asked, g, it, sts[k]) {
				found[k] = it
			}
		}
		want = slices.DeleteFunc(slices.Clone(want), func(k string) bool { return found[k] != nil })
		if len(want) == 0 || gerr == nil && !pl.miss {
			return found, nil
		}
		if gerr == nil {
			asked = append(asked, g)
		}
		err = gerr
	}
	return found, err
}

// all runs op on every group at once, and returns nil if one succeeded;
// else the answer of a group that answered (ErrCacheMiss, ErrNotStored),
// else the first failure; ErrNoServers only if no group had a server. A
// group where op failed has key invalidated (see Client.forget).
func (pl *pooled) all(key string, op func(c *Client) error) error {
	v := pl.view.Load()
	errs := make([]error, len(v.all))
	var wg sync.WaitGroup
	for i, g := range v.all {
		wg.Go(func() { errs[i] = op(g.c) })
	}
	wg.Wait()
	var ok bool
	var answer, failed error
	for i, err := range errs {
		switch {
		case err == nil:
			ok = true
		case errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrNotStored):
			answer = cmp.Or(answer, err)
		case errors.Is(err, ErrNoServers):
		default:
			if key != "" {
				g := v.all[i].c
				g.log.Warn("a pool's write failed in this group, which no longer has the key: it is deleted there, or before its server is used again", keyError, err)
				g.forget(key)
			}
			failed = cmp.Or(failed, err)
		}
	}
	switch {
	case ok:
		return nil
	case answer != nil:
		return answer
	case failed != nil:
		return failed
	}
	return ErrNoServers
}

// primaryFor returns the primary group for key (see Pool), or nil.
func (pl *pooled) primaryFor(key string) *group {
	for _, g := range pl.view.Load().all {
		if g.c.rt.Load().owner(g.c.hash(key)) != nil {
			return g
		}
	}
	return nil
}

// primary runs op on the primary group for key, and then then on the
// others at once when op succeeded there (see Pool); a group where then
// fails has key invalidated. A primary whose server for key went out
// before op was sent there (its dial refused, say, by a server just
// killed) answers ErrNoServers: op ran nowhere, so it goes to the primary
// then, the next group, as it would have had the server gone out a moment
// earlier.
func (pl *pooled) primary(key string, op func(c *Client) error, then func(c *Client) error) error {
	if err := checkKey(key); err != nil {
		return err
	}
	var p *group
	err := ErrNoServers
	for range pl.view.Load().all { // each round tries another group
		q := pl.primaryFor(key)
		if q == nil || q == p {
			break
		}
		p = q
		if err = op(p.c); !errors.Is(err, ErrNoServers) {
			break
		}
	}
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, g := range pl.view.Load().all {
		if g != p {
			wg.Go(func() {
				if then(g.c) != nil {
					g.c.forget(key)
				}
			})
		}
	}
	wg.Wait()
	return nil
}

// counter runs op, an Increment or Decrement, on the primary group and
// then on the others, so that each replica keeps its own expiration. A
// replica that answers another value than the primary's had diverged (two
// Sets that met in another order there): the key is deleted there, as where
// op fails, so that no replica keeps a value that the others moved past. It
// returns the primary's result.
func (pl *pooled) counter(key string, op func(c *Client) (uint64, error)) (uint64, error) {
	var v uint64
	err := pl.primary(key, func(c *Client) (err error) { v, err = op(c); return },
		func(c *Client) error {
			n, err := op(c)
			switch {
			case errors.Is(err, memcache.ErrCacheMiss):
				return nil // nothing there to move past
			case err != nil:
				return err
			case n != v:
				return errDiverged
			}
			return nil
		})
	return v, err
}

// errDiverged is a replica's counter that differs from the primary's.
var errDiverged = errors.New("selector: a replica's counter differs from the primary's")

// each runs op on every group, one after the other, and returns the first
// error.
func (pl *pooled) each(op func(c *Client) error) error {
	var first error
	for _, g := range pl.view.Load().all {
		if err := op(g.c); err != nil && !errors.Is(err, ErrNoServers) && first == nil {
			first = err
		}
	}
	return first
}

// forget makes sure that no server of c serves key's current value, as
// after a write that c missed: at the key's member owner, the stand-in c
// routes it to now, and where it was before a recent change of ring, it is
// deleted, or logged for deletion.
func (c *Client) forget(key string) {
	if !legalKey(key) {
		return
	}
	h := c.hash(key)
	rt := c.rt.Load()
	b, s := rt.baseOwner(h), rt.owner(h)
	if s != nil && s != b {
		c.invalidate(c.ctx, s, key, nil)
	}
	c.afterWrite(c.ctx, h, key, s, nil)
	if b != nil {
		c.invalidate(c.ctx, b, key, nil)
	}
}
