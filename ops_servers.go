package selector

import "context"

// The operations on every server, rather than on a key's.

// each runs op on every member server and returns the first error.
func (c *Client) each(op func(wire) error) error {
	rt := c.rt.Load()
	var first error
	for _, s := range rt.baseSrv {
		if err := s.call(op); err != nil && first == nil {
			first = appError(err)
		}
	}
	return first
}

// PingContext checks that every server answers, as memcache.Client.Ping, and
// returns the first error; servers out for this client are pinged too.
func (c *Client) PingContext(ctx context.Context) (opErr error) {
	ctx, st := c.begin(ctx, opNamePing)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		return c.pool.each(func(g *Client) error { return g.PingContext(ctx) })
	}
	return c.each(func(w wire) error { return w.Ping(ctx) })
}

// FlushAllContext deletes every item on every server, as memcache.Client.FlushAll:
// the members, and the servers that left but may still be read (see
// Client). A server that cannot be flushed now (out for this client, or
// failing) serves none of its values from before the flush when it is next
// used (a CAS floor: see docs/consistency.md), and no key is handed off
// from before it.
func (c *Client) FlushAllContext(ctx context.Context) (opErr error) {
	ctx, st := c.begin(ctx, opNameFlushAll)
	defer c.done(ctx, st, &opErr)
	if err := c.admit(ctx); err != nil {
		return err
	}
	defer c.calls.leave()
	if c.pool != nil {
		defer c.pool.copies.flush()()
		return c.pool.each(func(g *Client) error { return g.FlushAllContext(ctx) })
	}
	defer c.copies.flush()()
	c.dropPast() // no handoff from a server that is not flushed yet
	c.mu.Lock()
	all := make([]*server, 0, len(c.servers))
	for _, s := range c.servers {
		all = append(all, s)
	}
	c.mu.Unlock()
	var first error
	for _, s := range all {
		st := s.status()
		if st == gone && s.lost.Load() || st == down {
			c.inval.overflow(s)
			continue
		}
		// Pending from before the flush is sent (see floorAfterFlush).
		gen := s.askFloor()
		err := s.call(func(w wire) error { return w.FlushAll(ctx) })
		if err == nil {
			c.floorAfterFlush(ctx, s, gen)
			continue
		}
		c.inval.overflow(s)
		if s.status() == up {
			c.floorNow(s)
		}
		if st != gone && first == nil {
			first = appError(err)
		}
	}
	c.dropPast()
	return first
}

// DeleteAll deletes every item on every server, as FlushAll. Unlike
// memcache.Client.DeleteAll, which flushes only the server of the key "",
// it clears the whole cache. Its form with a context is FlushAllContext.
func (c *Client) DeleteAll() error { return c.FlushAll() }

// floorAfterFlush gives s, just flushed, a CAS floor, so that none of its
// values from before the flush is served (see servable) or changed in place
// (see clean). memcached 1.6.25 and later flush an item by its last access,
// a second older than the flush, and the newest items from the heads of
// their LRUs: an item changed in place in the flush's second (an increment
// bumps its time, not its place) survives flush_all for good. Before 1.6.25
// memcached compared CAS ids itself, as the floor does. The floor, numbered
// gen, was asked for before the flush was sent: until it is known, s
// serves nothing and changes nothing in place, or an increment between the
// flush and the floor would carry a value from before the flush above it
// (histcheck flush on 1.6.45, CI). A write to s meanwhile takes it first
// (see awaitFloor): taken after the flush began, it is as good. A floor
// that cannot be taken now is taken in the background, or when s is next
// back (see floorNow).
func (c *Client) floorAfterFlush(ctx context.Context, s *server, gen uint64) {
	if err := c.takeFloor(ctx, s, gen); err != nil {
		c.inval.overflow(s) // taken when it is next back, if it goes out
		c.floorNow(s)
	}
}
