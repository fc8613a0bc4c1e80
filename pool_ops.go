package selector

import (
	"cmp"
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// get reads key from the groups in this client's order (see Pool).
func (pl *pooled) get(key string, get func(c *Client) (*memcache.Item, error)) (*memcache.Item, error) {
	var missed []*group
	err := ErrNoServers
	for _, g := range pl.view.Load().reads {
		it, gerr := get(g.c)
		switch {
		case gerr == nil:
			pl.repair(missed, g, it)
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
// add, so that a newer value there is never replaced. A Delete may run
// between the read at g and an add, and the add would bring the value back:
// so g is read again after the adds, and the copies are deleted if its value
// changed or went; and a Delete on a pool with miss failover deletes twice
// (see pooled.delete), so that a copy added before its first pass ended is
// gone after its second.
func (pl *pooled) repair(missed []*group, g *group, it *memcache.Item) {
	if len(missed) == 0 {
		return
	}
	for _, m := range missed {
		cp := *it
		cp.Expiration = g.c.handoffTTL()
		m.c.Add(&cp)
	}
	if now, err := g.c.Get(it.Key); err != nil || now.CasID != it.CasID {
		for _, m := range missed {
			m.c.Delete(it.Key)
		}
	}
}

// delete deletes key in every group; with miss failover, twice (see repair).
func (pl *pooled) delete(key string) error {
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
	var asked []*group // the groups that missed want
	for _, g := range pl.view.Load().reads {
		items, gerr := g.c.GetMulti(want)
		if errors.Is(gerr, memcache.ErrMalformedKey) {
			return nil, gerr
		}
		for k, it := range items {
			found[k] = it
			pl.repair(asked, g, it)
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

// all runs op on every group with servers at once, and returns nil if one
// succeeded (or the error every group returned, ErrCacheMiss included),
// after key's copy is invalidated in each group where op failed.
func (pl *pooled) all(key string, op func(c *Client) error) error {
	v := pl.view.Load()
	errs := make([]error, len(v.all))
	var wg sync.WaitGroup
	for i, g := range v.all {
		wg.Go(func() { errs[i] = op(g.c) })
	}
	wg.Wait()
	var ok bool
	var first error
	for i, err := range errs {
		switch {
		case err == nil:
			ok = true
		case errors.Is(err, memcache.ErrCacheMiss) || errors.Is(err, memcache.ErrNotStored):
			first = cmp.Or(first, err)
		case errors.Is(err, ErrNoServers):
		default:
			if key != "" {
				g := v.all[i].c
				g.log.Warn("a pool's write failed in this group, which no longer has the key: it is deleted there, or before its server is used again", keyError, err)
				g.forget(key)
			}
			first = cmp.Or(first, err)
		}
	}
	if ok {
		return nil
	}
	if first == nil {
		return ErrNoServers
	}
	return first
}

// primary runs op on the primary group, and then then on the others at
// once when op succeeded there (see Pool).
func (pl *pooled) primary(key string, op func(c *Client) error, then func(c *Client) error) error {
	v := pl.view.Load()
	if v.primary == nil {
		return ErrNoServers
	}
	if err := op(v.primary.c); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, g := range v.all {
		if g != v.primary {
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
// sets the value it left in the others.
func (pl *pooled) counter(key string, op func(c *Client) (uint64, error)) (uint64, error) {
	var v uint64
	err := pl.primary(key, func(c *Client) (err error) { v, err = op(c); return },
		func(c *Client) error { return c.Set(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, v, 10)}) })
	return v, err
}

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

// forget makes sure key's server in c never serves its value, as after a
// write that c missed: it deletes it there, or logs it for replay.
func (c *Client) forget(key string) {
	if !legalKey(key) {
		return
	}
	h := c.hash(key)
	if b := c.rt.Load().baseOwner(h); b != nil {
		c.invalidate(b, key)
	}
}
