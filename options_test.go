package selector

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A mistake in the options is an error from NewServerList that names it,
// before any request.
func TestOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"nil option", []Option{nil}, "option 8 of 8 is nil"},
		{"nil Logger", []Option{WithLogger(nil)}, "WithLogger(nil): pass a Logger"},
		{"nil slog", []Option{WithSlog(nil)}, "WithSlog(nil): pass a *slog.Logger"},
		{"family v4", []Option{WithIPFamily("v4")}, `WithIPFamily("v4"): want "IPv4" or "IPv6"`},
		{"family ip4", []Option{WithIPFamily("ip4")}, `WithIPFamily("ip4")`},
		{"points", []Option{WithPointsPerServer(-1)}, "WithPointsPerServer(-1): want 1 to 100000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			_, err := newServerList(t, f, "memcache:11211", tc.opts...)
			require.ErrorContains(t, err, "selector: "+tc.want)
			require.Empty(t, f.requests())
		})
	}
}

// WithIPFamily takes the EndpointSlice addressType in any case.
func TestIPFamilyAnyCase(t *testing.T) {
	for _, family := range []string{"IPv4", "ipv4", "IPV4"} {
		t.Run(family, func(t *testing.T) {
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1")), slice("memcache-b", "IPv6", memcachePort, ep("fd00::1")))
			ss := start(t, f, WithIPFamily(family))
			checkServers(t, ss, "10.0.0.1:11211")
		})
	}
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")), slice("memcache-b", "IPv6", memcachePort, ep("fd00::1")))
	checkServers(t, start(t, f, WithIPFamily("ipv6")), "[fd00::1]:11211")
}

// WithWaitForServers: NewServerList returns once there is a server, or fails
// when its context ends, saying that there is none.
func TestWaitForServers(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		f := newFakeAPI(t)
		f.put(v4("memcache-a", ep("10.0.0.1").cond(ptr(false), nil, nil)))
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		before := goroutines()
		_, err := NewServerList(ctx, "memcache:11211", fakeOptions(t, f, WithWaitForServers())...)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "the Service has no ready endpoints (WithWaitForServers)")
		checkNoLeaks(t, before)
	})
	t.Run("one arrives", func(t *testing.T) {
		f := newFakeAPI(t)
		go func() { f.waitWatch(1).apply("ADDED", v4("memcache-a", ep("10.0.0.1"))) }()
		ss := start(t, f, WithWaitForServers())
		checkServers(t, ss, "10.0.0.1:11211")
	})
}
