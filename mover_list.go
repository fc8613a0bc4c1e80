package selector

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// listing is what a listing of a server found: the Client's keys there
// that another member owns now, and counts of the rest.
type listing struct {
	keys    []string // to move
	ours    int      // keys the Client placed there (see placedAt), moved or not
	foreign int      // keys it could have written, but did not place there: another hashing's, or junk
	others  int      // keys it cannot have written: without Moves.Prefix, or that no request can name
}

// Foreign keys are tolerated up to 1% of the keys listed, and 9 keys: past
// that, another hashing shares the server, and one in as many of its keys
// as there are servers sits in a slot the server owned, which the mover
// would take for the Client's (see Moves).
const (
	foreignShare = 100 // 1 in
	foreignMin   = 10
)

// shared reports whether l is of a server that another application shares.
func (l listing) shared() bool {
	return l.foreign >= foreignMin && l.foreign*foreignShare > l.ours+l.foreign
}

// listMovable lists the keys of p, and those of them the Client placed
// there whose owner is now another member, up for this client: a key
// whose owner is out is left to the read handoff.
func (c *Client) listMovable(ctx context.Context, p *server) (listing, error) {
	for attempt := 0; ; attempt++ {
		nc, err := p.dial(ctx)
		if err != nil {
			return listing{}, err
		}
		var l listing
		rt := c.rt.Load()
		err = meta.List(ctx, nc, c.cfg.conn.timeout, func(it meta.Listed) error {
			switch {
			case strings.HasPrefix(it.Key, claimPrefix), strings.HasPrefix(it.Key, tombPrefix), it.Key == probeKey, it.Key == lostKey: // the Client's own, per server
				return nil
			case it.Invalid || !strings.HasPrefix(it.Key, c.cfg.moves.Prefix):
				l.others++
				return nil
			}
			h := c.hash(it.Key)
			if !placedAt(rt, p, h) {
				l.foreign++
				return nil
			}
			l.ours++
			if s := movableTo(rt, h); s != nil && s != p {
				l.keys = append(l.keys, it.Key)
			}
			return nil
		})
		if err == nil {
			nc.Close()
			return l, nil
		}
		if !errors.Is(err, meta.ErrCrawlerBusy) || attempt == 9 {
			return listing{}, err
		}
		select { // one crawl at a time: another client's, or an operator's
		case <-time.After(time.Second):
		case <-ctx.Done():
			return listing{}, ctx.Err()
		}
	}
}

// placedAt reports whether the Client may have placed a key of hash h at
// p: p owns it among the members, or did in a ring the Client routed by
// (as its owner, or as a stand-in for an owner out).
func placedAt(rt *routing, p *server, h uint64) bool {
	if rt.baseOwner(h) == p || rt.liveSrv[rt.live.owner(h)] == p {
		return true
	}
	for _, q := range rt.past {
		if q.srv[q.r.owner(h)] == p {
			return true
		}
	}
	return false
}
