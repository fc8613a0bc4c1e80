package selector

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// identities returns the ring's members as identity -> dial address.
func identities(ss *ServerList) map[string]string {
	r := ss.ring.Load()
	if r == nil {
		return nil
	}
	ids := map[string]string{}
	for _, m := range r.members {
		ids[m.id] = m.addr.str
	}
	return ids
}

// TestIdentity: a member's identity is its hostname where that is unique,
// else its pod name where that is unique, else its IP and port; the three
// forms never collide, so distinct ready addresses are distinct servers.
func TestIdentity(t *testing.T) {
	v6 := func(name string, eps ...fakeEndpoint) *fakeSlice { return slice(name, "IPv6", memcachePort, eps...) }
	for _, tc := range []struct {
		name   string
		slices []*fakeSlice
		opts   []Option
		want   map[string]string // identity -> address
	}{
		{"StatefulSet pods: hostname",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0"), ep("10.0.0.2").pod("memcache-1", "memcache-1"))},
			nil, map[string]string{"memcache-0:11211": "10.0.0.1:11211", "memcache-1:11211": "10.0.0.2:11211"}},
		{"Deployment pods sharing a hostname: pod names",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-7d9f-a", "memcache"), ep("10.0.0.2").pod("memcache-7d9f-b", "memcache"),
				ep("10.0.0.3").pod("memcache-7d9f-c", "memcache"))},
			nil, map[string]string{"memcache-7d9f-a:11211": "10.0.0.1:11211", "memcache-7d9f-b:11211": "10.0.0.2:11211", "memcache-7d9f-c:11211": "10.0.0.3:11211"}},
		{"a hostname shared across slices",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-7d9f-a", "memcache")), v4("memcache-b", ep("10.0.0.2").pod("memcache-7d9f-b", "memcache"))},
			nil, map[string]string{"memcache-7d9f-a:11211": "10.0.0.1:11211", "memcache-7d9f-b:11211": "10.0.0.2:11211"}},
		{"a shared hostname and a unique one",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("web-a", "web"), ep("10.0.0.2").pod("web-b", "web"), ep("10.0.0.3").pod("memcache-0", "memcache-0"))},
			nil, map[string]string{"web-a:11211": "10.0.0.1:11211", "web-b:11211": "10.0.0.2:11211", "memcache-0:11211": "10.0.0.3:11211"}},
		{"a shared hostname without pod names: IPs",
			[]*fakeSlice{v4("memcache-a", fakeEndpoint{Addresses: []string{"10.0.0.1"}, Hostname: ptr("memcache")}, fakeEndpoint{Addresses: []string{"10.0.0.2"}, Hostname: ptr("memcache")})},
			nil, map[string]string{"10.0.0.1:11211": "10.0.0.1:11211", "10.0.0.2:11211": "10.0.0.2:11211"}},
		{"a pod named like another endpoint's IP",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.5").pod("10.0.0.1", ""), fakeEndpoint{Addresses: []string{"10.0.0.1"}})},
			nil, map[string]string{"10.0.0.1:11211": "10.0.0.1:11211", "10.0.0.5:11211": "10.0.0.5:11211"}},
		{"a hostname that is another pod's name",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-a", "memcache-b"), ep("10.0.0.2").pod("memcache-b", ""))},
			nil, map[string]string{"memcache-a:11211": "10.0.0.1:11211", "memcache-b:11211": "10.0.0.2:11211"}},
		{"one pod name at two addresses: IPs",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0")), v4("memcache-b", ep("10.0.0.2").pod("memcache-0", "memcache-0"))},
			nil, map[string]string{"10.0.0.1:11211": "10.0.0.1:11211", "10.0.0.2:11211": "10.0.0.2:11211"}},
		{"an endpoint in two slices keeps its hostname",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0")), v4("memcache-b", ep("10.0.0.1").pod("memcache-0", "memcache-0"))},
			nil, map[string]string{"memcache-0:11211": "10.0.0.1:11211"}},
		{"an endpoint also in a mirrored slice without names keeps its hostname",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0")), v4("memcache-b", fakeEndpoint{Addresses: []string{"10.0.0.1"}})},
			nil, map[string]string{"memcache-0:11211": "10.0.0.1:11211"}},
		{"a dual-stack pod's hostname is unique in its family",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0")), v6("memcache-b", ep("fd00::1").pod("memcache-0", "memcache-0"))},
			nil, map[string]string{"memcache-0:11211": "10.0.0.1:11211"}},
		{"dual-stack with WithIPFamily IPv6",
			[]*fakeSlice{v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0")), v6("memcache-b", ep("fd00::1").pod("memcache-0", "memcache-0"))},
			[]Option{WithIPFamily("IPv6")}, map[string]string{"memcache-0:11211": "[fd00::1]:11211"}},
		{"endpoints without names: IPs",
			[]*fakeSlice{v6("memcache-a", fakeEndpoint{Addresses: []string{"fd00::1"}})},
			nil, map[string]string{"[fd00::1]:11211": "[fd00::1]:11211"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			for _, s := range tc.slices {
				f.put(s)
			}
			ss := start(t, f, tc.opts...)
			assert.Equal(t, tc.want, identities(ss))
		})
	}
}

