package selector

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// keyServer is the attribute of a server's address in the Client's records.
const keyServer = "server"

// probeKey is the key a probe writes and reads back, to learn the CAS ids
// a server hands out now (see server.seenCAS).
const probeKey = "k8s-memcache-selector:probe"

// observe updates s's health after a request that failed with f: a server
// that cannot be reached is out at once, one that timed out
// cfg.timeoutsUntilDown times in a row too; a broken connection drops the
// server's idle connections, which likely broke with it.
func (c *Client) observe(s *server, f failure, err error) {
	c.reportFailure(s, f)
	switch f {
	case healthy:
		if s.timeouts.Load() != 0 {
			s.timeouts.Store(0)
		}
		if s.failing.Load() && s.failing.Swap(false) {
			c.reportHealth(s, ServerUp, "answered", nil)
		}
	case unreachable:
		c.takeOut(s, err)
	case timedOut:
		if int(s.timeouts.Add(1)) >= c.cfg.timeoutsUntilDown {
			c.takeOut(s, err)
		}
	case broken:
		s.mc.Close()
	}
}

// takeOut marks s down for this client, unless it is not up or as many
// servers are out as cfg.maxDown allows, and starts probing it.
func (c *Client) takeOut(s *server, err error) {
	if c.markDown(s) {
		c.log.Warn("server out for this client: its keys go to the next server until it answers", keyServer, s.addr.str, keyError, err)
		c.reportHealth(s, ServerOut, "", err)
		c.signal()
	} else if s.status() == up {
		if !s.failing.Swap(true) {
			c.reportHealth(s, ServerFailing, "", err)
		}
		c.log.Error("server failing, but as many servers are out as the Client allows: it stays in", keyServer, s.addr.str, keyError, err)
	}
}

// markDown marks s down, as takeOut says, and reports whether it did.
func (c *Client) markDown(s *server) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.status() != up {
		return false
	}
	out, n := 0, 0
	if rt := c.rt.Load(); rt != nil {
		for _, m := range rt.baseSrv {
			n++
			if m.status() != up {
				out++
			}
		}
	}
	if float64(out+1) > c.cfg.maxDown*float64(n) {
		return false
	}
	s.state.Store(int32(down))
	s.timeouts.Store(0)
	s.failing.Store(false)
	s.mc.Close()
	c.probe(s, c.cfg.probeMin)
	return true
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
// 5-50% jitter, as mcrouter's probes, until it answers and has replayed its
// invalidations, it leaves, or the Client closes.
func (c *Client) probeLoop(s *server, delay time.Duration) {
	defer func() {
		c.mu.Lock()
		s.probing = false
		c.mu.Unlock()
	}()
	for {
		t := time.NewTimer(time.Duration(float64(delay) * (1.05 + 0.45*rand.Float64())))
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if s.status() == gone {
			return
		}
		if err := s.call(func(mc *memcache.Client) error { return mc.Ping() }); err == nil && c.recover(s) {
			return
		}
		delay = min(max(delay, c.cfg.probeMin)*3/2, c.cfg.probeMax)
	}
}

// recover brings back s, which answered a probe: it deletes there the keys
// written or deleted elsewhere while it was out (its invalidations), or
// flushes it if they overflowed, and then routes to it again. A server that
// restarted holds nothing older than its restart, so it needs neither;
// memcached numbers CAS ids from 1 when it starts, so new ids below the
// highest seen from it before prove a restart. recover reports whether s is
// up.
func (c *Client) recover(s *server) bool {
	c.mu.Lock()
	if s.status() != down {
		c.mu.Unlock()
		return s.status() == up
	}
	s.state.Store(int32(replaying))
	c.mu.Unlock()

	restarted := false
	if seen := s.maxCAS.Load(); seen > 0 {
		var it *memcache.Item
		err := s.call(func(mc *memcache.Client) (err error) {
			if err = mc.Set(&memcache.Item{Key: probeKey, Value: []byte{'1'}}); err == nil {
				it, err = mc.Get(probeKey)
			}
			return err
		})
		restarted = err == nil && it.CasID < seen
	}
	for {
		c.mu.Lock()
		log := s.log
		c.setLog(s, invalidations{})
		if restarted || len(log.keys) == 0 && !log.overflowed {
			s.state.Store(int32(up))
			s.maxCAS.Store(0)
			c.mu.Unlock()
			c.log.Info("server back for this client", keyServer, s.addr.str, "restarted", restarted)
			c.reportBack(s, restarted)
			c.signal()
			return true
		}
		c.mu.Unlock()
		if err := c.replay(s, log); err != nil {
			c.mu.Lock()
			for k := range log.keys {
				c.remember(s, k)
			}
			if log.overflowed {
				c.setLog(s, invalidations{overflowed: true})
			}
			s.state.Store(int32(down))
			c.mu.Unlock()
			c.log.Warn("server answered, but replaying its invalidations failed: it stays out", keyServer, s.addr.str, keyError, err)
			c.reportHealth(s, ServerOut, "replay_failed", nil)
			return false
		}
		c.reportReplay(s, log)
	}
}

