package meta

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRealCommands runs every command and flag against memcached 1.6,
// including the facts of /work/shared/research/meta.md.
func TestRealCommands(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	all := GetOptions{Value: true, ClientFlags: true, CAS: true, TTL: true, Size: true, Key: true}

	set := func(t *testing.T, key, v string, o SetOptions) Item {
		t.Helper()
		it, err := c.Set(ctx, key, []byte(v), o)
		require.NoError(t, err)
		return it
	}
	get := func(t *testing.T, key string, o GetOptions) Item {
		t.Helper()
		it, err := c.Get(ctx, key, o)
		require.NoError(t, err)
		return it
	}

	t.Run("set and get every flag", func(t *testing.T) {
		set(t, "foo", "hi", SetOptions{TTL: 90, ClientFlags: 5})
		it := get(t, "foo", all)
		require.Equal(t, "hi", string(it.Value))
		require.Equal(t, "foo", it.Key)
		require.EqualValues(t, 5, it.ClientFlags)
		require.EqualValues(t, 2, it.Size)
		require.InDelta(t, 90, it.TTL, 1)
		require.NotZero(t, it.CAS)
		require.Equal(t, RetTTL|RetFlags|RetCAS|RetSize|RetKey, it.Has)
	})
	t.Run("head only", func(t *testing.T) {
		it := get(t, "foo", GetOptions{CAS: true})
		require.Nil(t, it.Value)
		require.NotZero(t, it.CAS)
	})
	t.Run("never expires", func(t *testing.T) {
		set(t, "forever", "x", SetOptions{})
		require.EqualValues(t, -1, get(t, "forever", GetOptions{TTL: true}).TTL)
	})
	t.Run("miss", func(t *testing.T) {
		_, err := c.Get(ctx, "missing", all)
		require.ErrorIs(t, err, ErrMiss)
	})
	t.Run("opaque", func(t *testing.T) {
		// The Conn replaces the opaque with its own, and checks it.
		it := get(t, "foo", GetOptions{Value: true, Opaque: 42})
		require.Equal(t, "hi", string(it.Value))
	})
	t.Run("touch", func(t *testing.T) {
		set(t, "touched", "x", SetOptions{TTL: 90})
		require.InDelta(t, 30, get(t, "touched", GetOptions{TTL: true, Touch: true, TouchTTL: 30}).TTL, 1)
		require.InDelta(t, 30, get(t, "touched", GetOptions{TTL: true}).TTL, 1)
		get(t, "touched", GetOptions{Touch: true, TouchTTL: 0})
		require.EqualValues(t, -1, get(t, "touched", GetOptions{TTL: true}).TTL)
	})
	t.Run("modes", func(t *testing.T) {
		tests := []struct {
			name  string
			mode  Mode
			value string
			err   error
			want  string // the value after, "" for absent
		}{
			{"add absent", ModeAdd, "a", nil, "a"},
			{"add present", ModeAdd, "b", ErrNotStored, "a"},
			{"replace present", ModeReplace, "r", nil, "r"},
			{"append", ModeAppend, "+", nil, "r+"},
			{"prepend", ModePrepend, "-", nil, "-r+"},
			{"set", ModeSet, "s", nil, "s"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				_, err := c.Set(ctx, "modes", []byte(tt.value), SetOptions{Mode: tt.mode})
				if tt.err != nil {
					require.ErrorIs(t, err, tt.err)
				} else {
					require.NoError(t, err)
				}
				require.Equal(t, tt.want, string(get(t, "modes", GetOptions{Value: true}).Value))
			})
		}
		for _, mode := range []Mode{ModeReplace, ModeAppend, ModePrepend} {
			_, err := c.Set(ctx, "modes-absent", []byte("x"), SetOptions{Mode: mode})
			require.ErrorIs(t, err, ErrNotStored, "mode %c on a miss", mode)
		}
	})
	t.Run("cas", func(t *testing.T) {
		it := set(t, "cas", "1", SetOptions{ReturnCAS: true})
		require.NotZero(t, it.CAS)
		require.Equal(t, it.CAS, get(t, "cas", GetOptions{CAS: true}).CAS)
		_, err := c.Set(ctx, "cas", []byte("2"), SetOptions{CompareCAS: it.CAS + 1000})
		require.ErrorIs(t, err, ErrExists)
		_, err = c.Set(ctx, "cas", []byte("2"), SetOptions{CompareCAS: it.CAS})
		require.NoError(t, err)
		require.Equal(t, "2", string(get(t, "cas", GetOptions{Value: true}).Value))
		_, err = c.Set(ctx, "cas-absent", []byte("2"), SetOptions{CompareCAS: 5})
		require.ErrorIs(t, err, ErrNotFound)
	})
	t.Run("set invalidate with an older cas", func(t *testing.T) {
		it := set(t, "inv-set", "new", SetOptions{ReturnCAS: true})
		_, err := c.Set(ctx, "inv-set", []byte("old"), SetOptions{CompareCAS: it.CAS - 1, Invalidate: true})
		require.NoError(t, err)
		got := get(t, "inv-set", GetOptions{Value: true})
		require.Equal(t, "old", string(got.Value))
		require.True(t, got.Stale(), "X after a set with I and an older CAS")
	})
	t.Run("delete", func(t *testing.T) {
		set(t, "del", "x", SetOptions{})
		require.NoError(t, c.Delete(ctx, "del", DeleteOptions{}))
		_, err := c.Get(ctx, "del", GetOptions{})
		require.ErrorIs(t, err, ErrMiss)
		require.ErrorIs(t, c.Delete(ctx, "del", DeleteOptions{}), ErrNotFound)
		it := set(t, "del", "x", SetOptions{ReturnCAS: true})
		require.ErrorIs(t, c.Delete(ctx, "del", DeleteOptions{CompareCAS: it.CAS + 1}), ErrExists)
		require.NoError(t, c.Delete(ctx, "del", DeleteOptions{CompareCAS: it.CAS}))
	})
	t.Run("invalidate then X W, then Z", func(t *testing.T) {
		before := set(t, "inv", "hi", SetOptions{TTL: 90, ReturnCAS: true})
		require.NoError(t, c.Delete(ctx, "inv", DeleteOptions{Invalidate: true, TTL: 30}))
		o := GetOptions{Value: true, TTL: true, CAS: true}
		it := get(t, "inv", o)
		require.Equal(t, "hi", string(it.Value))
		require.InDelta(t, 30, it.TTL, 1)
		require.Greater(t, it.CAS, before.CAS, "the invalidation bumps the CAS")
		require.True(t, it.Stale())
		require.True(t, it.Won())
		require.False(t, it.AlreadyWon())
		it = get(t, "inv", o)
		require.True(t, it.Stale())
		require.True(t, it.AlreadyWon())
		require.False(t, it.Won())
	})
	t.Run("vivify W then Z", func(t *testing.T) {
		o := GetOptions{Value: true, TTL: true, CAS: true, Vivify: true, VivifyTTL: 30}
		it := get(t, "viv", o)
		require.True(t, it.Won())
		require.NotNil(t, it.Value)
		require.Empty(t, it.Value)
		require.InDelta(t, 30, it.TTL, 1)
		it2 := get(t, "viv", o)
		require.True(t, it2.AlreadyWon())
		require.False(t, it2.Won())
		require.Equal(t, it.CAS, it2.CAS)
	})
	t.Run("a lease holder's set fails after an invalidation", func(t *testing.T) {
		it := get(t, "lease", GetOptions{CAS: true, Vivify: true, VivifyTTL: 30})
		require.True(t, it.Won())
		require.NoError(t, c.Delete(ctx, "lease", DeleteOptions{Invalidate: true}))
		_, err := c.Set(ctx, "lease", []byte("v"), SetOptions{CompareCAS: it.CAS})
		require.ErrorIs(t, err, ErrExists)
	})
	t.Run("arith", func(t *testing.T) {
		set(t, "cnt", "5", SetOptions{TTL: 60})
		n, err := c.Arith(ctx, "cnt", ArithOptions{Delta: 3, Value: true, TTL: true})
		require.NoError(t, err)
		require.EqualValues(t, 8, n.Value)
		require.InDelta(t, 60, n.TTL, 1)
		n, err = c.Arith(ctx, "cnt", ArithOptions{Decrement: true, Delta: 2, Value: true, CAS: true})
		require.NoError(t, err)
		require.EqualValues(t, 6, n.Value)
		require.NotZero(t, n.CAS)
		_, err = c.Arith(ctx, "cnt", ArithOptions{Delta: 1, CompareCAS: n.CAS + 1})
		require.ErrorIs(t, err, ErrExists)
		n, err = c.Arith(ctx, "cnt", ArithOptions{Decrement: true, Delta: 100, Value: true})
		require.NoError(t, err)
		require.EqualValues(t, 0, n.Value, "a decrement stops at 0")
		n, err = c.Arith(ctx, "cnt", ArithOptions{Delta: 1, Touch: true, TouchTTL: 300, TTL: true})
		require.NoError(t, err)
		require.InDelta(t, 300, n.TTL, 1)
		require.Zero(t, n.Value, "no v, no value")
		_, err = c.Arith(ctx, "cnt-absent", ArithOptions{Delta: 1})
		require.ErrorIs(t, err, ErrNotFound)
		n, err = c.Arith(ctx, "cnt-viv", ArithOptions{Delta: 1, Vivify: true, VivifyTTL: 60, Initial: 10, Value: true, TTL: true})
		require.NoError(t, err)
		require.EqualValues(t, 10, n.Value, "autovivified with J, no delta applied")
		require.InDelta(t, 60, n.TTL, 1)
		n, err = c.Arith(ctx, "cnt-viv", ArithOptions{Delta: 1, Vivify: true, VivifyTTL: 60, Initial: 10, Value: true})
		require.NoError(t, err)
		require.EqualValues(t, 11, n.Value)
		set(t, "not-a-number", "abc", SetOptions{})
		_, err = c.Arith(ctx, "not-a-number", ArithOptions{Delta: 1})
		var ce *ClientError
		require.ErrorAs(t, err, &ce, "memcached answers CLIENT_ERROR for a non-numeric value")
		require.Contains(t, ce.Msg, "non-numeric")
		require.NoError(t, c.Err(), "a CLIENT_ERROR leaves the connection in step")
	})
	t.Run("noop", func(t *testing.T) {
		require.NoError(t, c.Noop(ctx))
	})
}