// TestLegacyIdentity: core/v1 Endpoints follow the same rule.
func TestLegacyIdentity(t *testing.T) {
	shared := func(ip, pod string) fakeAddress {
		return fakeAddress{IP: ip, Hostname: "memcache", TargetRef: &fakeRef{Kind: "Pod", Namespace: "default", Name: pod}}
	}
	for _, tc := range []struct {
		name  string
		addrs []fakeAddress
		want  map[string]string
	}{
		{"a shared hostname: pod names",
			[]fakeAddress{shared("10.0.0.1", "memcache-7d9f-a"), shared("10.0.0.2", "memcache-7d9f-b"), shared("10.0.0.3", "memcache-7d9f-c")},
			map[string]string{"memcache-7d9f-a:11211": "10.0.0.1:11211", "memcache-7d9f-b:11211": "10.0.0.2:11211", "memcache-7d9f-c:11211": "10.0.0.3:11211"}},
		{"a shared hostname without pods: IPs",
			[]fakeAddress{{IP: "10.0.0.1", Hostname: "memcache"}, {IP: "10.0.0.2", Hostname: "memcache"}, {IP: "10.0.0.3", Hostname: "memcache"}},
			map[string]string{"10.0.0.1:11211": "10.0.0.1:11211", "10.0.0.2:11211": "10.0.0.2:11211", "10.0.0.3:11211": "10.0.0.3:11211"}},
		{"StatefulSet pods: hostname",
			[]fakeAddress{{IP: "10.0.0.1", Hostname: "memcache-0", TargetRef: &fakeRef{Kind: "Pod", Name: "memcache-0"}}, {IP: "10.0.0.2", Hostname: "memcache-1"}},
			map[string]string{"memcache-0:11211": "10.0.0.1:11211", "memcache-1:11211": "10.0.0.2:11211"}},
		{"a pod named like another address",
			[]fakeAddress{{IP: "10.0.0.5", TargetRef: &fakeRef{Kind: "Pod", Name: "10.0.0.1"}}, {IP: "10.0.0.1"}},
			map[string]string{"10.0.0.1:11211": "10.0.0.1:11211", "10.0.0.5:11211": "10.0.0.5:11211"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(legacyEndpoints(fakeSubset{Addresses: tc.addrs, Ports: memcachePort}))
			ss := start(t, f, WithLegacyEndpoints())
			assert.Equal(t, tc.want, identities(ss))
		})
	}
}

// TestSharedHostnameWatched: pods that share a hostname stay apart as they
// come and go, and a pod whose hostname becomes unique takes it as its
// identity.
func TestSharedHostnameWatched(t *testing.T) {
	f := newFakeAPI(t)
	s := v4("memcache-a", ep("10.0.0.1").pod("memcache-7d9f-a", "memcache"), ep("10.0.0.2").pod("memcache-7d9f-b", "memcache"))
	f.put(s)
	ss := start(t, f)
	w := f.waitWatch(1)
	require.Equal(t, map[string]string{"memcache-7d9f-a:11211": "10.0.0.1:11211", "memcache-7d9f-b:11211": "10.0.0.2:11211"}, identities(ss))

	s.Endpoints = append(s.Endpoints, ep("10.0.0.3").pod("memcache-7d9f-c", "memcache"))
	w.apply("MODIFIED", s)
	waitServers(t, ss, hostports("10.0.0.1", "10.0.0.2", "10.0.0.3")...)
	require.Len(t, identities(ss), 3)

	s.Endpoints = s.Endpoints[2:]
	w.apply("MODIFIED", s)
	waitServers(t, ss, hostports("10.0.0.3")...)
	require.Equal(t, map[string]string{"memcache:11211": "10.0.0.3:11211"}, identities(ss))
}

// TestPortRange: a port number outside 1-65535 (ports[].port is an int32 on
// the wire) never becomes a server; the slice is skipped and the error says
// why.
func TestPortRange(t *testing.T) {
	for _, n := range []int32{0, -1, 65536, 100000, math.MaxInt32, math.MinInt32} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(slice("memcache-a", "IPv4", []fakePort{tcp("memcache", n)}, ep("10.0.0.1")))
			ss, err := newServerList(t, f, "memcache:memcache")
			require.ErrorIs(t, err, errNoPort, "servers %v", func() []string {
				if ss == nil {
					return nil
				}
				return addrs(ss)
			}())
			require.ErrorContains(t, err, fmt.Sprintf(`service default/memcache has TCP port "memcache" = %d in memcache-a, outside 1-65535: the slice is skipped; check the Service's targetPort`, n))
		})
	}
	t.Run("a slice with a bad port is skipped, others count", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(slice("memcache-a", "IPv4", []fakePort{tcp("memcache", 100000)}, ep("10.0.0.1")),
			slice("memcache-b", "IPv4", []fakePort{tcp("memcache", 11211)}, ep("10.0.0.2")))
		ss, err := newServerList(t, f, "memcache:memcache")
		require.NoError(t, err)
		checkServers(t, ss, "10.0.0.2:11211")
	})
	t.Run("legacy Endpoints", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(legacyEndpoints(fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.1"}}, Ports: []fakePort{tcp("memcache", 65536)}},
			fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.2"}}, Ports: []fakePort{tcp("memcache", 11211)}}))
		ss, err := newServerList(t, f, "memcache:memcache", WithLegacyEndpoints())
		require.NoError(t, err)
		checkServers(t, ss, "10.0.0.2:11211")
	})
	t.Run("a bad port is named among the ports there are", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(slice("memcache-a", "IPv4", []fakePort{tcp("metrics", 100000), tcp("memcache", 11211)}, ep("10.0.0.1")))
		_, err := newServerList(t, f, "memcache:11212")
		require.ErrorIs(t, err, errNoPort)
		require.ErrorContains(t, err, "memcache-a has ports metrics=100000/TCP (out of range), memcache=11211/TCP")
	})
}

