package selector

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Client is a memcached client for the servers of a ServerList, with the
// method set of *memcache.Client and the same errors, which it uses for the
// protocol. Over what gomemcache does, it
//
//   - fails over: a server that refuses connections, or times out 3 times
//     in a row, is out for this client, and its keys go to the next server
//     along the ring (as if it had been removed: no other key moves) until
//     probes find it answering; a request that failed because its server
//     went out is retried there (see the methods for which);
//   - never returns a value older than one it wrote or deleted (the
//     contract, its cases and its bounds: docs/consistency.md): every read
//     passes one gate and every write one cleanup, so that the keys written
//     or deleted elsewhere while a server was out are deleted there before
//     they are served, copies are conditional and bounded, and a server
//     that gains a key in a change of ring serves none of its older values;
//   - hands keys off when they move: a Get that misses at a key's new
//     server reads where the key was, and copies a hit with add; a write or
//     delete of a key that moved also deletes it where it was;
//   - closes the connections to servers that left.
//
// Kubernetes stays the authority on the members: a server it removes
// leaves, and one it keeps but this client finds dead is out for this
// client only. At most half the servers are out at once after timeouts
// (Failover.MaxOut), so that a fault of this client's own network cannot
// move the whole cache: past that, requests go to their servers and return
// their errors; nor is the last server up. A server that refuses
// connections is out whatever the count.
//
// A Client is safe for concurrent use. Its zero value is not usable: make
// one with NewClient or NewClientFromList.
type Client struct {
	list    *ServerList
	ownList bool // Close closes list
	cfg     clientOptions
	log     *slog.Logger
	rt      atomic.Pointer[routing]
	routed  atomic.Pointer[chan struct{}] // closed once the routing after rt is published (see awaitRouting)
	pool    *pooled                       // a replicated or zoned pool's groups, or nil

	inval       *invalLog               // the keys each server must forget before it serves them
	lossesAgain pendingLosses           // the second passes of the records of lost slots, which Close runs if still due
	installing  atomic.Pointer[routing] // the routing refresh is about to publish, while it marks (see remark)
	outs        *outCap                 // the cap on servers out after timeouts, shared by a pool's groups
	copies      copies                  // handoff copies in flight
	gains       gains                   // the slots each server gained, and its CAS floor then
	mover       *mover                  // the moves of keys after a change of servers (see Moves)
	loads       *flights                // GetOrLoad's loads in flight, one per key; a pool's groups share their Client's
	tombs       tombs                   // whether deletes leave tombstones (see tombstone.go)

	// refreshing serializes refresh and dropPast, the writers of rt; it is
	// held across the floors' round trips, which mu is not, so that a
	// request that takes a server out does not wait for them.
	refreshing sync.Mutex
	mu         sync.Mutex         // guards servers and the servers' fields it says
	servers    map[string]*server // by address: the members, and those that left within cfg.departedKeep
	changed    chan struct{}      // a change of members or health to apply

	calls       *calls                // the calls in flight, which Close waits for
	cause       atomic.Pointer[error] // the last failure that can take a server out (see noServers)
	notCachedAt atomic.Int64          // when a value GetOrLoad could not cache was last logged (unix ns)

	ctx    context.Context // ends on Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

// NewClient returns a Client for the Service named by addr, which it
// discovers as NewServerList does, with the same Options and the Client's
// own: WithTimeout, WithMaxIdleConns, WithDialContext, WithFailover,
// WithHandoff, WithMoves and WithPool.
func NewClient(ctx context.Context, addr string, opt ...Option) (*Client, error) {
	o, err := newOptions(opt)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	ss, err := startDiscovery(ctx, addr, o)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	c := newClientOf(ss, true, o.client, discoveryLog(o, addr), nil)
	discover := func(addr string) (*ServerList, error) { return startDiscovery(ctx, addr, o) }
	if err := c.withPool(addr, discover); err != nil {
		c.Close()
		return nil, fmt.Errorf("selector: %w", err)
	}
	return c, nil
}

// NewClientFromList returns a Client for the servers of ss, which it
// follows as they change, and does not close: a ServerList from
// NewServerList, or one filled with SetServers for a fixed set of servers.
// It takes the Client's own options, WithLogger, WithSlog and WithMetrics
// (with which a list filled with SetServers reports its servers and their
// changes too, unless an earlier Client gave it Metrics); an Option of
// discovery is an error, since ss has its discovery already.
func NewClientFromList(ss *ServerList, opt ...Option) (*Client, error) {
	if ss == nil {
		return nil, fmt.Errorf("selector: %w", errNilServerList)
	}
	o, err := newOptions(opt)
	if err == nil && o.discovery != "" {
		err = errDiscoveryOption(o.discovery)
	}
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	ss.reportTo(o.client.metrics)
	c := newClientOf(ss, false, o.client, slog.New(newLimitHandler(o.log, errorPeriod)), nil)
	if err := c.withPool("", nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("selector: %w", err)
	}
	return c, nil
}

// withPool sets up the groups of a replicated, zoned or combined pool; own
// and discover are for AcrossServices (see newPooled).
func (c *Client) withPool(own string, discover func(addr string) (*ServerList, error)) (err error) {
	if c.cfg.pool.kind != sharded {
		c.pool, err = newPooled(c, c.cfg.pool, own, discover)
	}
	return err
}

// newClientOf returns a Client of ss's servers; outs is the cap on servers
// out that it shares with other Clients (a pool's groups), or nil for its
// own.
func newClientOf(ss *ServerList, own bool, cfg clientOptions, log *slog.Logger, outs *outCap) *Client {
	if outs == nil {
		outs = newOutCap(cfg.maxDown)
	}
	c := &Client{list: ss, ownList: own, cfg: cfg, log: log, servers: map[string]*server{}, changed: make(chan struct{}, 1),
		inval: newInvalLog(cfg.maxInvalidations, cfg.maxLogged), outs: outs, mover: newMover(cfg.moves), calls: newCalls(),
		loads: &flights{}, tombs: tombs{born: time.Now(), window: cfg.handoffWindow}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	routed := make(chan struct{})
	c.routed.Store(&routed)
	ss.subscribe(c.changed)
	c.refresh(time.Now()) // so that the first request sees the servers
	c.wg.Go(c.run)
	if cfg.moves.Rate >= 0 {
		c.wg.Go(c.moveLoop)
	}
	return c
}

// Close waits for the calls in flight to return (a GetOrLoad's load
// included), deletes at each server the keys it logged for it while the
// server was out (within 4 timeouts; see docs/consistency.md), stops the
// Client's goroutines, waits for them, closes its connections and, for a
// Client from NewClient, stops discovery. Calls
// made after Close began return ErrClosed, and send nothing: unlike
// gomemcache's Client, which may still be used after its Close (which
// only closes its idle connections). It is idempotent and returns nil.
func (c *Client) Close() error {
	// The calls in flight clean up after their writes with the Client's
	// goroutines and context, stopped below.
	if c.calls.close() {
		c.closed.Store(true)
		if c.pool != nil {
			c.pool.close()
		}
		c.cancel()
		c.wg.Wait()
		c.replayOnClose() // what the drains it just stopped had left
		c.againOnClose()
		c.mu.Lock()
		for _, s := range c.servers {
			s.retire()
		}
		c.mu.Unlock()
		c.outs.setMembers(c, 0)
		c.list.unsubscribe(c.changed)
		if c.ownList {
			c.list.Close()
		}
	}
	return nil
}

// detach runs f, the part of a request that must not stop halfway (a
// copy's check, fill or undo), on the Client's context (see detach).
func (c *Client) detach(ctx context.Context, f func()) error { return detach(ctx, c.ctx, &c.wg, f) }

// detach runs f, whose steps are bounded by themselves (each within the
// timeout) and must not stop halfway. The caller waits for f until ctx
// ends, then returns ctx's error and leaves f to finish in the background,
// in wg, which Close waits for: a request that must end by its deadline
// ends then so. A ctx that cannot end, or is bg, runs f inline.
func detach(ctx, bg context.Context, wg *sync.WaitGroup, f func()) error {
	if ctx.Done() == nil || ctx == bg {
		f()
		return nil
	}
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		f()
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		select {
		case <-done: // finished as ctx ended
			return nil
		default:
			return ctx.Err()
		}
	}
}

// hash returns the hash of key that the Client's rings are read with.
func (c *Client) hash(key string) uint64 { return c.list.hashing.sum(key) }

// signal asks the run loop to apply a change.
func (c *Client) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// run applies changes of members and health, and drops past rings as they
// expire, until Close.
func (c *Client) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-c.changed:
		case <-t.C:
		case <-c.ctx.Done():
			return
		}
		next := c.refresh(time.Now())
		t.Reset(next)
	}
}

