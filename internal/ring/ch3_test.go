package ring

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ch3 of key over m servers, as mcrouter's Ch3HashFunc.
func ch3Of(key string, m uint32) uint32 { return furc(Murmur64A(key), m) }

// TestCh3Vectors: the values of mcrouter's lib/test/Ch3HashTest.cpp,
// verbatim.
func TestCh3Vectors(t *testing.T) {
	maxKey := make([]byte, 256) // bytes (i-128) for i in 0..255
	for i := range maxKey {
		maxKey[i] = byte(i - 128)
	}
	reversed := make([]byte, 256)
	for i := range reversed {
		reversed[i] = maxKey[255-i]
	}
	for _, tc := range []struct {
		name string
		key  string
		m    uint32
		want uint32
	}{
		{"sample over 100", "sample", 100, 97},
		{"sample over 1", "sample", 1, 0},
		{"empty over 100", "", 100, 72},
		{"empty over 1", "", 1, 0},
		{"empty over the maximum", "", maxCh3, 6173600},
		{"sample over the maximum", "sample", maxCh3, 5167780},
		{"bytes -128..127 over 99999", string(maxKey), 99999, 31015},
		{"bytes 127..-128 over 99999", string(reversed), 99999, 67101},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ch3Of(tc.key, tc.m))
		})
	}
}

// TestCh3Distributions: Ch3HashTest's ch3_3 and ch3_10 counts.
func TestCh3Distributions(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys int
		want []int
	}{
		{"ch3_3", 1000, []int{307, 342, 351}},
		{"ch3_10", 10000, []int{995, 955, 1046, 968, 1032, 972, 1016, 1038, 1010, 968}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]int, len(tc.want))
			for i := range tc.keys {
				got[ch3Of(strconv.Itoa(i), uint32(len(got)))]++
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRoutingKey(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"plain", "plain"},
		{"/region/cluster/foo", "foo"},
		{"/region/cluster/foo|#|bar", "foo"},
		{"foo|#|bar", "foo"},
		{"/notaprefix", "/notaprefix"},
		{"/a/", "/a/"},
		{"/a//b", "b"},
	} {
		require.Equal(t, tc.want, RoutingKey(tc.key), tc.key)
	}
}

// FuzzCh3: furc is an index below m for any key and m, and a hole never
// swallows a key: a ring with holes gives every key a member.
func FuzzCh3(f *testing.F) {
	f.Add("sample", uint32(100), uint8(3))
	f.Add("", uint32(maxCh3), uint8(0))
	f.Fuzz(func(t *testing.T, key string, m uint32, hole uint8) {
		m = m%maxCh3 + 1
		if got := furc(Murmur64A(key), m); got >= m {
			t.Fatalf("furc(%q, %d) = %d", key, m, got)
		}
		n := int(m%64) + 2
		pos := make([]int, 0, n)
		for p := range n {
			if p != int(hole)%n {
				pos = append(pos, p)
			}
		}
		r := newCh3(pos)
		if o := r.owner(Murmur64A(key)); int(o) >= len(pos) {
			t.Fatalf("owner %d of %d members", o, len(pos))
		}
	})
}

// FuzzRoutingKey: the routing key is a part of the key, without a hash
// stop.
func FuzzRoutingKey(f *testing.F) {
	for _, k := range []string{"plain", "/region/cluster/foo|#|bar", "/a/", "|#|"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		rk := RoutingKey(key)
		if !strings.Contains(key, rk) || strings.Contains(rk, "|#|") || len(rk) > len(key) {
			t.Fatalf("RoutingKey(%q) = %q", key, rk)
		}
	})
}
