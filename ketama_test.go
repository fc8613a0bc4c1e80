package selector

import (
	"bufio"
	"crypto/md5"
	"encoding/binary"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libmemcachedServers are the servers and weights of libmemcached's ketama
// test (see testdata/ketama_libmemcached.tsv).
var libmemcachedServers = []struct {
	addr   string
	weight int
}{
	{"10.0.1.1:11211", 600}, {"10.0.1.2:11211", 300}, {"10.0.1.3:11211", 200}, {"10.0.1.4:11211", 350},
	{"10.0.1.5:11211", 1000}, {"10.0.1.6:11211", 800}, {"10.0.1.7:11211", 950}, {"10.0.1.8:11211", 100},
}

type ketamaCase struct {
	key          string
	hash, point  uint32
	server, line string
}

func readKetamaCases(t *testing.T) []ketamaCase {
	f, err := os.Open("testdata/ketama_libmemcached.tsv")
	require.NoError(t, err)
	defer f.Close()
	var cs []ketamaCase
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		fs := strings.Split(sc.Text(), "\t")
		require.Len(t, fs, 4, sc.Text())
		h1, err1 := strconv.ParseUint(fs[1], 10, 32)
		h2, err2 := strconv.ParseUint(fs[2], 10, 32)
		require.NoError(t, err1)
		require.NoError(t, err2)
		cs = append(cs, ketamaCase{fs[0], uint32(h1), uint32(h2), fs[3], sc.Text()})
	}
	require.NoError(t, sc.Err())
	require.Len(t, cs, 99)
	return cs
}

// libmemcachedList is a ServerList of Ketama over libmemcached's test
// servers.
func libmemcachedList(t *testing.T) *ServerList {
	w := map[string]int{}
	var addrs []string
	for _, s := range libmemcachedServers {
		w[s.addr] = s.weight
		addrs = append(addrs, s.addr)
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
	c := r.alt.cont
	require.Equal(t, 1264, len(c.value), "points") // 4 x (44+22+14+26+74+59+70+7): each weight's share of 40 x 8 digests, floored
	for _, tc := range readKetamaCases(t) {
		assert.Equal(t, tc.hash, md5Key(tc.key), "hash of %q", tc.key)
		assert.Equal(t, tc.point, c.value[c.at(tc.hash)], "point of %q", tc.key)
		a, err := ss.PickServer(tc.key)
		require.NoError(t, err)
		assert.Equal(t, tc.server+":11211", a.String(), "server of %q", tc.key)
	}
	// Past the last point, a key wraps around to the first.
	require.Greater(t, md5Key("VDEAAAAA"), c.value[len(c.value)-1])
	a, _ := ss.PickServer("VDEAAAAA")
	assert.Equal(t, r.members[c.member[0]].addr.str, a.String())
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
	assert.Equal(t, uint32(3195025439), md5Key("apple"))
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
		require.Len(t, newContinuum(names, make([]uint32, n)).value, n*want, "%d servers", n)
	}
}

// TestKetamaNames: the string a server's points are hashed from.
func TestKetamaNames(t *testing.T) {
	for _, tc := range []struct {
		name, server string
		want         string
	}{
		{"default port", "10.0.0.1:11211", "10.0.0.1-0"},
		{"other port", "10.0.0.1:11311", "10.0.0.1:11311-0"},
		{"host name", "cache-0.example:11211", "cache-0.example-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newContinuum([]string{tc.server}, []uint32{1})
			d := md5.Sum([]byte(tc.want))
			require.Contains(t, c.value, binary.LittleEndian.Uint32(d[:4]))
		})
	}
}

// TestContinuumLookup: the bucketed search finds what a plain lower bound
// over all the points finds, wrapping around past the last.
func TestContinuumLookup(t *testing.T) {
	for _, n := range []int{1, 2, 7, 100, 1000} {
		names := make([]string, n)
		for i := range names {
			names[i] = "10.1.0." + strconv.Itoa(i) + ":11211"
		}
		c := newContinuum(names, make([]uint32, n))
		ref := func(h uint32) int {
			i, _ := slices.BinarySearch(c.value, h)
			if i == len(c.value) {
				return 0
			}
			return i
		}
		hs := []uint32{0, 1, ^uint32(0), c.value[0], c.value[len(c.value)-1], c.value[len(c.value)-1] + 1}
		for i := range 20000 {
			hs = append(hs, md5Key(strconv.Itoa(i)))
		}
		for _, v := range c.value[:min(len(c.value), 500)] {
			hs = append(hs, v-1, v, v+1)
		}
		for _, h := range hs {
			require.Equal(t, ref(h), c.at(h), "%d servers, hash %d", n, h)
		}
	}
}
