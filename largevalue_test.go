package selector

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// Values over memcached's default item size (1 MiB), on servers that
// store up to 4 MiB (-I 4m, common for large objects): the Client reads
// what the server stores, through every path a value takes, and a value
// over the Client's own bound fails its request only.

// largeSize is the size of the large values: over memcached's default
// limit, under -I 4m.
const largeSize = 3 << 20

// startLargeItems starts n memcached servers that store items of up to
// 4 MiB, with room for a dozen of them.
// largeTimeout gives the requests of megabytes of values, which -race and a
// loaded machine slow most, more than newTestClient's 300 ms.
var largeTimeout = WithTimeout(3 * time.Second)

func startLargeItems(t *testing.T, n int) []*memcached {
	t.Helper()
	ms := startMemcached(t, n)
	for _, m := range ms {
		m.restartWith("-I", "4m", "-m", "64")
	}
	return ms
}

// largeValue is key's large value: its bytes tell which key and offset
// they are, so that a value cut, shifted or swapped shows. Values are made
// once (a few are, and -race slows making them).
func largeValue(key string, n int) []byte {
	largeValues.Lock()
	defer largeValues.Unlock()
	if v, ok := largeValues.m[key]; ok && len(v) == n {
		return v
	}
	v := make([]byte, 0, n+32)
	for i := 0; len(v) < n; i++ {
		v = append(append(v, key...), '@')
		v = append(strconv.AppendInt(v, int64(i), 10), ';')
	}
	v = v[:n:n]
	largeValues.m[key] = v
	return v
}

var largeValues = struct {
	sync.Mutex
	m map[string][]byte
}{m: map[string][]byte{}}

// requireLarge fails unless it is key's large value.
func requireLarge(t *testing.T, key string, it *memcache.Item) {
	t.Helper()
	require.NotNil(t, it, "%s: no item", key)
	require.Len(t, it.Value, largeSize, key)
	require.True(t, bytes.Equal(largeValue(key, largeSize), it.Value), "%s: the value read is not the one written", key)
}

func TestLargeValues(t *testing.T) {
	ms := startLargeItems(t, 1)
	c, _ := newTestClient(t, addrsOf(ms), largeTimeout)
	keys := []string{"large-0", "large-1"}
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: largeValue(k, largeSize)}))
	}
	require.NoError(t, c.Set(&memcache.Item{Key: "small", Value: []byte("s")}))
	tests := []struct {
		name string
		read func(t *testing.T) map[string]*memcache.Item
	}{
		{"Get", func(t *testing.T) map[string]*memcache.Item {
			got := map[string]*memcache.Item{}
			for _, k := range append(keys, "small") {
				it, err := c.Get(k)
				require.NoError(t, err, k)
				got[k] = it
			}
			return got
		}},
		{"GetMulti", func(t *testing.T) map[string]*memcache.Item {
			got, err := c.GetMulti(append(keys, "small", "missing"))
			require.NoError(t, err)
			return got
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.read(t)
			require.Len(t, got, 3)
			for _, k := range keys {
				requireLarge(t, k, got[k])
			}
			require.Equal(t, "s", string(got["small"].Value))
		})
	}
}

// movingKeys returns keys whose owner is ms[2] once it joins ms[0] and
// ms[1], and keys that stay where they are: n of each.
func movingKeys(t *testing.T, ms []*memcached, n int) (moving, staying []string) {
	t.Helper()
	all := new(ServerList)
	require.NoError(t, all.SetServers(addrsOf(ms)...))
	for i := 0; len(moving) < n || len(staying) < n; i++ {
		k := fmt.Sprint("large-", i)
		a, err := all.PickServer(k)
		require.NoError(t, err)
		if a.String() == ms[2].addr {
			if len(moving) < n {
				moving = append(moving, k)
			}
		} else if len(staying) < n {
			staying = append(staying, k)
		}
	}
	return moving, staying
}