// replay deletes log's keys at s, or flushes s if log overflowed. Each key
// was written or deleted at the server that stood in for s: a value found
// there is moved back to s (see moveBack), so that no copy is left there to
// be read if s goes out again. Past the bound the copies stay, and can
// serve an old value if s fails again before they expire.
func (c *Client) replay(s *server, log invalidations) error {
	if log.overflowed {
		return s.call(func(mc *memcache.Client) error { return mc.FlushAll() })
	}
	keys := make(chan string)
	errs := make(chan error, replayWorkers)
	var wg sync.WaitGroup
	for range replayWorkers {
		wg.Go(func() {
			var first error
			for k := range keys {
				if first != nil {
					continue
				}
				err := s.call(func(mc *memcache.Client) error { return mc.Delete(k) })
				if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
					first = err
					continue
				}
				c.moveBack(s, k)
			}
			errs <- first
		})
	}
	for k := range log.keys {
		keys <- k
	}
	close(keys)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// replayWorkers is how many keys replay handles at once.
const replayWorkers = 8

// moveBack moves key, which s owns again, from the server that has it
// while s is out, as a handoff would (see copyTo).
func (c *Client) moveBack(s *server, key string) {
	h := c.hash(key)
	rt := c.rt.Load()
	t := rt.owner(h)
	if t == nil || t == s || rt.baseOwner(h) != s {
		return
	}
	var it *memcache.Item
	if t.call(func(mc *memcache.Client) (err error) { it, err = mc.Get(key); return }) == nil {
		c.copyTo(s, t, it, c.handoffTTL())
	}
}

// invalidate makes sure that s, which did not get a write or delete of key
// that it would have owned, never serves key's old value: it deletes key
// there now if s is up, or else adds it to s's invalidations, which are
// replayed before s is routed to again. It reports whether it deleted key or
// queued its delete, as mcrouter's asynclog treats a delete it could not
// deliver: after it, s never serves key's old value.
func (c *Client) invalidate(s *server, key string) bool {
	c.mu.Lock()
	st := s.status()
	if st != up && (st != gone || s.lost.Load()) {
		c.remember(s, key)
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	err := s.call(func(mc *memcache.Client) error { return mc.Delete(key) })
	if f := failureOf(err); f != healthy {
		c.mu.Lock()
		c.remember(s, key)
		if st == gone {
			s.lost.Store(true)
		}
		c.mu.Unlock()
		return true
	}
	return err == nil
}

// remember adds key to s's invalidations. Past cfg.maxInvalidations keys
// for s, or cfg.maxLogged for all servers, s's log overflows instead: s is
// flushed before it is used again. Called with c.mu held.
func (c *Client) remember(s *server, key string) {
	if c.logged >= c.cfg.maxLogged {
		c.setLog(s, invalidations{overflowed: true})
		return
	}
	n, was := len(s.log.keys), s.log.overflowed
	s.log.add(key, c.cfg.maxInvalidations)
	c.logged += len(s.log.keys) - n
	c.reportLogged(s, len(s.log.keys)-n, !was && s.log.overflowed)
	s.pending.Store(true)
}

// setLog makes l the invalidations of s. Called with c.mu held.
func (c *Client) setLog(s *server, l invalidations) {
	c.logged += len(l.keys) - len(s.log.keys)
	c.reportSetLog(s, l)
	s.log = l
	s.pending.Store(len(l.keys) > 0 || l.overflowed)
}

// suspect reports whether a value of key that s just returned must not be
// used: s is routed to, but a delete of key there failed (see invalidate),
// so it is in s's invalidations. The delete is tried again; the value is
// not used either way.
func (c *Client) suspect(s *server, key string) bool {
	if !s.pending.Load() || !c.invalidated(s, key) {
		return false
	}
	err := s.call(func(mc *memcache.Client) error { return mc.Delete(key) })
	if err == nil || errors.Is(err, memcache.ErrCacheMiss) {
		c.mu.Lock()
		if !s.log.overflowed {
			n := len(s.log.keys)
			delete(s.log.keys, key)
			c.logged -= n - len(s.log.keys)
			s.pending.Store(len(s.log.keys) > 0)
		}
		c.mu.Unlock()
	}
	return true
}

// invalidated reports whether key is in s's invalidations, so that a value
// read from s is not to be trusted.
func (c *Client) invalidated(s *server, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return s.log.has(key)
}

func sortStats(ss []ServerStats) {
	slices.SortFunc(ss, func(a, b ServerStats) int { return strings.Compare(a.Addr, b.Addr) })
}
