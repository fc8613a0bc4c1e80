package histcheck

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"
)

// Target is what a run drives: the Client, or gomemcache's own client as
// the control. Both have these methods.
type Target interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Set(item *memcache.Item) error
	Delete(key string) error
	Increment(key string, delta uint64) (uint64, error)
	FlushAll() error
}

// Loader is what the Client has beyond gomemcache's methods, for the
// loads (see loads.go): GetOrLoad with the default LoadOptions, and
// Invalidate. gomemcache's client, which has neither, does plain
// cache-aside instead. It names no type of the root package, so that this
// package's library does not import it: the tests, which build the
// Client, adapt it (see the driver's loaderOf).
type Loader interface {
	GetOrLoad(ctx context.Context, key string, load func(context.Context, string) (*memcache.Item, error)) (*memcache.Item, error)
	Invalidate(ctx context.Context, key string) error
}

// TargetKind is the client a run drives.
type TargetKind string

const (
	ClientSharded    TargetKind = "client"            // NewClientFromList, the default pool
	ClientReplicated TargetKind = "client-replicated" // WithPool(Replicated())
	// ClientZoned is WithPool(ByZone("a")) over the static list: its
	// members have no zone (SetServers gives none, and only discovery
	// reads them), so the pool has one group, "", and it exercises the
	// pool's code paths over one sharded ring rather than a zone split.
	ClientZoned TargetKind = "client-byzone-static"
	Gomemcache  TargetKind = "gomemcache" // memcache.NewFromSelector over the same ServerList
)

var _ Target = (*memcache.Client)(nil)

// errKind names the kind of an application error for the report: a few
// words that group errors of one cause (an address or a port would make
// every error its own kind).
func errKind(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, memcache.ErrNoServers):
		return "no servers"
	case errors.Is(err, memcache.ErrServerError):
		return "server error"
	case errors.Is(err, memcache.ErrNotStored):
		return "not stored"
	case errors.Is(err, memcache.ErrMalformedKey):
		return "malformed key"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	var ct *memcache.ConnectTimeoutError
	if errors.As(err, &ct) {
		return "connect timeout"
	}
	s := err.Error()
	for _, k := range []string{"EOF", "timeout", "refused", "reset", "broken pipe", "closed"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}
