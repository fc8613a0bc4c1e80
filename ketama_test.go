package selector

import (
	"cmp"
	"crypto/md5"
	"encoding/binary"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	hashring "github.com/kubecache/k8s-memcache-selector/internal/ring"
	"github.com/kubecache/k8s-memcache-selector/internal/ring/ringtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libmemcachedList is a ServerList of Ketama over libmemcached's test
// servers.
func libmemcachedList(t *testing.T) *ServerList {
	w := map[string]int{}
	var addrs []string
	for _, s := range ringtest.LibmemcachedServers {
		w[s.Addr] = int(s.Weight)
		addrs = append(addrs, s.Addr)
	}
	ss := new(ServerList)
	require.NoError(t, ss.SetHashing(Ketama().WithWeights(w)))
	require.NoError(t, ss.SetServers(addrs...))
	return ss
}

// TestKetamaLibmemcachedVectors: libmemcached's 99 keys over 8 weighted
// servers: each key's md5 hash, the continuum point it hits, its server.
func TestKetamaLibmemcachedVectors(t *testing.T) {
	ss := libmemcachedList(t)
	r := ss.ring.Load()
	for _, tc := range ringtest.ReadKetamaCases(t, "testdata/ketama_libmemcached.tsv") {
		assert.Equal(t, tc.Hash, md5Key(tc.Key), "hash of %q", tc.Key)
		a, err := ss.PickServer(tc.Key)
		require.NoError(t, err)
		assert.Equal(t, tc.Server+":11211", a.String(), "server of %q", tc.Key)
	}
	// Past the last point, a key wraps around to the first, which hash 0
	// reaches (internal/ring's test checks the points themselves).
	a, _ := ss.PickServer("VDEAAAAA")
	assert.Equal(t, r.members[r.owner(0)].addr.str, a.String())
}

// TestKetamaNames: the string a server's points are hashed from: as
// libmemcached and twemproxy write it, the port left out where it is 11211,
// and an IPv6 host bare (interop_test.go checks the peers do so); the name
// is SetServers' canonical form, and internal/ring's TestKetamaHost checks
// that the continuum hashes it so.
func TestKetamaNames(t *testing.T) {
	for _, tc := range []struct {
		name, server string
		want         string
	}{
		{"default port", "10.0.0.1:11211", "10.0.0.1-0"},
		{"other port", "10.0.0.1:11311", "10.0.0.1:11311-0"},
		{"host name", "localhost:11211", "localhost-0"},
		{"IPv6, default port", "[::1]:11211", "::1-0"},
		{"IPv6, other port", "[::1]:11212", "::1:11212-0"},
		{"IPv6 in canonical form", "[FD00:0::1]:11311", "fd00::1:11311-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := new(ServerList)
			require.NoError(t, ss.SetHashing(Ketama()))
			require.NoError(t, ss.SetServers(tc.server))
			r := ss.ring.Load()
			name, err := r.alt.name(r.members[0])
			require.NoError(t, err)
			require.Equal(t, tc.want, hashring.KetamaHost(name)+"-0")
		})
	}
}

// refKetama is libmemcached's continuum in a few lines, for the tests: the
// servers' points from the strings hashed (hosts[i]+"-d"), 160 a server,
// sorted by value then list position, and a key's server the index of the
// first point at or after its hash, wrapping around.
func refKetama(hosts []string) func(key string) int {
	type point struct{ value, server uint32 }
	var pts []point
	for i, h := range hosts {
		for d := range 40 {
			sum := md5.Sum([]byte(h + "-" + strconv.Itoa(d)))
			for a := range 4 {
				pts = append(pts, point{binary.LittleEndian.Uint32(sum[4*a:]), uint32(i)})
			}
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		if a.value != b.value {
			return cmp.Compare(a.value, b.value)
		}
		return cmp.Compare(a.server, b.server)
	})
	return func(key string) int {
		h := md5Key(key)
		i, _ := slices.BinarySearchFunc(pts, h, func(p point, h uint32) int { return cmp.Compare(p.value, h) })
		return int(pts[i%len(pts)].server)
	}
}

// ketamaTie is two servers whose points meet, and a key that goes to
// their common point: libmemcached gives it to the one it lists first.
type ketamaTie struct {
	a, b string // as given to SetServers
	key  string
}

