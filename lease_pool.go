package selector

import (
	"context"

	"github.com/bradfitz/gomemcache/memcache"
)

// getOrLoad is GetOrLoad in a replicated or zoned pool: the caller's own
// group is read first, unless it is the key's primary group, whose server
// for the key holds the lease (see Client.GetOrLoad); then the lease is
// taken there, and the winner writes its value to every group.
func (pl *pooled) getOrLoad(ctx context.Context, key string, opt LoadOptions, load loadFunc) (*memcache.Item, error) {
	p := pl.primaryFor(key)
	if p == nil {
		return nil, ErrNoServers
	}
	v := pl.view.Load()
	// A read of the primary group now would take the lease of a stale
	// value, which memcached gives to the first read of it, and not use it.
	if len(v.reads) > 0 && v.reads[0] != p {
		if it, err := v.reads[0].c.getItem(ctx, key, false); err == nil {
			it.Expiration = 0
			return it, nil
		}
	}
	others := make([]*Client, 0, len(v.all))
	for _, g := range v.all {
		if g != p {
			others = append(others, g.c)
		}
	}
	return p.c.leased(ctx, key, opt, load, others)
}

// invalidate marks key stale in every group, as delete deletes it there
// (twice with miss failover: see repair).
func (pl *pooled) invalidate(ctx context.Context, key string) error {
	pl.copies.written(key)
	err := pl.all(key, func(g *Client) error { return g.Invalidate(ctx, key) })
	if pl.miss {
		pl.all(key, func(g *Client) error { return g.Invalidate(ctx, key) })
	}
	return err
}
