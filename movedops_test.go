package selector

import (
	"fmt"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// Every operation on a key that moved (after a change, still at its old
// server) behaves as on a key that did not, with moves on and off: the
// same result, and the same value after it, for this client and for a
// client started after the change. Touch returned a miss, Replace "not
// stored" (both deleting the value where it was), and Add succeeded over
// it, so that a lock built on Add was taken twice.
func TestOperationsOnAMovedKey(t *testing.T) {
	type result struct {
		val string // what the operation returned, if a value
		err error
	}
	for _, tc := range []struct {
		name  string
		op    func(c *Client, k string) result
		want  result
		after string // the key's value after it; "" for a miss
	}{
		{"Touch", func(c *Client, k string) result { return result{err: c.Touch(k, 100)} }, result{}, "10"},
		{"Replace", func(c *Client, k string) result {
			return result{err: c.Replace(&memcache.Item{Key: k, Value: []byte("r")})}
		}, result{}, "r"},
		{"Add", func(c *Client, k string) result {
			return result{err: c.Add(&memcache.Item{Key: k, Value: []byte("a")})}
		}, result{err: memcache.ErrNotStored}, "10"},
		{"CompareAndSwap", func(c *Client, k string) result {
			it, err := c.Get(k)
			if err != nil {
				return result{err: err}
			}
			it.Value = []byte("c")
			return result{err: c.CompareAndSwap(it)}
		}, result{}, "c"},
		{"GetAndTouch", func(c *Client, k string) result {
			it, err := c.GetAndTouch(k, 100)
			if err != nil {
				return result{err: err}
			}
			return result{val: string(it.Value)}
		}, result{val: "10"}, "10"},
		{"Increment", func(c *Client, k string) result {
			n, err := c.Increment(k, 1)
			return result{val: fmt.Sprint(n), err: err}
		}, result{val: "11"}, "11"},
		{"Decrement", func(c *Client, k string) result {
			n, err := c.Decrement(k, 1)
			return result{val: fmt.Sprint(n), err: err}
		}, result{val: "9"}, "9"},
		{"Append", func(c *Client, k string) result {
			return result{err: c.Append(&memcache.Item{Key: k, Value: []byte("x")})}
		}, result{}, "10x"},
		{"Prepend", func(c *Client, k string) result {
			return result{err: c.Prepend(&memcache.Item{Key: k, Value: []byte("x")})}
		}, result{}, "x10"},
		{"Delete", func(c *Client, k string) result { return result{err: c.Delete(k)} }, result{}, ""},
	} {
		for _, moves := range []Moves{{Rate: -1}, {Rate: 50}} {
			t.Run(fmt.Sprintf("%s/moves %d", tc.name, moves.Rate), func(t *testing.T) {
				ms := startMemcached(t, 3)
				c, ss := newTestClient(t, addrsOf(ms[:2]), WithMoves(moves))
				all := listOf(t, addrsOf(ms)...)
				k := keysOf(t, all, ms[2].addr, 1)[0]
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("10")}))
				require.NoError(t, ss.SetServers(addrsOf(ms)...))
				eventually(t, "the client to see the change", func() bool { return len(c.rt.Load().past) > 0 })

				got := tc.op(c, k)
				require.ErrorIs(t, got.err, tc.want.err)
				if tc.want.err == nil {
					require.NoError(t, got.err)
				}
				require.Equal(t, tc.want.val, got.val)

				fresh, _ := newTestClient(t, addrsOf(ms), WithMoves(Moves{Rate: -1}))
				for _, r := range []*Client{c, fresh} {
					it, err := r.Get(k)
					if tc.after == "" {
						require.ErrorIs(t, err, memcache.ErrCacheMiss)
						continue
					}
					require.NoError(t, err)
					// A decremented value may keep its length, padded with
					// spaces, or not: protocol.txt says not to rely on either
					// (memcached pads only an item no other thread holds).
					require.Equal(t, tc.after, strings.TrimRight(string(it.Value), " "))
				}
			})
		}
	}
}
