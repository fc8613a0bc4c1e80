package selector

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// GetMultiContext gets the items of keys, as memcache.Client.GetMulti: one batch
// per server, all at once. A batch whose server cannot be reached, or
// whose connection broke, goes again to the keys' servers then; keys that
// missed and moved are handed off, one batch per server they were at. It
// returns the items found and the last error of a batch.
func (c *Client) GetMultiContext(ctx context.Context, keys []string) (items map[string]*memcache.Item, opErr error) {
	ctx, st := c.begin(ctx, opNameGetMulti)
	defer c.doneMulti(ctx, st, keys, &items, &opErr)
	return c.getMulti(ctx, keys)
}

// getMulti is GetMultiContext without its report: apart, so that its
// goroutines capture ctx by value (see Client.begin).
func (c *Client) getMulti(ctx context.Context, keys []string) (map[string]*memcache.Item, error) {
	if err := c.admit(ctx); err != nil {
		return nil, err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.getMulti(keys)
	}
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
		hashes[i] = c.hash(k)
	}
	return c.getMultiHashed(ctx, keys, hashes, true)
}

// getMultiHashed is getMulti's batches for keys of hashes hashes, and,
// with handoff, the handoff of those that missed and moved.
func (c *Client) getMultiHashed(ctx context.Context, keys []string, hashes []uint64, handoff bool) (map[string]*memcache.Item, error) {
	found := make(map[string]*memcache.Item, len(keys))
	owner := make([]*server, len(keys)) // where each key was last asked
	var mu sync.Mutex
	var last, retried error           // a batch's error; the last one of a batch sent again
	pending := make([]int, len(keys)) // indexes into keys
	for i := range pending {
		pending[i] = i
	}
	for attempt := 0; attempt < 4 && len(pending) > 0; attempt++ {
		rt := c.rt.Load()
		var bsBuf [4]batch
		bs := bsBuf[:0]
		routed := pending[:0] // in place: pending is read no further
		for _, i := range pending {
			s, newStandIn := rt.ownerNow(hashes[i])
			if newStandIn {
				continue // not trusted yet (see routing.ownerNow): a miss
			}
			if s == nil {
				return found, c.noServers()
			}
			owner[i] = s
			routed = append(routed, i)
			bs = countIn(bs, s)
		}
		// The batches' keys, end to end in one slice.
		idx := make([]int, len(routed))
		for j := range bs {
			bs[j].keys, idx = idx[:0:bs[j].n], idx[bs[j].n:]
		}
		for _, i := range routed {
			for j := range bs {
				if bs[j].s == owner[i] {
					bs[j].keys = append(bs[j].keys, i)
					break
				}
			}
		}
		pending = pending[:0]
		if len(bs) == 0 {
			break
		}
		// settle reports b's outcome, err, once its hits are in found,
		// and has its keys sent again if its server could not be reached.
		settle := func(b batch, start time.Time, err error) {
			f := failureOf(err)
			if f != healthy || b.s.timeouts.Load() != 0 || b.s.keptIn.Load() {
				c.observe(b.s, f, err)
			}
			c.batchDone(ctx, b.s, len(b.keys), start, err)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case f == unreachable || f == connectTimeout || f == broken && attempt < 2:
				// Sent again: its error is the caller's only if the keys
				// are still pending after the last attempt.
				for _, i := range b.keys {
					if found[keys[i]] == nil {
						pending = append(pending, i)
					}
				}
				retried = appError(err)
			case err != nil:
				last = appError(err)
			}
		}
		// get is a batch to a server not known to speak the meta protocol,
		// on a goroutine of its own.
		get := func(b batch) {
			start := c.stepStart()
			ks := make([]string, 0, len(b.keys))
			var err error
			for _, i := range b.keys {
				if err = c.clean(ctx, b.s, keys[i], false); err != nil {
					break
				}
				ks = append(ks, keys[i])
			}
			var items map[string]*memcache.Item
			if err == nil {
				err = b.s.call(func(w wire) (err error) { items, err = w.GetMulti(ctx, ks); return })
			}
			for k, it := range items {
				if !c.servable(ctx, b.s, k, c.hash(k), it.CasID) {
					delete(items, k)
				}
			}
			mu.Lock()
			for k, it := range items {
				found[k] = it
			}
			mu.Unlock()
			settle(b, start, err)
		}
		// The batches to servers that speak the meta protocol are all
		// sent first, and then read one after the other on this
		// goroutine: about one round trip for all, without a goroutine
		// each (see meta.Batch). Their keys are cleaned before any is
		// sent: a clean's delete (at a key's server, or at its stand-in)
		// on a connection where a batch of this goroutine waits unread
		// would wait forever if the batch held the connection's read
		// role, which only this goroutine's Wait takes up
		// (TestGetMultiCleansBeforeItsBatches).
		var wg sync.WaitGroup
		var sentBuf [4]sentBatch
		sent := sentBuf[:0]
		n := 0
		for _, b := range bs {
			n += len(b.keys)
		}
		ks := make([]string, n) // the batches' keys, end to end
		for _, b := range bs {
			if b.s.proto.Load() != protoMeta {
				wg.Go(func() { get(b) })
				continue
			}
			sb := sentBatch{b: b, start: c.stepStart()}
			sb.ks = ks[:0:len(b.keys)]
			ks = ks[len(b.keys):]
			for _, i := range b.keys {
				if sb.err = c.clean(ctx, b.s, keys[i], false); sb.err != nil {
					break
				}
				sb.ks = append(sb.ks, keys[i])
			}
			sent = append(sent, sb)
		}
		for i := range sent {
			if sb := &sent[i]; sb.err == nil {
				sb.b.s.inflight.Add(1)
				bt, err := sb.b.s.meta.p.StartGetMulti(ctx, sb.ks, getItem)
				if err != nil {
					sb.err = gomemcacheErr("get", err)
					sb.b.s.end(sb.err)
				} else {
					sb.bt, sb.started = bt, true
				}
			}
		}
		for i := range sent {
			sb := &sent[i]
			err := sb.err
			if sb.started {
				err = c.readBatch(ctx, sb, hashes, &mu, found)
			}
			settle(sb.b, sb.start, err)
		}
		wg.Wait()
	}
	if len(pending) == 0 && handoff {
		c.handoffMulti(ctx, keys, hashes, owner, found)
	} else if last == nil {
		last = retried
	}
	return found, last
}