// TestLargeValueHandoff adds a server: a large value whose key moved to it
// is read where it was and copied there, through Get and GetMulti.
func TestLargeValueHandoff(t *testing.T) {
	ms := startLargeItems(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]), largeTimeout, WithMoves(Moves{Rate: -1})) // reads alone move keys
	moving, staying := movingKeys(t, ms, 4)
	for _, k := range append(moving, staying...) {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: largeValue(k, largeSize)}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })

	for _, k := range moving[:2] {
		it, err := c.Get(k)
		require.NoError(t, err, "%s not handed off", k)
		requireLarge(t, k, it)
	}
	got, err := c.GetMulti(append(moving[2:], staying...))
	require.NoError(t, err)
	for _, k := range append(moving[2:], staying...) {
		requireLarge(t, k, got[k])
	}
	for _, k := range moving {
		it, err := direct(ms[2].addr).Get(k)
		require.NoError(t, err, "%s not copied to its new server", k)
		requireLarge(t, k, it)
	}
}

// TestLargeValueMove adds a server: the mover moves the large values whose
// keys it owns, unread.
func TestLargeValueMove(t *testing.T) {
	ms := startLargeItems(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]), largeTimeout)
	moving, staying := movingKeys(t, ms, 3)
	for _, k := range append(moving, staying...) {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: largeValue(k, largeSize)}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	st := movesDone(t, c, 1)
	require.Equal(t, len(moving), st.Moved, "moved: %+v", st)
	for _, k := range moving {
		it, err := direct(ms[2].addr).Get(k)
		require.NoError(t, err, "%s not moved to its new server", k)
		requireLarge(t, k, it)
		for _, m := range ms[:2] {
			_, err := direct(m.addr).Get(k)
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s left at %s", k, m)
		}
	}
	for _, k := range staying {
		it, err := c.Get(k)
		require.NoError(t, err)
		requireLarge(t, k, it)
	}
}

// TestLargeValueErrorsStayTheirs: a value the Client will not read (over
// WithMaxItemSize) or the server will not store (over its -I) fails its
// own request; the requests beside it on the same connection succeed, and
// the connection is neither closed nor dialed again.
func TestLargeValueErrorsStayTheirs(t *testing.T) {
	ms := startLargeItems(t, 1)
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	c, _ := newTestClient(t, addrsOf(ms), largeTimeout, WithMaxItemSize(2<<20), WithMaxIdleConns(1), WithDialContext(dial))
	require.NoError(t, c.Set(&memcache.Item{Key: "large", Value: largeValue("large", largeSize)}), "writes are not bounded")
	require.NoError(t, c.Set(&memcache.Item{Key: "small", Value: []byte("s")}))

	tests := []struct {
		name string
		op   func() error // fails
		is   error        // what its error wraps
	}{
		{"Get over the bound", func() error { _, err := c.Get("large"); return err }, meta.ErrTooLarge},
		{"GetMulti over the bound", func() error {
			got, err := c.GetMulti([]string{"large", "small"})
			if got["small"] == nil {
				return fmt.Errorf("the other key of the batch was lost (%w)", err)
			}
			return err
		}, meta.ErrTooLarge},
		{"Set over the server's limit", func() error {
			return c.Set(&memcache.Item{Key: "huge", Value: make([]byte, 5<<20)})
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := dials.Load()
			var wg sync.WaitGroup
			var failed atomic.Int32
			for range 4 { // small requests beside it, on the one connection
				wg.Go(func() {
					for range 50 {
						if it, err := c.Get("small"); err != nil || string(it.Value) != "s" {
							failed.Add(1)
						}
					}
				})
			}
			for range 3 { // more than the Client's retries
				err := tt.op()
				require.Error(t, err)
				if tt.is != nil {
					require.ErrorIs(t, err, tt.is)
				}
			}
			wg.Wait()
			require.Zero(t, failed.Load(), "requests beside it failed")
			require.Equal(t, before, dials.Load(), "the connection was dialed again")
			require.Equal(t, ServerUp, stateOf(c, ms[0].addr).State)
		})
	}
	require.EqualValues(t, 1, dials.Load())
}

func TestWithMaxItemSize(t *testing.T) {
	ss := new(ServerList)
	require.NoError(t, ss.SetServers("127.0.0.1:1"))
	tests := []struct {
		name string
		n    int
		ok   bool
	}{
		{"each server's own", 0, true},
		{"4 MiB", 4 << 20, true},
		{"memcached's largest", 1 << 30, true},
		{"negative", -1, false},
		{"past memcached's largest", 1<<30 + 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClientFromList(ss, WithMaxItemSize(tt.n))
			if !tt.ok {
				require.ErrorContains(t, err, "WithMaxItemSize: want at most 1 GiB")
				return
			}
			require.NoError(t, err)
			c.Close()
		})
	}
}
