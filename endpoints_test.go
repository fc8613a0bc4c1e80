package selector

import (
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
