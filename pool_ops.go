package selector

import (
	"cmp"
	"errors"
	"slices"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// get reads key from the groups in this client's order (see Pool).
func (pl *pooled) get(key string, get func(c *Client) (*memcache.Item, error)) (*memcache.Item, error) {
	var missed []*group
	err := ErrNoServers
	// A repair (with miss failover) is registered before the reads it
	// copies from (see copies).
	var st *copyState
	if pl.miss {
		st = pl.copies.begin(key)
		defer pl.copies.done(key, st)
	}
	for _, g := range pl.view.Load().reads {
		it, gerr := get(g.c)
		switch {
		case gerr == nil:
			if !pl.repair(missed, g, it, st) {
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

// repair copies it, found in group g, to the groups that missed it, with
// add, so that a newer value there is never replaced, and reports whether it
// may be served. A write or delete may run between the read at g and an add,
// and the add would bring an old value back: so g is read again after the
// adds, and the copies are deleted (or logged for deletion where that fails)
// if g's value changed or went, or if a write or delete of this client's
// overtook the repair (see copies), which then serves a miss. A Delete on a
// pool with miss failover deletes twice (see pooled.delete), so that a copy
// that another client added before the first pass ended is gone after the
// second.
func (pl *pooled) repair(missed []*group, g *group, it *memcache.Item, st *copyState) bool {
	if len(missed) == 0 {
		return !pl.copies.check(st)
	}
	for _, m := range missed {
		cp := *it // with its remaining expiration (see Client.getItem)
		m.c.Add(&cp)
	}
	now, err := g.c.Get(it.Key)
	overtaken := pl.copies.check(st)
	if err != nil || now.CasID != it.CasID || overtaken {
		for _, m := range missed {
			if err := m.c.Delete(it.Key); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
				m.c.forget(it.Key)
			}
		}
		return false
	}
	return true
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
// fails has key invalidated.
func (pl *pooled) primary(key string, op func(c *Client) error, then func(c *Client) error) error {
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	p := pl.primaryFor(key)
	if p == nil {
		return ErrNoServers
	}
	if err := op(p.c); err != nil {
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
		c.invalidate(s, key, nil)
	}
	c.afterWrite(h, key, s, nil)
	if b != nil {
		c.invalidate(b, key, nil)
	}
}
