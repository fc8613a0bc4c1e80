package main

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestModuloMoves checks the exact modulo count against gomemcache's own
// ServerList on sampled keys.
func TestModuloMoves(t *testing.T) {
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("10.0.0.%d:11211", i+1)
	}
	for _, tc := range []struct {
		name  string
		after []string
	}{
		{"one removed", slices.Delete(slices.Clone(ids), 4, 5)},
		{"one added", append(slices.Clone(ids), "10.0.1.1:11211")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exact, _ := moduloMoves(ids, tc.after)
			var a, b memcache.ServerList
			require.NoError(t, a.SetServers(ids...))
			require.NoError(t, b.SetServers(tc.after...))
			const keys = 100000
			moved := 0
			for i := range keys {
				k := fmt.Sprintf("key:%d", i)
				x, err := a.PickServer(k)
				require.NoError(t, err)
				y, err := b.PickServer(k)
				require.NoError(t, err)
				if x.String() != y.String() {
					moved++
				}
			}
			sigma := math.Sqrt(exact * (1 - exact) / keys)
			assert.InDelta(t, exact, float64(moved)/keys, 5*sigma, "gomemcache's moved fraction of sampled keys, against the exact count (5 sigma)")
		})
	}
}

// TestJump checks the jump hash's defining property: going from n to n+1
// buckets, a key stays or moves to the new bucket n.
func TestJump(t *testing.T) {
	for k := range uint64(2000) {
		h := xxhash.Sum64String(fmt.Sprint(k))
		prev := jump(h, 1)
		require.Zero(t, prev, "jump(%#x, 1)", h)
		for n := 2; n <= 50; n++ {
			b := jump(h, n)
			if b != prev {
				require.Equal(t, n-1, b, "jump(%#x, %d), was %d with %d buckets", h, n, prev, n-1)
			}
			prev = b
		}
	}
}

func TestNatCompare(t *testing.T) {
	names := []string{"memcached-10:11211", "memcached-9:11211", "memcached-1:11211", "memcached-0:11211", "memcached-01:11211"}
	slices.SortStableFunc(names, natCompare)
	assert.Equal(t, []string{"memcached-0:11211", "memcached-1:11211", "memcached-01:11211", "memcached-9:11211", "memcached-10:11211"}, names)
}
