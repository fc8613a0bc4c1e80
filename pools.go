package selector

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// A Pool says how a Client places each key on the Service's servers: the
// zero Pool, the default, puts it on one server (a sharded pool);
// Replicated on every server;
// ByZone on one server in each zone; AcrossServices on one server of each
// of several Services. A Client of such a pool keeps one group of servers
// per replica (a pod, a zone or a Service), each a sharded Client of its
// own, with failover, handoff and invalidations:
//
//   - A read goes to one group, this client's own (its zone, or the Service
//     NewClient was given; for a replicated pool, a pod chosen per Client,
//     so that each client keeps a warm connection set and the load
//     spreads), and fails over to the
//     others in a fixed order on an error; with WithMissFailover, on a miss
//     too, and a hit found further on is copied back with add to the groups
//     that missed, so that a group that returns empty warms from its peers.
//   - Set, Delete and Touch go to every group at once, so a write costs
//     about one round trip (a Delete two with WithMissFailover, so that a
//     copy another client's read put back meanwhile is gone after the
//     second). They succeed if one group took them; a group that did not
//     has the key deleted there (at its server, and at the stand-in it
//     used), or logged for deletion before its server is used again, so it
//     never serves the old value.
//   - Add, Replace, Increment, Decrement, Append and Prepend depend on the
//     value a replica holds, which may differ between replicas: they run on
//     the primary group for the key (the first group by name whose server
//     for the key is up for this client: the same for every client while
//     they agree on which servers are up), and then what they leave there
//     is set (Add, Replace) or deleted (Append, Prepend) in the others;
//     Increment and Decrement run in the others too, so that each replica
//     keeps its own expiration, and a replica where they fail has the key
//     deleted.
//   - CompareAndSwap returns ErrPoolCAS: CAS ids differ per replica, and
//     the item's id may come from any of them.
type Pool struct {
	kind   poolKind
	zone   string
	others []string // the Services of AcrossServices beside NewClient's
	miss   bool
}

type poolKind int

const (
	sharded poolKind = iota
	replicated
	byZone
	services
)

// ErrPoolCAS is returned by CompareAndSwap on a replicated or zoned pool.
var ErrPoolCAS = errors.New("selector: CompareAndSwap needs one copy of a key, and a replicated or zoned pool has several, with CAS ids of their own: use a sharded pool for keys updated by CAS")

// zoneEnv is the environment variable that ByZone("") reads the client's
// zone from: set it from the node's topology.kubernetes.io/zone label
// (docs/pools.md shows how).
const zoneEnv = "SELECTOR_ZONE"

// Replicated is a pool in which every ready pod of the Service holds every
// key: for small, hot data sets.
func Replicated() Pool { return Pool{kind: replicated} }

// ByZone is a pool split by the zone of the Service's endpoints (which the
// EndpointSlice controller copies from the node's
// topology.kubernetes.io/zone label): one sharded ring per zone, each key
// on one server in each zone, and reads in zone, the client's own. "" reads
// it from the environment variable SELECTOR_ZONE. A zone that no endpoint of
// the Service has is logged as a warning, with the zones it has. It needs
// the zones of the Service's EndpointSlices: a ServerList filled with
// SetServers, or discovered by DNS or from Endpoints (WithLegacyEndpoints),
// has none, and NewClient and NewClientFromList refuse ByZone over it.
func ByZone(zone string) Pool { return Pool{kind: byZone, zone: zone} }

// AcrossServices is a pool over several Services: NewClient's and each of
// addrs (given as NewClient's address is), one sharded ring each, with each
// key on one server of each. It is for a cache that must outlive a whole
// Service: one Service per zone or per cluster, each client naming its
// own first, in NewClient, so that its reads stay there and fail over to
// the others in the order given. Each Service is discovered with
// NewClient's options, so the client needs to list and watch the
// EndpointSlices of all of them. Only NewClient takes it.
func AcrossServices(addrs ...string) Pool {
	return Pool{kind: services, others: slices.Clone(addrs)}
}

// WithMissFailover makes reads fail over on a miss as well as on an error,
// and copy a hit back to the groups that missed.
func (p Pool) WithMissFailover() Pool { p.miss = true; return p }

