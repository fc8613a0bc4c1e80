package selector

import (
	"context"
	"errors"
	"log/slog"
	"net"
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
		{"family v4", []Option{WithIPFamily("v4")}, `WithIPFamily("v4"): want "IPv4" or "IPv6"`},
		{"family ip4", []Option{WithIPFamily("ip4")}, `WithIPFamily("ip4")`},
		{"points", []Option{WithPointsPerServer(-1)}, "WithPointsPerServer(-1): want 1 to 100000, or 0 for the default"},
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

// Every option's zero value means its default, and a negative value turns
// off what can be turned off; the last option of a kind wins.
func TestClientOptionValues(t *testing.T) {
	dial := func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no") }
	def := defaultClientOptions()
	with := func(f func(c *clientOptions)) clientOptions {
		c := defaultClientOptions()
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		opts []Option
		want clientOptions
	}{
		{"none", nil, def},
		{"WithTimeout(0)", []Option{WithTimeout(time.Second), WithTimeout(0)}, def},
		{"WithTimeout", []Option{WithTimeout(time.Second)}, with(func(c *clientOptions) { c.conn.timeout = time.Second })},
		{"WithMaxIdleConns(0)", []Option{WithMaxIdleConns(9), WithMaxIdleConns(0)}, def},
		{"WithMaxIdleConns", []Option{WithMaxIdleConns(9)}, with(func(c *clientOptions) { c.conn.maxIdle = 9 })},
		{"WithDialContext(nil)", []Option{WithDialContext(dial), WithDialContext(nil)}, def},
		{"WithPool(Pool{})", []Option{WithPool(Replicated()), WithPool(Pool{})}, def},
		{"zero Failover", []Option{WithFailover(Failover{})}, def},
		{"Failover fields", []Option{WithFailover(Failover{Timeouts: 5, ProbeFirst: 2 * time.Second, ProbeMax: time.Minute, MaxOut: 0.25, StandInExpiration: 10 * time.Second})},
			with(func(c *clientOptions) {
				c.timeoutsUntilDown, c.probeMin, c.probeMax, c.maxDown, c.standInTTL = 5, 2*time.Second, time.Minute, 0.25, 10*time.Second
			})},
		{"Failover one field", []Option{WithFailover(Failover{Timeouts: 5})}, with(func(c *clientOptions) { c.timeoutsUntilDown = 5 })},
		{"Failover last wins", []Option{WithFailover(Failover{Timeouts: 5}), WithFailover(Failover{MaxOut: 1})}, with(func(c *clientOptions) { c.maxDown = 1 })},
		{"Failover off", []Option{WithFailover(Failover{MaxOut: -1})}, with(func(c *clientOptions) { c.maxDown = -1 })},
		{"zero Handoff", []Option{WithHandoff(Handoff{})}, def},
		{"Handoff fields", []Option{WithHandoff(Handoff{Window: time.Minute, Expiration: time.Hour})},
			with(func(c *clientOptions) { c.handoffWindow, c.handoffTTL = time.Minute, time.Hour })},
		{"Handoff off", []Option{WithHandoff(Handoff{Window: -1})}, with(func(c *clientOptions) { c.handoffWindow = 0 })},
		{"Handoff copies without expiration", []Option{WithHandoff(Handoff{Expiration: -1})}, with(func(c *clientOptions) { c.handoffTTL = 0 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := newOptions(tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.want, o.client)
		})
	}
	require.Equal(t, 60*time.Second, def.standInTTL, "mcrouter's failover_exptime")
}

// nil, the zero value of the logger options, means the default logger,
// whatever an earlier option said.
func TestNilLoggerIsDefault(t *testing.T) {
	for name, opt := range map[string]Option{"WithLogger(nil)": WithLogger(nil), "WithSlog(nil)": WithSlog(nil)} {
		t.Run(name, func(t *testing.T) {
			o, err := newOptions([]Option{WithSlog(slog.New(slog.DiscardHandler)), opt})
			require.NoError(t, err)
			require.Equal(t, slog.Default().Handler(), o.log)
		})
	}
}

// A bad value of a Client option is an error from NewClient and
// NewClientFromList that names the option, the value and what to give.
func TestClientOptionErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
		want string
	}{
		{"negative timeout", WithTimeout(-time.Second), "WithTimeout: want a positive duration, or 0 for the default (500ms), got -1s"},
		{"negative idle conns", WithMaxIdleConns(-1), "WithMaxIdleConns: want at least 1, or 0 for the default (2), got -1"},
		{"negative timeouts", WithFailover(Failover{Timeouts: -1}), "WithFailover: Timeouts -1: want 1 or more, or 0 for the default (3); to turn failover off, set MaxOut to -1"},
		{"negative probe", WithFailover(Failover{ProbeFirst: -time.Second}), "WithFailover: ProbeFirst -1s, ProbeMax 30s: want positive durations, or 0 for the defaults (1s, 30s)"},
		{"first probe after the last", WithFailover(Failover{ProbeFirst: time.Minute}), "WithFailover: ProbeFirst 1m0s is after ProbeMax 30s: set ProbeMax to ProbeFirst or more (0 means 30s)"},
		{"more than all out", WithFailover(Failover{MaxOut: 1.5}), "WithFailover: MaxOut 1.5: want a share of the servers up to 1, 0 for the default (0.5), or -1 to turn failover off"},
		{"negative stand-in expiration", WithFailover(Failover{StandInExpiration: -time.Second}), "WithFailover: StandInExpiration -1s: want up to 30 days, or 0 for the default (1m0s)"},
		{"stand-in expiration past 30 days", WithFailover(Failover{StandInExpiration: 31 * 24 * time.Hour}), "WithFailover: StandInExpiration 744h0m0s: want up to 30 days, or 0 for the default (1m0s)"},
		{"handoff expiration past 30 days", WithHandoff(Handoff{Expiration: 31 * 24 * time.Hour}), "WithHandoff: Expiration 744h0m0s: want up to 30 days, 0 for the default (5m0s), or -1 for none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithSlog(slog.New(slog.DiscardHandler)), tc.opt}
			_, err := NewClientFromList(new(ServerList), opts...)
			require.EqualError(t, err, "selector: "+tc.want)
			f := newFakeAPI(t)
			_, err = NewClient(t.Context(), "memcache:11211", fakeClientOptions(t, f, tc.opt)...)
			require.EqualError(t, err, "selector: "+tc.want)
			require.Empty(t, f.requests(), "discovery started")
		})
	}
	for name, o := range map[string]Option{"nil": nil, "nil Option": Option(nil)} {
		_, err := NewClientFromList(new(ServerList), WithTimeout(time.Second), o)
		require.EqualError(t, err, "selector: option 2 of 2 is nil", name)
	}
	_, err := NewClientFromList(nil)
	require.EqualError(t, err, "selector: NewClientFromList: nil ServerList: give a ServerList from NewServerList, or one filled with SetServers")
}

