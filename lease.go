package selector

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// loadFunc is GetOrLoad's load.
type loadFunc = func(ctx context.Context, key string) (*memcache.Item, error)

// LoadOptions are GetOrLoad's options. The zero value is the default: wait
// up to 1 s for another client's load, then load; never serve a stale
// value.
type LoadOptions struct {
	// Wait is how long a caller waits for another client's load of the
	// key (one that holds its lease) before it loads the key itself, or,
	// with NoLoadAfterWait, returns ErrLoadWait. Zero means 1 s.
	Wait time.Duration
	// NoLoadAfterWait makes a caller whose Wait ended return ErrLoadWait
	// rather than load the key itself.
	NoLoadAfterWait bool
	// Stale lets a caller return the key's value that Invalidate
	// marked stale while another caller loads the new one, rather than
	// wait. A stale value is only served from the key's own server (not a
	// stand-in for it), and never an empty one.
	Stale bool
	// Lease is how long a lease lasts if its holder never sets the key (a
	// process that died): others wait for it that long at most. A load
	// that takes longer is returned but not cached. Zero means 10 s.
	Lease time.Duration
}

// The defaults of LoadOptions and Invalidate.
const (
	defaultLoadWait = time.Second
	defaultLease    = 10 * time.Second
	// staleTTL is how long a value that Invalidate marked stale
	// stays, for callers that allow it, if nobody loads the new one.
	staleTTL = 10 * time.Second
)

// ErrLoadWait is GetOrLoad's error, with LoadOptions.NoLoadAfterWait,
// when another client's load of the key did not end within
// LoadOptions.Wait.
var ErrLoadWait = errors.New("selector: another client's load of the key did not end in time")

func (o LoadOptions) wait() time.Duration { return cmp0(o.Wait, defaultLoadWait) }

func (o LoadOptions) leaseTTL() int32 {
	return max(1, int32((cmp0(o.Lease, defaultLease)+time.Second-1)/time.Second))
}