// sentBatch is a GetMulti's batch to a server that speaks the meta
// protocol, sent (started) unless err, with keys ks, and not read yet.
type sentBatch struct {
	b       batch
	ks      []string
	start   time.Time
	bt      meta.Batch
	started bool
	err     error
}

// readBatch reads sb's replies and puts its hits in found, under mu, but
// those not servable (see servable) and placeholders (see metaWire.missed);
// it returns the batch's error, and ends the request at sb's server. A
// server found not to speak the meta protocol after all gets the batch
// again in the classic one.
func (c *Client) readBatch(ctx context.Context, sb *sentBatch, hashes []uint64, mu *sync.Mutex, found map[string]*memcache.Item) error {
	s, mw := sb.b.s, sb.b.s.meta
	err := gomemcacheErr("get", sb.bt.Wait(ctx))
	if n := sb.bt.Hits(); n > 0 {
		its := make([]memcache.Item, n) // one allocation for all
		n = 0
		for j, i := range sb.b.keys {
			it, ok := sb.bt.Item(j)
			if !ok || mw.missed(ctx, sb.ks[j], it) || !c.servable(ctx, s, sb.ks[j], hashes[i], it.CAS) {
				continue
			}
			its[n] = memcache.Item{Key: sb.ks[j], Value: it.Value, Flags: it.ClientFlags, CasID: it.CAS}
			mu.Lock()
			found[sb.ks[j]] = &its[n]
			mu.Unlock()
			n++
		}
	}
	sb.bt.Release()
	if errors.Is(err, meta.ErrUnknownCommand) { // as server.call
		s.useClassic()
		var items map[string]*memcache.Item
		items, err = s.classic.GetMulti(ctx, sb.ks)
		for k, it := range items {
			if c.servable(ctx, s, k, c.hash(k), it.CasID) {
				mu.Lock()
				found[k] = it
				mu.Unlock()
			}
		}
	}
	s.end(err)
	return err
}

