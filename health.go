package selector

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// keyServer is the attribute of a server's address in the Client's records.
const keyServer = "server"

// probeKey is the key a Client writes and reads back to learn the CAS ids a
// server hands out now (see Client.casNow).
const probeKey = "k8s-memcache-selector:probe"

// observe updates s's health after a request that failed with f, as
// mcrouter's failure detector does: a server that refuses connections is
// out at once (a hard TKO), one that timed out (a request, or a connection
// not made in time) cfg.timeoutsUntilDown times in a row too (a soft TKO); a broken connection retires the server's
// connections, which likely broke with it: the idle ones are closed, and
// the busy ones take no new request (see meta.Pool.CloseIdle), so that a
// request sent again goes on a connection dialed since, which a server
// that died refuses. An error of this machine's own
// (out of descriptors) or the server's answer (SERVER_ERROR) says nothing
// against the server.
func (c *Client) observe(s *server, f failure, err error) {
	c.reportFailure(s, f)
	switch f {
	case healthy, refused:
		if s.timeouts.Load() != 0 {
			s.timeouts.Store(0)
		}
		if s.keptIn.Load() && s.keptIn.Swap(false) {
			c.reportHealth(s, ServerUp, "answered", nil)
		}
	case unreachable:
		c.takeOut(s, false, err)
	case timedOut, connectTimeout:
		if int(s.timeouts.Add(1)) >= c.cfg.timeoutsUntilDown {
			c.takeOut(s, true, err)
		}
	case broken:
		s.closeIdle()
	}
}

// takeOut marks s down for this client, unless it is not up or, for a soft
// TKO, as many servers are out softly as the cap allows, and starts probing
// it.
func (c *Client) takeOut(s *server, soft bool, err error) {
	c.outBecause(err)
	if c.markDown(s, soft) {
		c.log.Warn("server out for this client: its keys go to the next server until it answers", keyServer, s.addr.str, keyError, err)
		c.reportHealth(s, ServerOut, "", err)
		// The next routing, which the run loop builds, has the stand-ins'
		// gains: until then a value read at a stand-in is not served, and
		// a write there waits for it, within its context (see Client.do).
		c.signal()
	} else if s.status() == up && !s.keptIn.Swap(true) {
		c.log.Error("server failing, but as many servers are out as the Client allows: it stays in", keyServer, s.addr.str, keyError, err)
		c.reportHealth(s, ServerFailing, "", err)
	}
}

// markDown marks s down, as takeOut says, and reports whether it did.
func (c *Client) markDown(s *server, soft bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.status() != up || c.cfg.maxDown < 0 { // failover off
		return false
	}
	if soft && (!c.othersUp(s) || !c.outs.take(s)) {
		return false
	}
	s.soft = soft
	s.downAt = time.Now()
	s.state.Store(int32(down))
	s.timeouts.Store(0)
	s.keptIn.Store(false)
	s.closeIdle()
	c.probe(s, c.cfg.probeMin)
	return true
}

// othersUp reports whether a member other than s is up. The last one is
// not taken out after timeouts (a soft TKO), which a client starved of CPU
// sees from every server at once: with none up, every request would fail
// with ErrNoServers, where most would be answered (histcheck kill-fast on a
// loaded machine: thousands a run). mcrouter's pools go fail-open likewise
// when too many of their destinations are out. Called with c.mu held.
func (c *Client) othersUp(s *server) bool {
	rt := c.rt.Load()
	if rt == nil {
		return false
	}
	for _, m := range rt.baseSrv {
		if m != s && m.status() == up {
			return true
		}
	}
	return false
}

// probe starts probing s, first after delay, unless it is probed already.
// Called with c.mu held.
func (c *Client) probe(s *server, delay time.Duration) {
	if s.probing || c.closed.Load() {
		return
	}
	s.probing = true
	c.wg.Go(func() { c.probeLoop(s, delay) })
}

// probeLoop pings s, with delays growing by half up to cfg.probeMax and
// 5-50% jitter, as mcrouter's probes, until it answers and is back (see
// Client.recover), it leaves, or the Client closes. One that left while
// out, and owes its record the slots it lost then (see serverLosses), is
// probed until it takes them: a Client started after they move back reads
// the record, and it would be missing them.
func (c *Client) probeLoop(s *server, delay time.Duration) {
	for {
		t := time.NewTimer(time.Duration(float64(delay) * (1.05 + 0.45*rand.Float64())))
		select {
		case <-c.ctx.Done():
			t.Stop()
			c.endProbe(s, true)
			return
		case <-t.C:
		}
		if s.status() == gone {
			if (!c.owedWhileGone(s) || c.payOwed(s)) && c.endProbe(s, false) {
				return
			}
		} else if err := s.call(func(w wire) error { return w.Ping(c.ctx) }); err == nil && c.recover(s) && c.endProbe(s, false) {
			return
		}
		delay = min(max(delay, c.cfg.probeMin)*3/2, c.cfg.probeMax)
	}
}

// endProbe ends s's probe, and reports whether it did: not if s is out
// again (a server that returned while its probe wrote what it owed, or one
// taken out again as it came back), whose probe goes on, as the call that
// took it out, finding it running, started none; unless force.
func (c *Client) endProbe(s *server, force bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !force && s.status() == down {
		return false
	}
	s.probing = false
	return true
}

// outCap bounds how many servers may be out at once after timeouts (soft
// TKOs), so that a fault of this client's own network cannot move the
// whole cache: mcrouter's max_tko. Servers that refuse connections (hard
// TKOs) are out whatever the count. A pool's groups share one.
type outCap struct {
	share float64

	mu      sync.Mutex
	out     map[*server]bool
	members map[*Client]int
}

func newOutCap(share float64) *outCap {
	return &outCap{share: max(share, 0), out: map[*server]bool{}, members: map[*Client]int{}}
}

// take counts s out, if the cap allows it.
func (o *outCap) take(s *server) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, m := range o.members {
		n += m
	}
	if float64(len(o.out)+1) > o.share*float64(n) {
		return false
	}
	o.out[s] = true
	return true
}

// give counts s in again.
func (o *outCap) give(s *server) {
	o.mu.Lock()
	delete(o.out, s)
	o.mu.Unlock()
}

// setMembers sets how many members c, one of the Clients sharing o, has.
func (o *outCap) setMembers(c *Client, n int) {
	o.mu.Lock()
	if n == 0 {
		delete(o.members, c)
	} else {
		o.members[c] = n
	}
	o.mu.Unlock()
}

func sortStats(ss []ServerStats) {
	slices.SortFunc(ss, func(a, b ServerStats) int { return strings.Compare(a.Addr, b.Addr) })
}