// refresh publishes the routing of the ServerList's current ring and the
// servers' health, and returns when it should run again: when a past ring
// or a departed server expires.
func (c *Client) refresh(now time.Time) time.Duration {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	return c.refreshLocked(now)
}

// refreshLocked is refresh, with c.refreshing held.
func (c *Client) refreshLocked(now time.Time) time.Duration {
	c.mu.Lock()
	var returned []string
	defer func() {
		c.mu.Unlock()
		for _, a := range returned { // logged without the lock, which a Logger may want
			c.log.Info("server returned; it is used once it answers", keyServer, a)
		}
	}()
	base := c.list.ring.Load()
	member := map[*server]bool{}
	if base != nil {
		for _, m := range base.members {
			s := c.servers[m.addr.str]
			switch {
			case s == nil:
				cc := c.cfg.conn
				cc.log = c.log
				s = newServer(m.addr, cc)
				c.servers[m.addr.str] = s
				c.learn(s, true)
			case s.status() == gone: // it returns, maybe with values that were overwritten since
				s.downAt, s.soft = s.left, false
				s.left = time.Time{}
				s.unretire()
				s.state.Store(int32(down))
				c.probe(s, 0)
				returned = append(returned, s.addr.str)
			}
			member[s] = true
		}
	}
	next := time.Hour
	for a, s := range c.servers {
		switch {
		case member[s]:
		case s.status() != gone:
			if s.status() == down && s.soft {
				c.outs.give(s)
			}
			s.state.Store(int32(gone))
			s.left = now
		case now.Sub(s.left) >= c.cfg.departedKeep:
			c.inval.forget(s)
			delete(c.servers, a)
		default:
			next = min(next, c.cfg.departedKeep-now.Sub(s.left))
		}
	}

	// With discovery, a server that left is read and sent deletes only
	// while Kubernetes says it serves: terminating, in its grace period.
	// Without, until it fails.
	regained := false // a server that drains is read again: its keys are to move
	if c.list.drains {
		dr := c.list.drainingSet()
		for _, s := range c.servers {
			if s.status() == gone {
				lost := !slices.Contains(dr, s.addr.str)
				regained = s.lost.Swap(lost) && !lost || regained
			}
		}
	}

	rt, dropped := newRouting(routingInput{
		base:    base,
		server:  func(a *staticAddr) *server { return c.servers[a.str] },
		live:    func(s *server) bool { return s.status() == up },
		old:     c.rt.Load(),
		now:     now,
		window:  c.cfg.handoffWindow,
		maxPast: c.cfg.maxPast,
	})
	if c.cfg.handoffWindow == 0 {
		dropped, rt.past = append(dropped, rt.past...), nil
	}
	// A server that left and is in no past ring any more can no longer be
	// told the keys that it lost: if it returns, none of its values from
	// before is served (see invalLog).
	for _, p := range dropped {
		for _, s := range p.srv {
			if s.status() == gone && !rt.inPast(s) {
				c.inval.overflow(s)
			}
		}
	}
	n := 0
	if base != nil {
		n = len(base.members)
	}
	c.outs.setMembers(c, n)
	for _, p := range rt.past {
		next = min(next, p.until.Sub(now))
	}
	// Before rt is read, without mu (a walk of every slot, and floors
	// taken at servers, which a server's probe or its failure must not
	// wait for): a server's health may change meanwhile, which rt's
	// readers check (see routing.ownerNow), and which asks for the next
	// refresh.
	c.mu.Unlock()
	if old := c.rt.Load(); old != nil && !sameServers(old, rt) {
		c.settleMarked()
	}
	c.installing.Store(rt)
	defer c.installing.Store(nil)
	regains := baseRegains(c.rt.Load(), rt)
	gained, lost, losses := c.gains.record(c.rt.Load(), rt)
	losses = withOwed(losses, gained)
	for i := range losses {
		losses[i].member = lostAsMember(losses[i], rt)
	}
	if len(rt.past) > 0 && rt.past[0].r == c.rt.Load().live {
		rt.past[0].gains = lost
	}
	var wg sync.WaitGroup
	var failed []*gain
	wg.Go(func() { failed = c.takeFloors(gained) })
	wg.Go(func() { c.noteRegains(c.ctx, regains) })
	c.noteLosses(c.ctx, losses, false)
	wg.Wait()
	c.gains.fallBack(failed)
	c.mu.Lock()
	// A server that left keeps its connections while it may still be read:
	// a terminating pod in a past ring is read and listed by every handoff
	// and move, and a connection dialed per request would leave thousands
	// in TIME-WAIT, enough to run out of local ports.
	for _, s := range c.servers {
		switch {
		case s.status() != gone:
		case s.lost.Load() || !rt.inPast(s):
			s.retire()
		default: // read again: it was taken for lost before Kubernetes said it drains
			s.retired.Store(false)
		}
	}
	old := c.rt.Load()
	if len(rt.past) > 0 && (old == nil || old.base != rt.base && ringID(old) != ringID(rt) || liveChanged(old, rt) || regained) {
		// New members, or a member back in the live ring (one that
		// returns after it left is out until it answers): move the keys
		// that changed owner. Noted before the routing is published, so
		// that MoveStats.Busy is true from when Stats shows it.
		c.mover.newMembers(now)
	}
	c.publish(rt)
	c.noteLossesAgain(losses)
	return max(next, time.Millisecond)
}

// dropPast forgets the past rings: after a FlushAll, no key is handed off
// from before it.
func (c *Client) dropPast() {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	rt := *c.rt.Load()
	rt.past = nil
	c.publish(&rt)
}
