package selector

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestCloseWaitsAndRefuses: Close waits for a call in flight (a GetOrLoad
// whose load runs), refuses the calls made meanwhile and after with
// ErrClosed, and no call after it dials a server. Before, Close returned at
// once, and a Get after it dialed again and succeeded.
func TestCloseWaitsAndRefuses(t *testing.T) {
	ms := startMemcached(t, 1)
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c, _ := newTestClient(t, addrsOf(ms), WithDialContext(dial))
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))

	loading, release := make(chan struct{}), make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(context.Background(), "loaded", LoadOptions{}, func(context.Context, string) (*memcache.Item, error) {
			close(loading)
			<-release
			return &memcache.Item{Value: []byte("db")}, nil
		})
		loaded <- err
	}()
	<-loading
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	eventually(t, "Close to begin", func() bool { return c.closed.Load() || c.calls.n.Load()&closing != 0 })
	_, err := c.Get("k")
	require.ErrorIs(t, err, ErrClosed, "a call while Close waits")
	select {
	case <-closed:
		t.Fatal("Close returned while a call was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-loaded, "the call in flight")
	<-closed
	it, err := direct(ms[0].addr).Get("loaded")
	require.NoError(t, err, "the load in flight was cached before Close returned")
	require.Equal(t, "db", string(it.Value))

	before := dials.Load()
	for name, call := range map[string]func() error{
		"Get":      func() error { _, err := c.Get("k"); return err },
		"GetMulti": func() error { _, err := c.GetMulti([]string{"k"}); return err },
		"Set":      func() error { return c.Set(&memcache.Item{Key: "k", Value: []byte("v2")}) },
		"Delete":   func() error { return c.Delete("k") },
		"Ping":     func() error { return c.Ping() },
		"FlushAll": func() error { return c.FlushAll() },
		"GetOrLoad": func() error {
			_, err := c.GetOrLoad(context.Background(), "k", LoadOptions{}, func(context.Context, string) (*memcache.Item, error) {
				return &memcache.Item{Value: []byte("db")}, nil
			})
			return err
		},
	} {
		require.ErrorIs(t, call(), ErrClosed, name)
	}
	require.Equal(t, before, dials.Load(), "dials after Close")
	require.NoError(t, c.Close(), "a second Close")
}

// TestNilArguments: a nil item, context or load function is an error that names
// it, where gomemcache (and the Client before) panics.
func TestNilArguments(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	var noCtx context.Context
	ctx := context.Background()
	load := func(context.Context, string) (*memcache.Item, error) { return &memcache.Item{}, nil }
	for _, tc := range []struct {
		name, arg string
		call      func() error
	}{
		{"Set", "item", func() error { return c.Set(nil) }},
		{"Add", "item", func() error { return c.Add(nil) }},
		{"Replace", "item", func() error { return c.Replace(nil) }},
		{"Append", "item", func() error { return c.Append(nil) }},
		{"Prepend", "item", func() error { return c.Prepend(nil) }},
		{"CompareAndSwap", "item", func() error { return c.CompareAndSwap(nil) }},
		{"SetContext", "ctx", func() error { return c.SetContext(noCtx, &memcache.Item{Key: "k"}) }},
		{"GetContext", "ctx", func() error { _, err := c.GetContext(noCtx, "k"); return err }},
		{"GetMultiContext", "ctx", func() error { _, err := c.GetMultiContext(noCtx, []string{"k"}); return err }},
		{"DeleteContext", "ctx", func() error { return c.DeleteContext(noCtx, "k") }},
		{"IncrementContext", "ctx", func() error { _, err := c.IncrementContext(noCtx, "k", 1); return err }},
		{"TouchContext", "ctx", func() error { return c.TouchContext(noCtx, "k", 1) }},
		{"Invalidate", "ctx", func() error { return c.Invalidate(noCtx, "k") }},
		{"GetOrLoad ctx", "ctx", func() error { _, err := c.GetOrLoad(noCtx, "k", LoadOptions{}, load); return err }},
		{"GetOrLoad load", "load", func() error { _, err := c.GetOrLoad(ctx, "k", LoadOptions{}, nil); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = tc.call() })
			require.ErrorContains(t, err, "selector: "+tc.arg+" is nil")
		})
	}
}

// TestNoServersSaysWhy: with every server on a port where nothing
// listens, each call's error is ErrNoServers (as errors.Is sees it) and
// carries the failure that took the servers out. Before, only the first
// call returned the dial error, and every later one ErrNoServers alone.
func TestNoServersSaysWhy(t *testing.T) {
	var addrs []string
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	c, _ := newTestClient(t, addrs)
	calls := map[string]func() error{
		"Get":      func() error { _, err := c.Get("k"); return err },
		"GetMulti": func() error { _, err := c.GetMulti([]string{"k"}); return err },
		"Set":      func() error { return c.Set(&memcache.Item{Key: "k", Value: []byte("v")}) },
	}
	for range 5 { // every server out
		c.Get("k")
		c.Set(&memcache.Item{Key: "k2", Value: []byte("v")})
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, memcache.ErrNoServers, name)
		require.True(t, errors.Is(err, syscall.ECONNREFUSED), "%s: %v", name, err)
		require.True(t, strings.HasPrefix(err.Error(), ErrNoServers.Error()+": "), "%s: %v", name, err)
	}
}
