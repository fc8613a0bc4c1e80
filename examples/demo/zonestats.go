package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// statsTimeout bounds the demo's own requests to a memcached: its stats,
// and the keys it counts there.
const statsTimeout = 2 * time.Second

// detailStats returns the Get hits memcached at addr served per key prefix
// (up to the first ':'), from its own counters: `stats detail dump`. It
// turns them on first (`stats detail on`): a memcached that restarted has
// them off, and turning them on again keeps them. The library has no
// per-server counts, and needs none: where a read was served is the
// servers' business, and they tell. It asks on a connection of its own,
// in the text protocol, which gomemcache does not speak for stats.
func detailStats(addr string) (map[string]int64, error) {
	c, err := net.DialTimeout("tcp", addr, statsTimeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(statsTimeout)); err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte("stats detail on\r\nstats detail dump\r\n")); err != nil {
		return nil, err
	}
	hits := map[string]int64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		// PREFIX <prefix> get <n> hit <n> set <n> del <n>
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "END":
			return hits, nil
		case len(f) >= 6 && f[0] == "PREFIX" && f[4] == "hit":
			n, err := strconv.ParseInt(f[5], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("stats detail from %s: %q: %w", addr, sc.Text(), err)
			}
			hits[f[1]] = n
		}
	}
	return nil, fmt.Errorf("stats detail from %s: no END: %v", addr, sc.Err())
}

// zoneHits counts, per key prefix, the Get hits the servers served in one
// zone and in all zones, between calls of delta.
type zoneHits struct {
	zoneOf map[string]string // a server's address -> its zone
	zone   string
	log    *slog.Logger
	prev   map[string]map[string]int64 // by server, by prefix
}

// hitsIn are Get hits served in a zone, and in all.
type hitsIn struct{ zone, all int64 }

func (h hitsIn) share() float64 {
	if h.all == 0 {
		return 0
	}
	return float64(h.zone) / float64(h.all)
}

// delta returns the hits per prefix since the previous call. A server that
// refuses connections is dead, served none, and counts from zero when it
// is back (restarted); one that does not answer otherwise shows its hits at
// the next call.
func (z *zoneHits) delta() map[string]hitsIn {
	if z.prev == nil {
		z.prev = map[string]map[string]int64{}
	}
	out := map[string]hitsIn{}
	for addr, zone := range z.zoneOf {
		now, err := detailStats(addr)
		if errors.Is(err, syscall.ECONNREFUSED) {
			delete(z.prev, addr)
			continue
		}
		if err != nil {
			z.log.Warn("demo: stats detail", "server", addr, "err", err)
			continue
		}
		for prefix, n := range now {
			d := n - z.prev[addr][prefix]
			if d < 0 { // restarted between two calls
				d = n
			}
			h := out[prefix]
			h.all += d
			if zone == z.zone {
				h.zone += d
			}
			out[prefix] = h
		}
		z.prev[addr] = now
	}
	return out
}

// pass reads each key 0 ... n-1 of prefix once (GetMulti, 100 at a time,
// from 8 goroutines), and with set, sets those it did not find, as
// cache-aside does. It returns how many it did not find.
func pass(mc cache, prefix string, n int, set bool) (int, error) {
	const workers, batch = 8, 100
	missed := make([]int, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for from := w * batch; from < n && errs[w] == nil; from += workers * batch {
				var keys []string
				for i := from; i < min(from+batch, n); i++ {
					keys = append(keys, key(prefix, i))
				}
				items, err := mc.GetMulti(keys)
				if err != nil {
					errs[w] = err
					return
				}
				for _, k := range keys {
					if items[k] == nil {
						missed[w]++
						if !set {
							continue
						}
						if err := mc.Set(&memcache.Item{Key: k, Value: []byte("value")}); err != nil {
							errs[w] = err
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, m := range missed {
		total += m
	}
	return total, errors.Join(errs...)
}

// heldKeys returns how many of the keys 0 ... n-1 of prefix the memcached
// at addrs hold, asked directly (with a gomemcache client of one server
// each), so that no client's failover or repair answers for them.
func heldKeys(addrs []string, prefix string, n int) (int, error) {
	found := map[string]bool{}
	for _, addr := range addrs {
		mc := memcache.New(addr)
		mc.Timeout = statsTimeout
		for from := 0; from < n; from += 100 {
			var keys []string
			for i := from; i < min(from+100, n); i++ {
				keys = append(keys, key(prefix, i))
			}
			items, err := mc.GetMulti(keys)
			if err != nil {
				mc.Close()
				return 0, fmt.Errorf("%s: %w", addr, err)
			}
			for k := range items {
				found[k] = true
			}
		}
		mc.Close()
	}
	return len(found), nil
}