// NewServerList refuses a Client option, with an error that names the fix;
// NewClient takes both kinds, and NewClientFromList the Client's, refusing
// an Option of discovery, which its ServerList has already.
func TestOptionKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"WithTimeout", WithTimeout(time.Second)},
		{"WithMaxIdleConns", WithMaxIdleConns(4)},
		{"WithMaxItemSize", WithMaxItemSize(1 << 20)},
		{"WithDialContext", WithDialContext(nil)},
		{"WithFailover", WithFailover(Failover{})},
		{"WithHandoff", WithHandoff(Handoff{})},
		{"WithMoves", WithMoves(Moves{})},
		{"WithPool", WithPool(Replicated())},
	} {
		t.Run("NewServerList "+tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			_, err := newServerList(t, f, "memcache:11211", WithSlog(slog.New(slog.DiscardHandler)), tc.opt)
			require.EqualError(t, err, "selector: NewServerList: "+tc.name+" is an option of the Client, which a ServerList does not make: give it to NewClient, or to NewClientFromList with this ServerList")
			require.Empty(t, f.requests())
		})
	}

	loggers := []Option{WithLogger(&recLogger{t: t}), WithSlog(slog.New(slog.DiscardHandler))}
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.1:11211"))
	for _, o := range loggers {
		c, err := NewClientFromList(&ss, o)
		require.NoError(t, err)
		c.Close()
	}
	for _, tc := range []struct {
		name string
		opt  Option
	}{
		{"WithAPIServer", WithAPIServer("https://10.0.0.1")},
		{"WithTokenFile", WithTokenFile("token")},
		{"WithCAFile", WithCAFile("ca.crt")},
		{"WithHTTPClient", WithHTTPClient(nil)},
		{"WithPointsPerServer", WithPointsPerServer(100)},
		{"WithHashing", WithHashing(Ketama())},
		{"WithOnChange", WithOnChange(func([]net.Addr) {})},
		{"WithWaitForServers", WithWaitForServers()},
		{"WithLegacyEndpoints", WithLegacyEndpoints()},
		{"WithIPFamily", WithIPFamily("IPv6")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewClientFromList(&ss, WithTimeout(time.Second), tc.opt)
			require.EqualError(t, err, "selector: NewClientFromList: "+tc.name+" is an option of discovery, which the ServerList has already: give it to NewServerList, or give NewClient the Service's address and "+tc.name)
		})
	}
}

// WithIPFamily of a family the Service has no endpoints of, while it has
// others, is one warning naming both; it comes again only after the
// family had servers and lost them.
func TestIPFamilyMissingWarns(t *testing.T) {
	warning := `WithIPFamily("IPv6"): the Service has no IPv6 endpoints, only IPv4 ones, so there are no servers: ask for "IPv4", or leave WithIPFamily out`
	f := newFakeAPI(t)
	f.put(v4("memcache-a", ep("10.0.0.1")))
	log := &recLogger{t: t}
	ss := start(t, f, WithIPFamily("ipv6"), WithLogger(log))
	checkServers(t, ss)
	require.Equal(t, 1, log.count(warning), "the warning, once")

	w := f.waitWatch(1)
	w.apply("MODIFIED", v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2")))
	v6 := slice("memcache-b", "IPv6", memcachePort, ep("fd00::1"))
	w.apply("ADDED", v6)
	eventually(t, "the IPv6 server", func() bool { return len(ss.Servers()) == 1 })
	require.Equal(t, 1, log.count(warning), "warned again for a change of IPv4 endpoints")
	w.apply("DELETED", v6)
	eventually(t, "the warning again", func() bool { return log.count(warning) == 2 })

	for name, opts := range map[string][]Option{
		"no endpoints":     {WithIPFamily("IPv6")},
		"the default":      nil,
		"the family asked": {WithIPFamily("IPv4")},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeAPI(t)
			if name != "no endpoints" {
				f.put(v4("memcache-a", ep("10.0.0.1")))
			}
			log := &recLogger{t: t}
			start(t, f, append(opts, WithLogger(log))...)
			require.Zero(t, log.count("WithIPFamily"))
		})
	}
}
