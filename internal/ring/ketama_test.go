package ring

import (
	"crypto/md5"
	"encoding/binary"
	"strconv"
	"testing"

	"github.com/kubecache/k8s-memcache-selector/internal/ring/ringtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKetamaLibmemcachedVectors: libmemcached's 99 keys over 8 weighted
// servers: each key's md5 hash, the continuum point it hits, its server.
func TestKetamaLibmemcachedVectors(t *testing.T) {
	var names []string
	var weights []uint32
	for _, s := range ringtest.LibmemcachedServers {
		names, weights = append(names, s.Addr), append(weights, s.Weight)
	}
	r := NewKetama(names, weights, listOrder(len(names)))
	c := r.alt.cont
	require.Equal(t, 1264, len(c.value), "points") // 4 x (44+22+14+26+74+59+70+7): each weight's share of 40 x 8 digests, floored
	for _, tc := range ringtest.ReadKetamaCases(t, "../../testdata/ketama_libmemcached.tsv") {
		assert.Equal(t, tc.Hash, MD5Key(tc.Key), "hash of %q", tc.Key)
		assert.Equal(t, tc.Point, c.value[c.at(tc.Hash)], "point of %q", tc.Key)
		assert.Equal(t, tc.Server+":11211", names[r.Owner(uint64(MD5Key(tc.Key)))], "server of %q", tc.Key)
	}
	// Past the last point, a key wraps around to the first.
	require.Greater(t, MD5Key("VDEAAAAA"), c.value[len(c.value)-1])
	assert.Equal(t, c.member[0], r.Owner(uint64(MD5Key("VDEAAAAA"))))
}

// TestKetamaTwemproxyVectors: twemproxy's src/test_all.c, ketama_hash and
// hash_md5.
func TestKetamaTwemproxyVectors(t *testing.T) {
	point := func(s string, alignment int) uint32 {
		d := md5.Sum([]byte(s))
		return binary.LittleEndian.Uint32(d[4*alignment:])
	}
	assert.Equal(t, uint32(3853726576), point("server1-8", 0))
	assert.Equal(t, uint32(2667054752), point("server1-8", 3))
	assert.Equal(t, uint32(3195025439), MD5Key("apple"))
}

// TestKetamaPoints: the points a server gets are libmemcached's float32
// arithmetic, floored: with equal weights, 160 each, but 156 for the server
// counts where 1/n*40*n rounds below 40 in float32. The counts are
// libmemcached's expression (hosts.cc) compiled with gcc on amd64, at -O0
// and -O2, for 1 to 64 servers.
func TestKetamaPoints(t *testing.T) {
	short := map[int]bool{25: true, 47: true, 50: true, 55: true, 61: true}
	for n := 1; n <= 64; n++ {
		names := make([]string, n)
		for i := range names {
			names[i] = "10.0.0." + strconv.Itoa(i+1)
		}
		want := 160
		if short[n] {
			want = 156
		}
		require.Len(t, newContinuum(names, make([]uint32, n), listOrder(n)).value, n*want, "%d servers", n)
	}
}

// TestKetamaHost: the string a server's points are hashed from, before
// "-i": as libmemcached and twemproxy write it, the port left out where it
// is 11211, and an IPv6 host bare; the continuum has the points of those
// strings. The root's TestKetamaNames checks the names SetServers gives.
func TestKetamaHost(t *testing.T) {
	for _, tc := range []struct {
		name, server string
		want         string
	}{
		{"default port", "10.0.0.1:11211", "10.0.0.1"},
		{"other port", "10.0.0.1:11311", "10.0.0.1:11311"},
		{"host name", "localhost:11211", "localhost"},
		{"IPv6, default port", "[::1]:11211", "::1"},
		{"IPv6, other port", "[::1]:11212", "::1:11212"},
		{"no host:port", "/run/memcached.sock", "/run/memcached.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, KetamaHost(tc.server))
			d := md5.Sum([]byte(tc.want + "-0"))
			require.Contains(t, newContinuum([]string{tc.server}, []uint32{0}, []int{0}).value, binary.LittleEndian.Uint32(d[:4]))
		})
	}
}

// KetamaRanks orders discovered servers as twemproxy does: by the name it
// hashes, the shorter first, then byte by byte.
func TestKetamaRanks(t *testing.T) {
	names := []string{"10.0.0.10:11211", "10.0.0.9:11211", "10.0.0.9:11311", "10.0.0.1:11211"}
	require.Equal(t, []int{2, 1, 3, 0}, KetamaRanks(names))
}

// listOrder is the ranks of n servers in list order (see newContinuum).
func listOrder(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}
