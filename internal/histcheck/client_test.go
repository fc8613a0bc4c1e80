package histcheck

import (
	"context"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// The Client as a Target: the library of this package names no type of
// the root package (internal packages do not import it), so the tests,
// which build the Client, adapt what it has beyond gomemcache's methods.

var _ Target = (*selector.Client)(nil)

// clientLoads is the Client's GetOrLoad and Invalidate: what the
// Client, and a target that embeds one (see deadlined), has.
type clientLoads interface {
	GetOrLoad(ctx context.Context, key string, opt selector.LoadOptions, load func(context.Context, string) (*memcache.Item, error)) (*memcache.Item, error)
	Invalidate(ctx context.Context, key string) error
}

var _ clientLoads = (*selector.Client)(nil)

// clientLoader is a clientLoads as a Loader: GetOrLoad with the default
// LoadOptions (no Stale).
type clientLoader struct{ c clientLoads }

func (l clientLoader) GetOrLoad(ctx context.Context, key string, load func(context.Context, string) (*memcache.Item, error)) (*memcache.Item, error) {
	return l.c.GetOrLoad(ctx, key, selector.LoadOptions{}, load)
}

func (l clientLoader) Invalidate(ctx context.Context, key string) error {
	return l.c.Invalidate(ctx, key)
}

// loaderOf is the driver's loaderOf: t's loads if t has the Client's, else
// nil (gomemcache's client, which does cache-aside).
func loaderOf(t Target) Loader {
	if c, ok := t.(clientLoads); ok {
		return clientLoader{c}
	}
	return nil
}