// WithPool sets the Client's pool; the zero Pool is the default, a sharded
// pool: each key on one server.
func WithPool(p Pool) Option {
	return clientOpt("WithPool", func(c *clientOptions) error {
		if p.kind == sharded && p.miss {
			return errors.New("WithMissFailover is for a pool with copies of each key, and the zero Pool has one: use Replicated(), ByZone or AcrossServices with it")
		}
		c.pool = p
		return nil
	})
}

// pooled is the state of a Client of a replicated or zoned pool.
type pooled struct {
	Pool
	list   *ServerList // every member; the groups are made of them (but for AcrossServices)
	cfg    clientOptions
	seed   uint64  // orders the groups for this client's reads
	outs   *outCap // the cap on servers out, over all the groups' servers
	copies copies  // repairs in flight

	mu        sync.Mutex
	groups    map[string]*group
	view      atomic.Pointer[poolView]
	warned    string // the zones seen when ByZone's zone was last said to have no server; guarded by mu
	refreshed bool   // the groups of the first refresh are made; guarded by mu
	changed   chan struct{}
	done      chan struct{}
	wg        sync.WaitGroup
}

// group is one replica of a pool: a pod's server, or a zone's servers.
type group struct {
	name  string
	order int // AcrossServices' order: 0 for NewClient's Service
	list  *ServerList
	c     *Client
	left  time.Time // when a replicated pool's pod left; zero while it is a member
}

// poolView is the groups as requests use them: reads in this client's
// order, and the primary.
type poolView struct {
	reads   []*group
	primary *group
	all     []*group
}

// newPooled sets up the pool p of c, whose Service is own. discover starts the discovery of
// another Service for AcrossServices, and is nil for NewClientFromList.
func newPooled(c *Client, p Pool, own string, discover func(addr string) (*ServerList, error)) (*pooled, error) {
	if p.kind == byZone && !c.list.zoned {
		return nil, errors.New("ByZone needs the zones of a Service's EndpointSlices, and this list of servers has none " +
			"(filled with SetServers, or discovered by DNS or from Endpoints): give NewClient the Service's address, " +
			"or use Replicated() for a copy of each key on every server")
	}
	if p.kind == byZone && p.zone == "" {
		if p.zone = os.Getenv(zoneEnv); p.zone == "" {
			return nil, fmt.Errorf("ByZone(\"\"): %s is not set; give the client's zone, or set %s from the node's topology.kubernetes.io/zone label", zoneEnv, zoneEnv)
		}
	}
	cfg := c.cfg
	cfg.pool = Pool{}
	cfg.metrics = forGroup(cfg.metrics)
	pl := &pooled{Pool: p, list: c.list, cfg: cfg, seed: rand.Uint64(), outs: newOutCap(c.cfg.maxDown),
		groups: map[string]*group{}, changed: make(chan struct{}, 1), done: make(chan struct{})}
	if p.kind == services {
		if err := pl.discover(c, own, discover); err != nil {
			pl.close()
			return nil, err
		}
	}
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
// one a zone for a zoned one. A group whose members all left stays, empty:
// its servers may return (a pod NotReady for a while, a zone lost), with a
// CAS floor each, so that none of their values from before is served. A
// pod's group is closed once it has been gone for cfg.departedKeep.
func (pl *pooled) refresh(c *Client) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.kind == services { // the groups are fixed
		pl.publish()
		return
	}
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
	if pl.kind == byZone {
		pl.warnZone(c, split)
	}
	for name, ms := range split {
		g := pl.groups[name]
		if g != nil && !g.left.IsZero() {
			// A group whose servers all left comes back: they hold only
			// values from before, and the writes and deletes meanwhile
			// went to the other groups (this client's, and those of
			// clients started since, which never knew the group). As a
			// sharded Client's server that gains slots (see gains), none
			// of them is served: a CAS floor is taken at each server,
			// before its servers are set (see floorAll).
			g.c.floorAll()
		}
		if g == nil {
			g = &group{name: name, list: &ServerList{points: pl.list.points, hashing: pl.list.hashing}}
		}
		if _, _, err := g.list.update(slices.Clone(ms)); err != nil {
			c.log.Error("refusing a group's servers", "group", name, keyError, err)
		}
		if g.c == nil { // after its servers are set, so that its first routing has them
			g.c = newClientOf(g.list, false, pl.cfg, c.log.With("group", name), pl.outs)
			g.c.loads = c.loads // a write through a group ends joins of c's loads of the key
			pl.groups[name] = g
			if pl.refreshed {
				// A group that joins after the first refresh holds only
				// values from before it joined: writes and deletes of every
				// client went elsewhere meanwhile, and a client that saw it
				// leave may have closed before it wrote its record of that
				// (see lostKey). As a sharded Client's server that gains
				// slots (see gains), none of them is served: a CAS floor
				// is taken at each of its servers before it is read.
				g.c.floorAll()
			}
		}
		g.left = time.Time{}
	}
	now := time.Now()
	for name, g := range pl.groups {
		if _, ok := split[name]; ok {
			continue
		}
		if g.left.IsZero() {
			g.left = now
			g.list.update(nil)
		}
		if pl.kind == replicated && now.Sub(g.left) >= pl.cfg.departedKeep {
			g.c.Close()
			delete(pl.groups, name)
		}
	}
	pl.refreshed = true
	pl.publish()
}