// batch is the keys of a GetMulti, by index, that go to one server.
type batch struct {
	s    *server
	keys []int
	n    int // while a GetMulti counts its keys, before they are added
}

// countIn counts a key of server s in bs (see batch.n).
func countIn(bs []batch, s *server) []batch {
	for j := range bs {
		if bs[j].s == s {
			bs[j].n++
			return bs
		}
	}
	return append(bs, batch{s: s, n: 1})
}

// addTo adds key i of server s to bs: a slice, not a map, as a GetMulti
// goes to few servers.
func addTo(bs []batch, s *server, i int) []batch {
	for j := range bs {
		if bs[j].s == s {
			bs[j].keys = append(bs[j].keys, i)
			return bs
		}
	}
	return append(bs, batch{s: s, keys: []int{i}})
}

// handoffMulti hands off the keys that missed and moved: each is asked at
// the first server it was at before that can be read, in one batch per
// server, and a hit is copied to its server as handoff does. Keys that
// missed there too are read again at their servers (see copied.moved).
func (c *Client) handoffMulti(ctx context.Context, keys []string, hashes []uint64, owner []*server, found map[string]*memcache.Item) {
	rt := c.rt.Load()
	if len(rt.past) == 0 {
		return
	}
	now := time.Now()
	var bs []batch
	var buf [4]*server
	for i, k := range keys {
		if found[k] != nil || owner[i] == nil {
			continue
		}
		for _, p := range rt.previous(hashes[i], owner[i], now, buf[:0]) {
			if logged := c.inval.lookup(p, k); p.readable() && !logged {
				bs = addTo(bs, p, i)
				break
			}
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var again []int // indexes into keys
	for _, b := range bs {
		wg.Go(func() {
			ks := make([]string, len(b.keys))
			sts := make([]*copyState, len(b.keys)) // registered before the read (see handoff)
			for j, i := range b.keys {
				ks[j] = keys[i]
				sts[j] = c.copies.begin(keys[i])
			}
			end := func() { // by the copies' part, which may outlive ctx
				for j, i := range b.keys {
					c.copies.done(keys[i], sts[j])
				}
			}
			var items map[string]*memcache.Item
			err := b.s.call(func(w wire) (err error) { items, err = w.GetMultiForCopy(ctx, ks, c.handoffTTL()); return })
			if f := failureOf(err); f != healthy && f != abandoned {
				c.sourceFailed(b.s, f, err)
			}
			copied := make([]*memcache.Item, len(b.keys))
			if c.detach(ctx, func() { // see copyTo
				defer end()
				for j, i := range b.keys {
					if it := items[keys[i]]; it != nil && c.servable(c.ctx, b.s, keys[i], hashes[i], it.CasID) {
						copied[j], _ = c.copyTo(owner[i], b.s, it, sts[j], handoffRead)
					}
				}
			}) != nil {
				return
			}
			mu.Lock()
			for j, i := range b.keys {
				if cp := copied[j]; cp != nil {
					cp.Expiration = 0 // as gomemcache's GetMulti
					found[keys[i]] = cp
				} else if err == nil && items[keys[i]] == nil {
					again = append(again, i)
				}
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(again) == 0 {
		return
	}
	ks, hs := make([]string, len(again)), make([]uint64, len(again))
	for j, i := range again {
		ks[j], hs[j] = keys[i], hashes[i]
	}
	more, _ := c.getMultiHashed(ctx, ks, hs, false)
	maps.Copy(found, more)
}