// The quiet batch: hits only, matched by opaque, ended by MN.
func TestRealGetMulti(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("multi:%d", i)
		if i%3 != 0 {
			_, err := c.Set(ctx, keys[i], []byte(strconv.Itoa(i)), SetOptions{ClientFlags: uint32(i)})
			require.NoError(t, err)
		}
	}
	got, err := c.GetMulti(ctx, keys, GetOptions{Value: true, ClientFlags: true, CAS: true})
	require.NoError(t, err)
	require.Len(t, got, 66)
	for i, k := range keys {
		it, ok := got[k]
		if i%3 == 0 {
			require.False(t, ok, k)
			continue
		}
		require.True(t, ok, k)
		require.Equal(t, k, it.Key)
		require.Equal(t, strconv.Itoa(i), string(it.Value))
		require.EqualValues(t, i, it.ClientFlags)
		require.NotZero(t, it.CAS)
	}
	// The connection is in step afterwards, and a batch of misses only is
	// just MN.
	none, err := c.GetMulti(ctx, []string{"nope1", "nope2"}, GetOptions{Value: true})
	require.NoError(t, err)
	require.Empty(t, none)
	empty, err := c.GetMulti(ctx, nil, GetOptions{})
	require.NoError(t, err)
	require.Empty(t, empty)
	it, err := c.Get(ctx, keys[1], GetOptions{Value: true})
	require.NoError(t, err)
	require.Equal(t, "1", string(it.Value))
	_, err = c.GetMulti(ctx, []string{"ok", "bad key"}, GetOptions{})
	require.ErrorIs(t, err, ErrInvalidKey)
}

