package discovery

import (
	"encoding/json"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecodeSlice: decoding any object never panics, and every member of
// the union has a usable IP, a valid port, and an identity that is its
// address or a valid name at its port; distinct members have distinct
// identities and addresses.
func FuzzDecodeSlice(f *testing.F) {
	seeds := []fakeObject{
		v4("memcache-a", ep("10.0.0.1").pod("memcache-0", "memcache-0"), ep("10.0.0.2").pod("memcache-1", "memcache-1")),
		v4("memcache-a", ep("10.0.0.1").pod("web-a", "web"), ep("10.0.0.2").pod("web-b", "web"), ep("10.0.0.3").pod("10.0.0.1", "")),
		slice("memcache-a", "IPv6", []fakePort{tcp("memcache", 100000), tcp("", 11211)}, ep("fd00::1"), ep("::1"), ep("fe80::1%eth0")),
		slice("memcache-a", "IPv4", nil, ep("0.0.0.0"), ep("127.0.0.1"), ep("224.0.0.1").cond(nil, nil, ptr(true))),
		legacyEndpoints(fakeSubset{Addresses: []fakeAddress{{IP: "10.0.0.1", Hostname: "memcache"}, {IP: "10.0.0.2", Hostname: "memcache"}}, Ports: memcachePort}),
	}
	for _, s := range seeds {
		b, err := json.Marshal(s)
		require.NoError(f, err)
		_, legacy := s.(*fakeEndpoints)
		f.Add(b, legacy, false)
		f.Add(b, legacy, true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, legacy, named bool) {
		tg := target{service: "memcache", namespace: "default", port: 11211}
		if named {
			tg = target{service: "memcache", namespace: "default", portName: "memcache"}
		}
		d := decoder{t: tg, legacy: legacy}
		name, _, ms, err := d.decode(raw)
		if err != nil {
			return
		}
		for _, e := range ms {
			checkAddr(t, e.addr)
		}
		ids, as := map[string]bool{}, map[string]bool{}
		for _, m := range union(map[string][]endpoint{name: ms}, "") {
			ap := checkAddr(t, m.Addr)
			require.False(t, ids[m.ID], "identity %q twice", m.ID)
			require.False(t, as[m.Addr], "address %q twice", m.Addr)
			ids[m.ID], as[m.Addr] = true, true
			if m.ID == m.Addr {
				continue
			}
			n, port, ok := strings.Cut(m.ID, ":")
			require.True(t, ok, "identity %q has no port", m.ID)
			require.Equal(t, strconv.Itoa(int(ap.Port())), port, "identity %q, address %q", m.ID, m.Addr)
			require.True(t, isLabel(n) || isSubdomain(n), "identity %q from an invalid name", m.ID)
		}
	})
}

// checkAddr checks that a is a usable TCP ip:port, and returns it.
func checkAddr(t *testing.T, a string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a)
	require.NoError(t, err, "address %q", a)
	require.Equal(t, ap.String(), a, "address not canonical")
	require.True(t, usable(ap.Addr()), "unusable address %q", a)
	require.True(t, ap.Port() >= 1, "port 0 in %q", a)
	return ap
}

// Arrays are held to the API's limits while they are decoded: a slice of
// more than 1000 endpoints is an error, and 7 MiB of empty endpoints cost
// kilobytes, not the gigabyte of structs they would decode to.
func TestBoundedArrays(t *testing.T) {
	d := decoder{t: target{service: "memcache", namespace: "default", port: 11211}}
	sliceOf := func(n int, ep string) []byte {
		return []byte(`{"kind":"EndpointSlice","metadata":{"name":"a"},"addressType":"IPv4","endpoints":[` +
			strings.TrimSuffix(strings.Repeat(ep+",", n), ",") + `],"ports":[{"name":"memcache","port":11211}]}`)
	}
	_, _, eps, err := d.decode(sliceOf(1000, `{"addresses":["10.0.0.1"]}`))
	require.NoError(t, err)
	require.Len(t, eps, 1000)

	_, _, _, err = d.decode(sliceOf(1001, `{"addresses":["10.0.0.1"]}`))
	require.ErrorContains(t, err, "an array of more than 1000 elements, the API's limit")

	_, _, _, err = d.decode([]byte(`{"metadata":{"name":"a"},"addressType":"IPv4","endpoints":[{"addresses":[` + strings.Repeat(`"10.0.0.1",`, 100) + `"10.0.0.2"]}]}`))
	require.ErrorContains(t, err, "more than 100 elements")

	huge := sliceOf(7<<20/3, `{}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, _, err = d.decode(huge)
	runtime.ReadMemStats(&after)
	require.Error(t, err)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "bytes allocated decoding 7 MiB of empty endpoints")
}
