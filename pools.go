package selector

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
)

// A Pool says how a Client places each key on the Service's servers:
// Sharded (the default) puts it on one server; Replicated on every server;
// ByZone on one server in each zone. A Client of a replicated or zoned pool
// keeps one group of servers per replica (a pod, or a zone), each a
// sharded Client of its own, with failover, handoff and invalidations:
//
//   - A read goes to one group, this client's own (its zone; for a
//     replicated pool, a pod chosen per Client, so that each client keeps
//     a warm connection set and the load spreads), and fails over to the
//     others in a fixed order on an error; with WithMissFailover, on a miss
//     too, and a hit found further on is copied back with add to the groups
//     that missed, so that a group that returns empty warms from its peers.
//   - Set, Delete and Touch go to every group at once, so a write costs
//     about one round trip (a Delete two, with WithMissFailover: see
//     pooled.repair). They succeed if one group took them; a group
//     that did not has the key deleted there, or logged for deletion before
//     its server is used again, so it never serves the old value.
//   - Add, Replace, Increment, Decrement, Append and Prepend depend on the
//     value a replica holds, which may differ between replicas: they run on
//     the primary group (the first by name, the same for every client), and
//     what they leave there is then set (Add, Replace, Increment, Decrement)
//     or deleted (Append, Prepend) in the others.
//   - CompareAndSwap returns ErrPoolCAS: CAS ids differ per replica, and
//     the item's id may come from any of them.
type Pool struct {
	kind poolKind
	zone string
	miss bool
}

type poolKind int

const (
	sharded poolKind = iota
	replicated
	byZone
)

// ErrPoolCAS is returned by CompareAndSwap on a replicated or zoned pool.
var ErrPoolCAS = errors.New("selector: CompareAndSwap needs one copy of a key, and a replicated or zoned pool has several, with CAS ids of their own: use a sharded pool for keys updated by CAS")

// ZoneEnv is the environment variable that ByZone("") reads the client's
// zone from: set it from the node's topology.kubernetes.io/zone label (see
// the README).
const ZoneEnv = "SELECTOR_ZONE"

// Sharded is the default pool: each key on one server.
func Sharded() Pool { return Pool{} }

// Replicated is a pool in which every ready pod of the Service holds every
// key: for small, hot data sets.
func Replicated() Pool { return Pool{kind: replicated} }

// ByZone is a pool split by the zone of the Service's endpoints (which the
// EndpointSlice controller copies from the node's
// topology.kubernetes.io/zone label): one sharded ring per zone, each key
// on one server in each zone, and reads in zone, the client's own. "" reads
// it from the ZoneEnv environment variable.
func ByZone(zone string) Pool { return Pool{kind: byZone, zone: zone} }

// WithMissFailover makes reads fail over on a miss as well as on an error,
// and copy a hit back to the groups that missed.
func (p Pool) WithMissFailover() Pool { p.miss = true; return p }

// WithPool sets the Client's pool (default Sharded()). A Client option.
func WithPool(p Pool) Option {
	return clientOption("WithPool", func(c *clientOptions) error {
		c.pool = p
		return nil
	})
}

// pooled is the state of a Client of a replicated or zoned pool.
type pooled struct {
	Pool
	list *ServerList // every member; the groups are made of them
	cfg  clientOptions
	seed uint64 // orders the groups for this client's reads

	mu      sync.Mutex
	groups  map[string]*group
	view    atomic.Pointer[poolView]
	changed chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

// group is one replica of a pool: a pod's server, or a zone's servers.
type group struct {
	name string
	list *ServerList
	c    *Client
}

// poolView is the groups as requests use them: reads in this client's
// order, and the primary.
type poolView struct {
	reads   []*group
	primary *group
	all     []*group
}

func newPooled(c *Client, p Pool) (*pooled, error) {
	if p.kind == byZone && p.zone == "" {
		if p.zone = os.Getenv(ZoneEnv); p.zone == "" {
			return nil, fmt.Errorf("ByZone(\"\"): %s is not set; give the client's zone, or set %s from the node's topology.kubernetes.io/zone label", ZoneEnv, ZoneEnv)
		}
	}
	cfg := c.cfg
	cfg.pool = Pool{}
	cfg.maxDown = 1 // a group may lose all its servers: its reads and writes fail over to the others
	pl := &pooled{Pool: p, list: c.list, cfg: cfg, seed: rand.Uint64(),
		groups: map[string]*group{}, changed: make(chan struct{}, 1), done: make(chan struct{})}
	pl.list.subscribe(pl.changed)
	pl.refresh(c)
	pl.wg.Go(func() {
		for {
			select {
			case <-pl.changed:
				pl.refresh(c)
			case <-pl.done:
				return
			}
		}
	})
	return pl, nil
}

// refresh splits the members into groups: one a pod for a replicated pool,
// one a zone for a zoned one. A group whose members all left stays, empty,
// while it is a zone (its servers may return), and is closed while it is a
// pod (a new pod is a new group).
func (pl *pooled) refresh(c *Client) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	split := map[string][]member{}
	if r := pl.list.ring.Load(); r != nil {
		for _, m := range r.members {
			name := m.zone
			if pl.kind == replicated {
				name = m.id
			}
			split[name] = append(split[name], m)
		}
	}
	for name, ms := range split {
		g := pl.groups[name]
		if g == nil {
			g = &group{name: name, list: &ServerList{points: pl.list.points}}
		}
		if _, _, err := g.list.update(slices.Clone(ms)); err != nil {
			c.log.Error("refusing a group's servers", "group", name, keyError, err)
		}
		if g.c == nil { // after its servers are set, so that its first routing has them
			g.c = newClientOf(g.list, false, pl.cfg, c.log.With("group", name))
			pl.groups[name] = g
		}
	}
	for name, g := range pl.groups {
		if _, ok := split[name]; !ok {
			if pl.kind == replicated {
				g.c.Close()
				delete(pl.groups, name)
			} else {
				g.list.update(nil)
			}
		}
	}
	v := &poolView{}
	for _, g := range pl.groups {
		v.all = append(v.all, g)
	}
	slices.SortFunc(v.all, func(a, b *group) int { return cmp.Compare(a.name, b.name) })
	for _, g := range v.all {
		if g.list.ring.Load() != nil && v.primary == nil {
			v.primary = g
		}
	}
	v.reads = slices.Clone(v.all)
	rank := func(g *group) uint64 {
		if pl.kind == byZone && g.name == pl.zone {
			return 0 // this client's own zone first
		}
		return xxhash.Sum64String(strconv.FormatUint(pl.seed, 16)+"/"+g.name) | 1
	}
	slices.SortFunc(v.reads, func(a, b *group) int { return cmp.Compare(rank(a), rank(b)) })
	pl.view.Store(v)
}

func (pl *pooled) close() {
	close(pl.done)
	pl.wg.Wait()
	pl.list.unsubscribe(pl.changed)
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, g := range pl.groups {
		g.c.Close()
	}
}

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
				v.all[i].c.forget(key)
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
	h := xxhash.Sum64String(key)
	if b := c.rt.Load().baseOwner(h); b != nil {
		c.invalidate(b, key)
	}
}
