package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// statsTimeout bounds the demo's own requests to a memcached: the keys it
// counts there.
const statsTimeout = 2 * time.Second

// hitCounter counts the Get hits that each server answered one client with,
// on the client's own connections (WithDialContext): where a read was
// served is the servers' answer, and the library keeps no per-server
// counts. (memcached's own counters per key prefix, stats detail, count
// the classic protocol's gets only, not the meta protocol's mg that the
// Client sends.)
type hitCounter struct {
	mu   sync.Mutex
	hits map[string]int64 // by server address
}

func (h *hitCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, h: h, addr: addr}, nil
}

func (h *hitCounter) add(addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hits == nil {
		h.hits = map[string]int64{}
	}
	h.hits[addr]++
}

func (h *hitCounter) snapshot() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.hits)
}

// countingConn counts the hits in the replies it reads: each reply line,
// and after a hit's line (meta VA <size>, classic VALUE <key> <flags>
// <size>) its value, which it skips.
type countingConn struct {
	net.Conn
	h    *hitCounter
	addr string
	line []byte // the reply line read so far
	skip int    // the bytes of a value (and its \r\n) still to pass
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	for p := b[:n]; len(p) > 0; {
		if c.skip > 0 {
			k := min(c.skip, len(p))
			c.skip, p = c.skip-k, p[k:]
			continue
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.line = append(c.line, p...)
			break
		}
		c.line, p = append(c.line, p[:i+1]...), p[i+1:]
		f := strings.Fields(string(c.line))
		c.line = c.line[:0]
		size, hit := -1, true
		switch {
		case len(f) >= 2 && f[0] == "VA":
			size, _ = strconv.Atoi(f[1])
			// A copy's placeholder (W, Z) or an invalidated item (X) is
			// no hit: the Client takes it for a miss.
			hit = !slices.ContainsFunc(f[2:], func(t string) bool { return t == "W" || t == "Z" || t == "X" })
		case len(f) >= 4 && f[0] == "VALUE":
			size, _ = strconv.Atoi(f[3])
		}
		if size >= 0 {
			c.skip = size + 2
			if hit {
				c.h.add(c.addr)
			}
		}
	}
	return n, err
}

// zoneHits counts, per path, the Get hits the servers served in one zone
// and in all zones, between calls of delta.
type zoneHits struct {
	zoneOf map[string]string      // a server's address -> its zone
	zone   string                 // the clients' own
	paths  map[string]*hitCounter // by path name: "sharded", "zoned"
	prev   map[string]map[string]int64
}

// hitsIn are Get hits served in a zone, and in all.
type hitsIn struct{ zone, all int64 }

func (h hitsIn) share() float64 {
	if h.all == 0 {
		return 0
	}
	return float64(h.zone) / float64(h.all)
}

// delta returns the hits per path since the previous call.
func (z *zoneHits) delta() map[string]hitsIn {
	if z.prev == nil {
		z.prev = map[string]map[string]int64{}
	}
	out := map[string]hitsIn{}
	for path, hc := range z.paths {
		now := hc.snapshot()
		var h hitsIn
		for addr, n := range now {
			d := n - z.prev[path][addr]
			h.all += d
			if z.zoneOf[addr] == z.zone {
				h.zone += d
			}
		}
		out[path] = h
		z.prev[path] = now
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