// hammer runs 64 goroutines of sets, gets, arith and batches with
// distinct keys on do, checking every reply is its own request's.
func hammer(t *testing.T, ops interface {
	Get(context.Context, string, GetOptions) (Item, error)
	Set(context.Context, string, []byte, SetOptions) (Item, error)
	Arith(context.Context, string, ArithOptions) (Counter, error)
	GetMulti(context.Context, []string, GetOptions) (map[string]Item, error)
}, round string) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for i := range 100 {
					key := fmt.Sprintf("h%s:%d:%d", round, g, i%10)
					val := fmt.Sprintf("%d/%d/%s", g, i, key)
					if _, err := ops.Set(ctx, key, []byte(val), SetOptions{ClientFlags: uint32(g*1000 + i)}); err != nil {
						return err
					}
					it, err := ops.Get(ctx, key, GetOptions{Value: true, ClientFlags: true, Key: true})
					if err != nil {
						return err
					}
					if string(it.Value) != val || it.Key != key || it.ClientFlags != uint32(g*1000+i) {
						return fmt.Errorf("get %s = %q %q %d, want %q", key, it.Key, it.Value, it.ClientFlags, val)
					}
					if _, err := ops.Get(ctx, key+":miss", GetOptions{Value: true}); err != ErrMiss {
						return fmt.Errorf("get of a miss: %v", err)
					}
					n, err := ops.Arith(ctx, fmt.Sprintf("h%s:%d:n", round, g), ArithOptions{Delta: 1, Vivify: true, VivifyTTL: 60, Value: true})
					if err != nil {
						return err
					}
					if n.Value != uint64(i) {
						return fmt.Errorf("counter of %d = %d, want %d", g, n.Value, i)
					}
					if i%10 == 9 {
						keys := []string{fmt.Sprintf("h%s:%d:%d", round, g, 8), key, key + ":miss"}
						m, err := ops.GetMulti(ctx, keys, GetOptions{Value: true})
						if err != nil {
							return err
						}
						if len(m) != 2 || string(m[key].Value) != val {
							return fmt.Errorf("getmulti %v = %v", keys, m)
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestRealHammerConn(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	for round := range 3 {
		hammer(t, c, fmt.Sprint(round))
		require.Zero(t, c.Outstanding(), "every request answered once")
		require.NoError(t, c.Err())
	}
}

func TestRealHammerPool(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	p := m.pool(t, Options{MaxConns: 4})
	hammer(t, p, "")
	p.mu.Lock()
	n := len(p.conns)
	p.mu.Unlock()
	require.LessOrEqual(t, n, 4)
	require.GreaterOrEqual(t, n, 2, "64 goroutines keep more than one connection busy")
}

func TestRealDetect(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	p := m.pool(t, Options{})
	require.NoError(t, p.Detect(context.Background()))
}

// Values up to memcached's item limit round-trip; a larger one is the
// server's SERVER_ERROR, after which the connection is still in step.
func TestRealLargeValues(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	for _, n := range []int{0, 1, 4095, 4096, 64 << 10, 1<<20 - 512} {
		v := make([]byte, n)
		for i := range v {
			v[i] = byte(i*7 + n)
		}
		k := fmt.Sprintf("large:%d", n)
		_, err := c.Set(ctx, k, v, SetOptions{})
		require.NoError(t, err, "%d bytes", n)
		it, err := c.Get(ctx, k, GetOptions{Value: true, Size: true})
		require.NoError(t, err)
		require.Equal(t, v, it.Value, "%d bytes", n)
		require.EqualValues(t, n, it.Size)
	}
	_, err := c.Set(ctx, "huge", make([]byte, 2<<20), SetOptions{})
	var se *ServerError
	require.ErrorAs(t, err, &se)
	require.Contains(t, se.Msg, "too large")
	require.NoError(t, c.Err())
	require.NoError(t, c.Noop(ctx))
	_, err = c.Get(ctx, "huge", GetOptions{Value: true})
	require.ErrorIs(t, err, ErrMiss)

	// A client bound below the server's: the value is read past, its
	// request fails, and the connection stays in step.
	small := m.conn(t, Options{MaxValueSize: 1000})
	_, err = small.Get(ctx, "large:4096", GetOptions{Value: true})
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "a value of 4096 bytes, over the bound of 1000")
	require.NoError(t, small.Err())
	it, err := small.Get(ctx, "large:1", GetOptions{Value: true})
	require.NoError(t, err)
	require.Len(t, it.Value, 1)
}