// warnZone warns that ByZone's zone has no server, so that every read
// leaves it: once, and again when the zones seen change.
func (pl *pooled) warnZone(c *Client, split map[string][]member) {
	if _, ok := split[pl.zone]; ok {
		pl.warned = ""
		return
	}
	var zones []string
	for _, z := range slices.Sorted(maps.Keys(split)) {
		zones = append(zones, strconv.Quote(z))
	}
	if seen := strings.Join(zones, ", "); seen != "" && seen != pl.warned {
		pl.warned = seen
		hint := ""
		if _, ok := split[""]; ok {
			hint = ` ("" is an endpoint whose node has no topology.kubernetes.io/zone label)`
		}
		c.log.Warn(fmt.Sprintf("ByZone(%q): no server of the Service is in that zone, so every read leaves it: the zones of its endpoints are %s%s; give one of them",
			pl.zone, seen, hint))
	}
}

// publish orders the groups for requests: a primary the same for every
// client, and reads in this client's order.
func (pl *pooled) publish() {
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
		switch {
		case pl.kind == byZone && g.name == pl.zone:
			return 0 // this client's own zone first
		case pl.kind == services:
			return uint64(g.order) // its own Service first, then in the order given
		}
		return xxhash.Sum64String(strconv.FormatUint(pl.seed, 16)+"/"+g.name) | 1
	}
	slices.SortFunc(v.reads, func(a, b *group) int { return cmp.Compare(rank(a), rank(b)) })
	pl.view.Store(v)
}

// discover makes AcrossServices' groups: c's own Service, and the others,
// each with a ServerList of its own, which its Client closes.
func (pl *pooled) discover(c *Client, own string, discover func(addr string) (*ServerList, error)) error {
	if discover == nil {
		return errors.New("AcrossServices needs NewClient, which discovers each Service; NewClientFromList has one list of servers")
	}
	pl.groups[own] = &group{name: own, list: c.list, c: newClientOf(c.list, false, pl.cfg, c.log.With("group", own), pl.outs)}
	pl.groups[own].c.loads = c.loads
	for i, addr := range pl.others {
		if _, ok := pl.groups[addr]; ok || addr == "" {
			return fmt.Errorf("AcrossServices: Service %q given twice (NewClient's own is %q): give each Service once", addr, own)
		}
		ss, err := discover(addr)
		if err != nil {
			return fmt.Errorf("AcrossServices: %w", err)
		}
		g := &group{name: addr, order: i + 1, list: ss}
		g.c = newClientOf(ss, true, pl.cfg, c.log.With("group", addr), pl.outs)
		g.c.loads = c.loads
		pl.groups[addr] = g
		ss.subscribe(pl.changed)
	}
	return nil
}

func (pl *pooled) close() {
	close(pl.done)
	pl.wg.Wait()
	pl.list.unsubscribe(pl.changed)
	for _, g := range pl.groups {
		g.list.unsubscribe(pl.changed)
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, g := range pl.groups {
		g.c.Close()
	}
}
