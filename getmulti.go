package selector

import (
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

// GetMulti gets the items of keys, as memcache.Client.GetMulti: one batch
// per server, all at once. A batch whose server cannot be reached, or
// whose connection broke, goes again to the keys' servers then; keys that
// missed and moved are handed off, one batch per server they were at. It
// returns the items found and the last error of a batch.
func (c *Client) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	hashes := make(map[string]uint64, len(keys))
	for _, k := range keys {
		if !legalKey(k) {
			return nil, memcache.ErrMalformedKey
		}
		hashes[k] = xxhash.Sum64String(k)
	}
	found := make(map[string]*memcache.Item, len(keys))
	owner := make(map[string]*server, len(keys)) // where each key was last asked
	var mu sync.Mutex
	var last error
	pending := keys
	for attempt := 0; attempt < 3 && len(pending) > 0; attempt++ {
		rt := c.rt.Load()
		batches := map[*server][]string{}
		for _, k := range pending {
			s := rt.owner(hashes[k])
			if s == nil {
				return found, ErrNoServers
			}
			owner[k] = s
			batches[s] = append(batches[s], k)
		}
		pending = nil
		var wg sync.WaitGroup
		for s, ks := range batches {
			wg.Go(func() {
				var items map[string]*memcache.Item
				err := s.call(func(mc *memcache.Client) (err error) { items, err = mc.GetMulti(ks); return })
				f := failureOf(err)
				c.observe(s, f, err)
				mu.Lock()
				defer mu.Unlock()
				for k, it := range items {
					found[k] = it
					s.seenCAS(it.CasID)
				}
				switch {
				case f == unreachable || f == broken && attempt == 0:
					for _, k := range ks {
						if found[k] == nil {
							pending = append(pending, k)
						}
					}
					last = appError(err)
				case err != nil:
					last = appError(err)
				}
			})
		}
		wg.Wait()
	}
	if len(pending) == 0 {
		c.handoffMulti(keys, hashes, owner, found)
	}
	return found, last
}

// handoffMulti hands off the keys that missed and moved: each is asked at
// the first server it was at before that can be read, in one batch per
// server, and a hit is copied to its server as handoff does.
func (c *Client) handoffMulti(keys []string, hashes map[string]uint64, owner map[string]*server, found map[string]*memcache.Item) {
	rt := c.rt.Load()
	if len(rt.past) == 0 {
		return
	}
	now := time.Now()
	batches := map[*server][]string{}
	var buf [4]*server
	for _, k := range keys {
		if found[k] != nil || owner[k] == nil {
			continue
		}
		for _, p := range rt.previous(hashes[k], owner[k], now, buf[:0]) {
			if p.readable() && !c.invalidated(p, k) {
				batches[p] = append(batches[p], k)
				break
			}
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p, ks := range batches {
		wg.Go(func() {
			var items map[string]*memcache.Item
			err := p.call(func(mc *memcache.Client) (err error) { items, err = mc.GetMulti(ks); return })
			if f := failureOf(err); f != healthy {
				c.sourceFailed(p, f, err)
			}
			for k, it := range items {
				cp := c.copyTo(owner[k], p, it, c.handoffTTL())
				mu.Lock()
				found[k] = cp
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}