// TestUnusableAddresses: addresses that cannot be a memcached pod's are
// skipped. The EndpointSlice API rejects most of them; this is defence
// against a broken or hostile API server.
func TestUnusableAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, ip string
	}{
		{"IPv4 unspecified", "0.0.0.0"},
		{"IPv6 unspecified", "::"},
		{"IPv4 loopback", "127.0.0.1"},
		{"IPv4 loopback, not .1", "127.1.2.3"},
		{"IPv6 loopback", "::1"},
		{"IPv4-mapped loopback", "::ffff:127.0.0.1"},
		{"IPv4 link-local", "169.254.169.254"},
		{"IPv6 link-local", "fe80::1"},
		{"IPv6 link-local with a zone", "fe80::1%eth0"},
		{"IPv4 link-local multicast", "224.0.0.1"},
		{"IPv4 multicast", "239.1.2.3"},
		{"IPv6 link-local multicast", "ff02::1"},
		{"IPv6 interface-local multicast", "ff01::1"},
		{"IPv6 multicast", "ff05::2"},
		{"IPv4 broadcast", "255.255.255.255"},
		{"IPv6 with a zone", "fd00::1%eth0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addressType, good, opts := "IPv4", "10.0.0.1", []Option(nil)
			if strings.Contains(tc.ip, ":") {
				addressType, good, opts = "IPv6", "fd00::1", []Option{WithIPFamily("IPv6")}
			}
			f := newFakeAPI(t)
			f.put(slice("memcache-a", addressType, memcachePort, ep(tc.ip), ep(good)))
			ss := start(t, f, opts...)
			checkServers(t, ss, hostports(good)...)
		})
	}
	t.Run("legacy Endpoints", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t)
		f.put(legacyEndpoints(fakeSubset{Addresses: []fakeAddress{{IP: "127.0.0.1"}, {IP: "0.0.0.0"}, {IP: "10.0.0.1"}}, Ports: memcachePort}))
		ss := start(t, f, WithLegacyEndpoints())
		checkServers(t, ss, "10.0.0.1:11211")
	})
}

// TestIdentityNames: a hostname is an identity only if it is a DNS label
// (at most 63 characters), a pod name only if it is a DNS subdomain (at most
// 253); otherwise the next form is used, so a huge name is never hashed.
func TestIdentityNames(t *testing.T) {
	label63, sub253 := strings.Repeat("a", 63), strings.Repeat(strings.Repeat("a", 63)+".", 3)+strings.Repeat("a", 61)
	huge := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name          string
		pod, hostname string
		want          string // the identity
	}{
		{"hostname of 63 characters", "memcache-0", label63, label63 + ":11211"},
		{"hostname of 64 characters: the pod name", "memcache-0", label63 + "a", "memcache-0:11211"},
		{"hostname of 1 MiB: the pod name", "memcache-0", huge, "memcache-0:11211"},
		{"hostname in upper case: the pod name", "memcache-0", "Memcache-0", "memcache-0:11211"},
		{"hostname with a dot: the pod name", "memcache-0", "memcache.0", "memcache-0:11211"},
		{"hostname with a slash: the pod name", "memcache-0", "memcache/0", "memcache-0:11211"},
		{"pod name of 253 characters", sub253, "", sub253 + ":11211"},
		{"pod name of 254 characters: the address", sub253 + "a", "", "10.0.0.1:11211"},
		{"pod name of 1 MiB: the address", huge, huge, "10.0.0.1:11211"},
		{"pod name with a slash: the address", "memcache/0", "", "10.0.0.1:11211"},
		{"pod name in upper case: the address", "Memcache-0", "", "10.0.0.1:11211"},
		{"pod name with a colon: the address", "memcache:0", "", "10.0.0.1:11211"},
		{"pod name that is an IP: the address", "10.0.0.2", "", "10.0.0.1:11211"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t)
			f.put(v4("memcache-a", ep("10.0.0.1").pod(tc.pod, tc.hostname)))
			ss := start(t, f)
			assert.Equal(t, map[string]string{tc.want: "10.0.0.1:11211"}, identities(ss))
		})
	}
}
