package selector

import (
	"context"
	"time"
)

// notCached reports a value of key, size bytes long, that GetOrLoad loaded
// and s refused to store (see refusedStore): to Metrics each time, and in a
// warning at most once a minute, with the largest item s stores, so that
// a cache that never holds the key (each call loads it again) is seen, and
// its cause. The warning asks s for its limit on a connection of its own,
// once a minute at most.
func (c *Client) notCached(ctx context.Context, s *server, key string, size int) {
	if m := c.cfg.metrics; m != nil {
		m.NotCached(NotCachedEvent{Addr: s.addr.str, Size: size})
	}
	now, last := time.Now().UnixNano(), c.notCachedAt.Load()
	if last != 0 && now-last < int64(errorPeriod) || !c.notCachedAt.CompareAndSwap(last, now) {
		return
	}
	limit := "unknown"
	if st, err := serverStats(ctx, s, c.cfg.conn, "stats settings"); err == nil && st["item_size_max"] != "" {
		limit = st["item_size_max"]
	}
	c.log.Warn("GetOrLoad returns a value that its server refused to cache: each call loads it again (memcached's -I sets the largest item)",
		keyServer, s.addr.str, "key", key, "size", size, "item_size_max", limit)
}
