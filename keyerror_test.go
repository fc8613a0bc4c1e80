package selector

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// TestMalformedKeyErrors: a key memcached refuses gets an error that names
// it (quoted, its first 64 bytes) and the rule it breaks, and is still
// memcache.ErrMalformedKey to errors.Is. A good key costs no allocation.
func TestMalformedKeyErrors(t *testing.T) {
	long := strings.Repeat("k", 300)
	shown := `"` + strings.Repeat("k", 64) + `"...`
	for _, tc := range []struct {
		name string
		key  string
		want string // "" for a good key
	}{
		{"plain", "user:42", ""},
		{"250 bytes", strings.Repeat("k", 250), ""},
		{"UTF-8", "Hello_世界", ""},
		{"bytes past ASCII", "\x80\xff", ""},
		{"251 bytes", strings.Repeat("k", 251),
			`selector: malformed key ` + shown + `: 251 bytes, over memcached's limit of 250`},
		{"300 bytes with a space", long[:100] + " " + long[:199],
			`selector: malformed key ` + shown + `: 300 bytes, over memcached's limit of 250`},
		{"a space", "foo bar",
			`selector: malformed key "foo bar": a space at byte 3 (memcached keys have no spaces or control characters)`},
		{"a newline", "foo\n",
			`selector: malformed key "foo\n": control character 0x0a at byte 3 (memcached keys have no spaces or control characters)`},
		{"NUL first", "\x00foo",
			`selector: malformed key "\x00foo": control character 0x00 at byte 0 (memcached keys have no spaces or control characters)`},
		{"DEL", "foo\x7f",
			`selector: malformed key "foo\x7f": control character 0x7f at byte 3 (memcached keys have no spaces or control characters)`},
		{"a space past what is shown", long[:100] + " x",
			`selector: malformed key ` + shown + `: a space at byte 100 (memcached keys have no spaces or control characters)`},
		{"cut before a character, not in it", strings.Repeat("k", 63) + "é tail" + strings.Repeat("k", 10),
			`selector: malformed key "` + strings.Repeat("k", 63) + `"...: a space at byte 65 (memcached keys have no spaces or control characters)`},
		{"empty", "", `selector: malformed key "": a key is 1 to 250 bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkKey(tc.key)
			if tc.want == "" {
				require.NoError(t, err)
				require.True(t, legalKey(tc.key))
				require.Zero(t, testing.AllocsPerRun(100, func() { _ = checkKey(tc.key) }), "allocations for a good key")
				return
			}
			require.EqualError(t, err, tc.want)
			require.ErrorIs(t, err, memcache.ErrMalformedKey)
			require.False(t, legalKey(tc.key))
		})
	}
}

// TestMalformedKeyEveryOp: every operation of the Client, on its own and
// in a pool, refuses a bad key with the same error, before anything is
// sent.
func TestMalformedKeyEveryOp(t *testing.T) {
	ms := startMemcached(t, 2)
	plain, _ := newTestClient(t, addrsOf(ms))
	pooled, _ := newPoolClient(t, ms, []string{"", ""}, Replicated())
	ctx := context.Background()
	load := func(context.Context, string) (*memcache.Item, error) { return &memcache.Item{Value: []byte("v")}, nil }
	item := func(key string) *memcache.Item { return &memcache.Item{Key: key, Value: []byte("v")} }
	ops := []struct {
		name string
		op   func(c *Client, key string) error
	}{
		{"Get", func(c *Client, k string) error { _, err := c.Get(k); return err }},
		{"GetMulti", func(c *Client, k string) error { _, err := c.GetMulti([]string{"good", k}); return err }},
		{"GetAndTouch", func(c *Client, k string) error { _, err := c.GetAndTouch(k, 10); return err }},
		{"Touch", func(c *Client, k string) error { return c.Touch(k, 10) }},
		{"Set", func(c *Client, k string) error { return c.Set(item(k)) }},
		{"Add", func(c *Client, k string) error { return c.Add(item(k)) }},
		{"Replace", func(c *Client, k string) error { return c.Replace(item(k)) }},
		{"Append", func(c *Client, k string) error { return c.Append(item(k)) }},
		{"Prepend", func(c *Client, k string) error { return c.Prepend(item(k)) }},
		{"CompareAndSwap", func(c *Client, k string) error { it := item(k); it.CasID = 1; return c.CompareAndSwap(it) }},
		{"Delete", func(c *Client, k string) error { return c.Delete(k) }},
		{"Increment", func(c *Client, k string) error { _, err := c.Increment(k, 1); return err }},
		{"Decrement", func(c *Client, k string) error { _, err := c.Decrement(k, 1); return err }},
		{"GetOrLoad", func(c *Client, k string) error { _, err := c.GetOrLoad(ctx, k, LoadOptions{}, load); return err }},
		{"Invalidate", func(c *Client, k string) error { return c.Invalidate(context.Background(), k) }},
	}
	keys := []string{"a bad key", strings.Repeat("k", 251), "tab\there", ""}
	for _, c := range []*Client{plain, pooled} { // the first contacts done: nothing else is sent meanwhile
		require.NoError(t, c.Set(item("good")))
		_, err := c.GetMulti([]string{"good", "other"})
		require.NoError(t, err)
	}
	for _, client := range []struct {
		name string
		c    *Client
	}{{"client", plain}, {"pool", pooled}} {
		for _, op := range ops {
			if client.c == pooled && op.name == "CompareAndSwap" {
				continue // ErrPoolCAS whatever the key
			}
			t.Run(client.name+"/"+op.name, func(t *testing.T) {
				before := statOf(t, ms[0].addr, "bytes_read") + statOf(t, ms[1].addr, "bytes_read")
				for _, k := range keys {
					err := op.op(client.c, k)
					require.ErrorIs(t, err, memcache.ErrMalformedKey, "%q", k)
					var me *malformedKeyError
					require.ErrorAs(t, err, &me, "%q", k)
					require.EqualError(t, err, checkKey(k).Error())
				}
				// statOf's own "stats\r\n" is all that reached the servers.
				after := statOf(t, ms[0].addr, "bytes_read") + statOf(t, ms[1].addr, "bytes_read")
				require.Equal(t, before+2*int64(len("stats\r\n")), after, "bytes the servers read")
			})
		}
	}
}

// TestValueTooLarge: a value larger than its server's item_size_max
// (memcached's -I, here its default, 1 MiB) is not sent; its error gives
// the key, the value's size, the server and its limit. The key is then as
// memcached leaves it after refusing the value: a set deletes the value
// (so that the old one is not served after it), the other modes keep it.
// A value within the limit goes to the server, which may still refuse it
// (the limit counts the item's header too).
func TestValueTooLarge(t *testing.T) {
	ms := startMemcached(t, 1)
	// The read bound set apart from the server's limit, which is still the one checked.
	c, _ := newTestClient(t, addrsOf(ms), WithMaxItemSize(4<<20))
	const limit = 1 << 20
	over := bytes.Repeat([]byte("x"), limit+1)
	for _, tc := range []struct {
		name string
		op   func(key string) error
		kept bool // the key's old value stays
	}{
		{"Set", func(k string) error { return c.Set(&memcache.Item{Key: k, Value: over}) }, false},
		{"Add", func(k string) error { return c.Add(&memcache.Item{Key: k, Value: over}) }, true},
		{"Replace", func(k string) error { return c.Replace(&memcache.Item{Key: k, Value: over}) }, true},
		{"Append", func(k string) error { return c.Append(&memcache.Item{Key: k, Value: over}) }, true},
		{"Prepend", func(k string) error { return c.Prepend(&memcache.Item{Key: k, Value: over}) }, true},
		{"CompareAndSwap", func(k string) error {
			it, err := c.Get(k)
			require.NoError(t, err)
			it.Value = over
			return c.CompareAndSwap(it)
		}, true},
		{"GetOrLoad", func(k string) error {
			require.NoError(t, c.Delete(k))
			it, err := c.GetOrLoad(context.Background(), k, LoadOptions{}, func(context.Context, string) (*memcache.Item, error) {
				return &memcache.Item{Value: over}, nil
			})
			require.NoError(t, err, "a value loaded is returned, cached or not")
			require.Len(t, it.Value, len(over))
			return errors.New("not cached") // the value is returned, not cached: see TestGetOrLoadNotCachedReported
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "large:" + tc.name
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("abc")}))
			before := statOf(t, ms[0].addr, "bytes_read")
			err := tc.op(key)
			require.Less(t, statOf(t, ms[0].addr, "bytes_read")-before, int64(limit), "the value reached the server")
			var tl *valueTooLargeError
			if tc.name != "GetOrLoad" {
				require.ErrorAs(t, err, &tl)
				require.EqualError(t, err, `selector: value of key "`+key+`" not sent: 1048577 bytes, over the largest item memcached at `+
					ms[0].addr+` stores (1048576 bytes, its item_size_max, set by -I)`)
			}
			it, gerr := c.Get(key)
			if tc.kept {
				require.NoError(t, gerr)
				require.Equal(t, "abc", string(it.Value))
			} else {
				require.ErrorIs(t, gerr, memcache.ErrCacheMiss)
			}
			require.Equal(t, ServerUp, stateOf(c, ms[0].addr).State)
		})
	}

	t.Run("at the limit", func(t *testing.T) {
		// Sent: whether it fits is the server's to say (it does not, with
		// its header).
		before := statOf(t, ms[0].addr, "bytes_read")
		err := c.Set(&memcache.Item{Key: "large:at", Value: over[:limit]})
		require.Greater(t, statOf(t, ms[0].addr, "bytes_read")-before, int64(limit), "the value was not sent")
		require.ErrorContains(t, err, "SERVER_ERROR object too large for cache")
		var tl *valueTooLargeError
		require.False(t, errors.As(err, &tl))
	})
}

// TestValueLimitUnknown: before a server's limit is known (a server that
// does not say, or one without the meta protocol), a value is sent, and
// the server's answer returned, as before.
func TestValueLimitUnknown(t *testing.T) {
	s := &server{addr: &staticAddr{str: "10.0.0.1:11211"}}
	r := &keyOp{kind: opSet, key: "k", item: &memcache.Item{Key: "k", Value: make([]byte, 2<<20)}}
	require.NoError(t, s.fits(r), "limit unknown")
	s.itemMax.Store(4 << 20)
	require.NoError(t, s.fits(r), "within the limit")
	s.itemMax.Store(1 << 20)
	require.EqualError(t, s.fits(r), `selector: value of key "k" not sent: 2097152 bytes, over the largest item memcached at 10.0.0.1:11211 stores (1048576 bytes, its item_size_max, set by -I)`)
	require.NoError(t, s.fits(&keyOp{kind: opDelete, key: "k"}), "no value")
}