func cmp0(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// GetOrLoad returns key's value from the cache, or, on a miss, the value
// load returns, which it caches: cache-aside without its two failures.
// load reads key's value from where the cache gets it (a database) and
// returns the item to cache, of which Value, Flags and Expiration are used
// (the Key is key); it should return when ctx ends.
//
//   - No stampede: within this Client, one load of a key runs at a time,
//     and the callers that come meanwhile wait for its value (each
//     bounded by its ctx); across clients, memcached's lease decides: the
//     first caller to miss the key at its server gets the lease and loads,
//     the others poll for the value, up to opt.Wait, and then load
//     themselves (or return ErrLoadWait), or, with opt.Stale, return the
//     invalidated value at once.
//   - No stale set: the value loaded is written only if the key is still
//     as the caller found it before it loaded (its lease, or the value the
//     gate refused, unchanged: a compare-and-swap on its CAS), so that a
//     write, Delete or Invalidate of the key meanwhile wins, and
//     the value, which may predate it, is returned but not cached.
//
// The read is the Client's own, with failover and the gate: the lease is
// taken at the key's server now (the stand-in, while its server is out
// for this client; another client that has the server up takes its own
// there, so that during an outage each side of it loads once); a miss at a
// key that moved is handed off from its former server before anything is
// loaded. A key being copied there (a handoff or a move; see Moves) holds
// a placeholder which GetOrLoad takes for another client's lease: it
// waits for the copy. A load that fails returns its error, and releases
// the lease, so that the next caller loads at once; one that panics
// releases it and panics on. If the cache fails (no server, or its server
// errs), GetOrLoad returns its error as Get does, and loads nothing: the
// caller decides whether its database takes the load.
//
// In a replicated or zoned pool, the lease lives in the key's primary
// group (see Pool): the caller reads its own group first (unless it is the
// primary), and on a miss takes the lease there; the winner also reads the
// key in every other group before it loads, and writes its value to each
// with a compare-and-swap on what it read there, so that an invalidation
// of any group meanwhile wins there.
//
// A server without the meta protocol has no leases: there, GetOrLoad loads
// once per key within this Client only, and adds the value (which does not
// overwrite a write made meanwhile, but may follow a Delete).
//
// memcached gives the first read of an invalidated value the right to
// reload it, whatever the read: a Get or GetMulti of the Client that gets
// it hands it back with a new invalidation, so that keys read with
// GetOrLoad may be read with Get as well. A client of the cache that is
// not this one (gomemcache, or another library) keeps it: a GetOrLoad then
// waits opt.Wait for a load that never comes.
func (c *Client) GetOrLoad(ctx context.Context, key string, opt LoadOptions, load func(ctx context.Context, key string) (*memcache.Item, error)) (_ *memcache.Item, opErr error) {
	ctx, st := c.begin(ctx, opNameGetOrLoad)
	defer c.done(ctx, st, &opErr)
	if load == nil {
		return nil, errNilLoad
	}
	if err := c.admit(ctx); err != nil {
		return nil, err
	}
	defer c.calls.leave()
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return c.loads.do(ctx, key, func() (*memcache.Item, error) {
		if c.pool != nil {
			return c.pool.getOrLoad(ctx, key, opt, load)
		}
		return c.leased(ctx, key, opt, load, nil)
	})
}

// errLeaseMoved is a load's set not sent: the key's server changed since
// its lease was taken (see storeLoaded).
var errLeaseMoved = errors.New("selector: the key's server changed during its load: the value is not cached")

// leaseRead is what a lease read (mg with N) found at a server.
type leaseRead struct {
	classic bool           // the server has no leases: the read was a plain Get
	cas     uint64         // the CAS of the item or placeholder read
	won     bool           // W: this caller loads
	stale   bool           // X: the value was invalidated
	item    *memcache.Item // the stale value, if not empty
}

// send reads key with w, taking a lease of ttl seconds on a miss. It
// returns the item for a hit; for a placeholder or a stale value, none,
// and what it found in ls.
func (ls *leaseRead) send(ctx context.Context, w wire, key string, ttl int32) (*memcache.Item, error) {
	*ls = leaseRead{} // a request sent again starts over
	mw, ok := w.(metaWire)
	if !ok {
		ls.classic = true
		return w.Get(ctx, key)
	}
	o := getItem
	o.Vivify, o.VivifyTTL = true, ttl
	it, err := mw.p.Get(ctx, key, o)
	if err != nil {
		return nil, gomemcacheErr("get", err)
	}
	ls.cas = it.CAS
	if !placeholder(it) {
		return gmItem(key, it), nil
	}
	ls.won, ls.stale = it.Won(), it.Stale()
	if ls.stale && len(it.Value) > 0 {
		ls.item = gmItem(key, it)
	}
	return nil, nil
}

// invalidateOn marks key stale at w for ttl seconds (md I T); over the
// classic protocol, which cannot, it deletes key.
func invalidateOn(ctx context.Context, w wire, key string, ttl int32) error {
	if mw, ok := w.(metaWire); ok {
		return gomemcacheErr("delete", mw.p.Delete(ctx, key, meta.DeleteOptions{Invalidate: true, TTL: ttl}))
	}
	return w.Delete(ctx, key)
}

// leased is GetOrLoad's read, wait and load at c's servers (a sharded
// Client, or a pool's primary group, with others the pool's other groups).
func (c *Client) leased(ctx context.Context, key string, opt LoadOptions, load loadFunc, others []*Client) (*memcache.Item, error) {
	h := c.hash(key)
	var deadline time.Time
	pause := time.Millisecond
	again := true // a classic read once more after a handoff that may have raced a copy (see copied.moved)
	for {
		var ls leaseRead
		r := keyOp{ctx: ctx, kind: opLease, key: key, exp: opt.leaseTTL(), lease: &ls}
		s, err := c.do(h, &r)
		switch {
		case err == nil && r.got != nil: // a hit
			r.got.Expiration = 0
			return r.got, nil
		case ls.classic && errors.Is(err, memcache.ErrCacheMiss):
			it, cp, herr := c.handoff(ctx, h, key, s, c.handoffTTL(), false, handoffRead)
			if herr == nil {
				it.Expiration = 0
				return it, nil
			}
			if cp.moved() && again {
				again = false
				continue
			}
			return loadItem(ctx, key, load, func(it *memcache.Item) { c.storeLoaded(ctx, opAdd, it, 0, nil) })
		case errors.Is(err, memcache.ErrCacheMiss) && ls.cas != 0:
			// The gate refused the value there: it is replaced, unless it
			// changed meanwhile.
			return c.loadAndSet(ctx, key, load, holdOf(s, ls.cas, false), others, opt)
		case err != nil: // the cache failed: its error, as Get's
			return nil, err
		case ls.won && !ls.stale:
			if it, ok, herr := c.handoffLease(ctx, h, key, s, ls.cas); ok || herr != nil {
				return it, herr
			}
			return c.loadAndSet(ctx, key, load, holdOf(s, ls.cas, true), others, opt)
		case ls.won:
			return c.loadAndSet(ctx, key, load, holdOf(s, ls.cas, true), others, opt)
		case ls.stale && opt.Stale && ls.item != nil && s == c.rt.Load().baseOwner(h) && c.servable(ctx, s, key, h, ls.cas):
			return ls.item, nil
		}
		// Another caller holds the lease: wait for its value.
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(opt.wait())
		}
		if !now.Before(deadline) {
			if opt.NoLoadAfterWait {
				return nil, fmt.Errorf("%w: %q, after %v", ErrLoadWait, key, opt.wait())
			}
			// Its CAS changes when the holder sets the key, or anyone
			// writes, deletes or invalidates it: then this set fails.
			return c.loadAndSet(ctx, key, load, holdOf(s, ls.cas, false), others, opt)
		}
		d := min(pause+rand.N(pause), deadline.Sub(now))
		pause = min(2*pause, 50*time.Millisecond)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// handoffLease looks for key, of hash h, which missed at s where the
// caller holds its lease (of CAS cas), where it was before a recent change
// of ring. A value found there is written to s with the lease (and so
// deleted where it was: see afterWrite), and returned with ok.
func (c *Client) handoffLease(ctx context.Context, h uint64, key string, s *server, cas uint64) (_ *memcache.Item, ok bool, _ error) {
	// The key cannot have moved to s meanwhile (see copied.moved): the
	// lease's placeholder holds it.
	it, _, err := c.handoff(ctx, h, key, s, c.handoffTTL(), false, handoffRead)
	switch {
	case isCtxErr(err):
		c.release(s, key, cas)
		return nil, false, err
	case err != nil:
		return nil, false, nil
	}
	if err := c.storeLoaded(ctx, opCAS, it, cas, s); err != nil { // with the remaining expiration it had there
		c.release(s, key, cas)
	}
	it.Expiration = 0
	return it, true, nil
}

// leaseHold is a key's state at a server before a load: the CAS of what
// was there (a lease, or a value), which the load's set is conditional on,
// and whether this caller won its lease, which it releases if the load
// fails.
type leaseHold struct {
	c   *Client
	s   *server
	cas uint64
	won bool
}

func holdOf(s *server, cas uint64, won bool) leaseHold { return leaseHold{s: s, cas: cas, won: won} }

// loadAndSet loads key and writes it at h's server, and in the other
// groups of a pool, each conditional on the key's CAS there (see
// leaseHold). A lease won is released if the load fails or panics, or its
// set fails.
func (c *Client) loadAndSet(ctx context.Context, key string, load loadFunc, h leaseHold, others []*Client, opt LoadOptions) (*memcache.Item, error) {
	h.c = c
	holds := []leaseHold{h}
	for _, g := range others {
		if oh, ok := g.holdFor(ctx, key, opt); ok {
			holds = append(holds, oh)
		}
	}
	loaded := false
	defer func() {
		if !loaded {
			for _, h := range holds {
				h.release(key)
			}
		}
	}()
	return loadItem(ctx, key, load, func(it *memcache.Item) {
		loaded = true
		for i, h := range holds {
			// A set that failed releases its lease: it lost to a change of
			// the key (then the release fails too), or it went to another
			// server (the key's changed meanwhile), or it failed.
			err := h.c.storeLoaded(ctx, opCAS, it, h.cas, h.s)
			if err != nil {
				h.release(key)
			}
			if i == 0 && err != nil {
				// The key changed at the lease's server, or it failed:
				// the value is not written anywhere.
				for _, o := range holds[1:] {
					o.release(key)
				}
				return
			}
		}
	})
}

// release releases h's lease on key, if its caller won it.
func (h leaseHold) release(key string) {
	if h.won {
		h.c.release(h.s, key, h.cas)
	}
}

// loadItem runs load for key, and store (if not nil) with its item,
// which it returns as a read would.
func loadItem(ctx context.Context, key string, load loadFunc, store func(*memcache.Item)) (*memcache.Item, error) {
	it, err := load(ctx, key)
	if err != nil {
		return nil, err
	}
	if it == nil {
		return nil, fmt.Errorf("selector: load of %q returned no item and no error", key)
	}
	v := memcache.Item{Key: key, Value: it.Value, Flags: it.Flags, Expiration: it.Expiration}
	if store != nil {
		store(&v)
	}
	v.Expiration, v.CasID = 0, 0
	return &v, nil
}

// storeLoaded writes it, a loaded value, at its key's server as kind (a
// compare-and-swap on cas, or an add), with the cleanup of any write. A
// compare-and-swap on the CAS read at a server, at, is sent only while at
// is still the key's server, as mcrouter sends a lease's set back to the
// server that issued it: after a change or a failover, the token means
// nothing at the new server, where it could match another value's CAS by
// chance and overwrite a newer value. The value is then not cached.
func (c *Client) storeLoaded(ctx context.Context, kind opKind, it *memcache.Item, cas uint64, at *server) error {
	cp := *it
	cp.CasID = cas
	r := keyOp{ctx: ctx, kind: kind, key: it.Key, item: &cp, only: at}
	h := c.hash(it.Key)
	s, err := c.do(h, &r)
	if errors.Is(err, errLeaseMoved) {
		return err // not sent: nothing to clean up
	}
	if s != nil && err != nil && refusedStore(err) {
		c.notCached(ctx, s, it.Key, len(it.Value))
	}
	c.afterWrite(ctx, h, it.Key, s, err)
	return err
}

// release deletes the placeholder of key's lease, of CAS cas, at s, so
// that the next caller loads at once; a key that changed since stays.
func (c *Client) release(s *server, key string, cas uint64) {
	if s != nil {
		s.call(func(w wire) error { return w.DeleteCAS(c.ctx, key, cas) })
	}
}

// holdFor reads key at its server in c, a pool's group other than the
// lease's, taking a lease there on a miss, for a load's set (see
// loadAndSet): ok false if there is no CAS to set it on (no server, an
// error, or no meta protocol).
func (c *Client) holdFor(ctx context.Context, key string, opt LoadOptions) (leaseHold, bool) {
	var ls leaseRead
	r := keyOp{ctx: ctx, kind: opLease, key: key, exp: opt.leaseTTL(), lease: &ls}
	s, err := c.do(c.hash(key), &r)
	if ls.cas == 0 || ls.classic || err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		return leaseHold{}, false
	}
	return leaseHold{c: c, s: s, cas: ls.cas, won: ls.won}, true
}

// Invalidate marks key's value stale, for the update path of
// cache-aside: the next GetOrLoad of it (in any client) loads the new
// value while the others wait for it, or serve the stale one meanwhile
// (LoadOptions.Stale), for 10 s at most; to Get, it is a miss. A lease
// that a GetOrLoad holds on key loses its set, which may carry the value
// from before the update. Over the classic protocol it deletes key.
//
// It runs where Delete does, with Delete's cleanup: key is deleted where
// it was before a recent change of ring (first, so that a handoff copying
// it sees it), and at its server if that is out for this client (when it
// returns), so that no older value of key is served later. It returns
// ErrCacheMiss only if key was found nowhere it can be.
func (c *Client) Invalidate(ctx context.Context, key string) (opErr error) {
	ctx, st := c.begin(ctx, opNameInvalidate)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.invalidate(ctx, key)
	}
	if err := checkKey(key); err != nil {
		return err
	}
	// As DeleteContext, but for the request at key's server.
	h := c.hash(key)
	c.copies.written(key)
	deleted := false
	if rt := c.rt.Load(); len(rt.past) > 0 {
		var buf [4]*server
		for _, p := range rt.previous(h, rt.owner(h), time.Now(), buf[:0]) {
			deleted = c.invalidate(ctx, p, key, nil) || deleted
		}
	}
	c.entombAt(ctx, h, key)
	r := keyOp{ctx: ctx, kind: opInvalidate, key: key, exp: int32(staleTTL / time.Second)}
	s, err := c.do(h, &r)
	if c.afterWrite(ctx, h, key, s, err) {
		deleted = true
	}
	if deleted && errors.Is(err, memcache.ErrCacheMiss) {
		return nil
	}
	return err
}