// findKetamaTies returns up to n pairs of the servers host:lo to
// host:hi-1 (none on port 11211: their names are hashed whole) that have a
// point in common, each with a key that goes to it. Among 6000 servers of
// 160 points there are about (6000*160)^2/2^33, 100, such pairs.
func findKetamaTies(host string, lo, hi, n int) []ketamaTie {
	at := map[uint32]string{} // point -> the first server with it
	var ties []ketamaTie
	for p := lo; p < hi && len(ties) < n; p++ {
		s := net.JoinHostPort(host, strconv.Itoa(p))
		for d := range 40 {
			sum := md5.Sum([]byte(host + ":" + strconv.Itoa(p) + "-" + strconv.Itoa(d)))
			for a := range 4 {
				v := binary.LittleEndian.Uint32(sum[4*a:])
				other, ok := at[v]
				if !ok {
					at[v] = s
					continue
				}
				if other == s || len(ties) == n {
					continue
				}
				// A key of the tie goes to whichever server is listed first.
				ab := refKetama([]string{peerServer(other), peerServer(s)})
				ba := refKetama([]string{peerServer(s), peerServer(other)})
				for k := 0; ; k++ {
					key := "tie:" + strconv.Itoa(k)
					if ab(key) == 0 && ba(key) == 0 {
						ties = append(ties, ketamaTie{other, s, key})
						break
					}
				}
			}
		}
	}
	return ties
}

// TestKetamaTies: where two servers' points are equal, the one listed
// first owns the keys that reach them, as in libmemcached and
// php-memcached; interop_test.go checks it against the peers. For
// SetServers that is the order given, also when a list is given again in
// another order; for discovered servers, which have no order, twemproxy's:
// the shorter name first, then byte by byte.
func TestKetamaTies(t *testing.T) {
	ties := findKetamaTies("127.0.0.1", 8000, 14000, 100)
	require.Greater(t, len(ties), 20)
	pick := func(ss *ServerList, key string) string {
		a, err := ss.PickServer(key)
		require.NoError(t, err)
		return a.String()
	}
	list := func(servers ...string) *ServerList {
		ss := new(ServerList)
		require.NoError(t, ss.SetHashing(Ketama()))
		require.NoError(t, ss.SetServers(servers...))
		return ss
	}
	mixed := 0 // ties of a 4-digit port and a 5-digit one
	for _, tie := range ties {
		assert.Equal(t, tie.a, pick(list(tie.a, tie.b), tie.key), "%s, %s: %q", tie.a, tie.b, tie.key)
		assert.Equal(t, tie.b, pick(list(tie.b, tie.a), tie.key), "%s, %s: %q", tie.b, tie.a, tie.key)
		ss := list(tie.a, tie.b)
		require.NoError(t, ss.SetServers(tie.b, tie.a))
		assert.Equal(t, tie.b, pick(ss, tie.key), "%s, %s after %[2]s, %[1]s: %q", tie.b, tie.a, tie.key)
		// A third server listed anywhere leaves the tie's keys with the
		// first of the two, unless it takes them.
		other := "127.0.0.2:11211"
		if ref := refKetama([]string{peerServer(tie.a), peerServer(tie.b), "127.0.0.2"}); ref(tie.key) != 2 {
			assert.Equal(t, tie.a, pick(list(other, tie.a, tie.b), tie.key))
			assert.Equal(t, tie.b, pick(list(tie.b, other, tie.a), tie.key))
		}

		// Discovered, whatever their identities: twemproxy's order.
		first := twemproxyFirst(tie.a, tie.b)
		if len(tie.a) != len(tie.b) {
			mixed++
		}
		for _, ids := range [][]string{{"memcache-0:11211", "memcache-1:11211"}, {"memcache-1:11211", "memcache-0:11211"}} {
			ms := []member{{id: ids[0], addr: &staticAddr{"tcp", tie.a}}, {id: ids[1], addr: &staticAddr{"tcp", tie.b}}}
			slices.SortFunc(ms, func(x, y member) int { return strings.Compare(x.id, y.id) })
			r, err := newAltRing(Ketama(), ms)
			require.NoError(t, err)
			assert.Equal(t, first, r.addrs[r.owner(uint64(md5Key(tie.key)))].str, "discovered %s, %s: %q", tie.a, tie.b, tie.key)
		}
	}
	require.NotZero(t, mixed, "no tie of names of two lengths")
}

// twemproxyFirst returns which of two servers (host:port, not 11211)
// twemproxy lists first: the shorter name, else the lower.
func twemproxyFirst(a, b string) string {
	if len(a) < len(b) || len(a) == len(b) && a < b {
		return a
	}
	return b
}

// listOrder is the ranks of n servers in list order (see
// hashring.NewKetama).
func listOrder(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}
