package selector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// testDB is the database behind the cache in the lease tests: a value per
// key, a version that writers bump, and a count of its queries. A load
// may be held (hold) until the test lets it go.
type testDB struct {
	mu      sync.Mutex
	version map[string]int
	loads   atomic.Int64
	hold    chan struct{} // if not nil, a load waits for it after reading
	started chan struct{} // if not nil, a held load says it has read
}

func newTestDB() *testDB { return &testDB{version: map[string]int{}} }

func (db *testDB) value(key string) string {
	db.mu.Lock()
	defer db.mu.Unlock()
	return fmt.Sprintf("%s-v%d", key, db.version[key])
}

func (db *testDB) update(key string) {
	db.mu.Lock()
	db.version[key]++
	db.mu.Unlock()
}

// load is a loadFunc: it reads the value, then waits for hold if set.
func (db *testDB) load(ctx context.Context, key string) (*memcache.Item, error) {
	db.loads.Add(1)
	v := db.value(key)
	db.mu.Lock()
	hold, started := db.hold, db.started
	db.mu.Unlock()
	if hold != nil {
		if started != nil {
			started <- struct{}{}
		}
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &memcache.Item{Value: []byte(v), Flags: 7, Expiration: 300}, nil
}

// holdLoads makes the loads wait until the returned function is called;
// started gets one send per load that has read.
func (db *testDB) holdLoads() (started chan struct{}, release func()) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.hold, db.started = make(chan struct{}), make(chan struct{}, 64)
	hold := db.hold
	var once sync.Once
	return db.started, func() {
		once.Do(func() {
			db.mu.Lock()
			db.hold, db.started = nil, nil
			db.mu.Unlock()
			close(hold)
		})
	}
}

func getOrLoad(t *testing.T, c *Client, key string, opt LoadOptions, load loadFunc) string {
	t.Helper()
	it, err := c.GetOrLoad(context.Background(), key, opt, load)
	require.NoError(t, err)
	return string(it.Value)
}

// TestGetOrLoad: a miss loads once and caches with the load's flags and
// expiration; a hit loads nothing; a load that fails, hangs past its
// context or panics returns so and releases the lease, so that the next
// caller loads at once (nothing is left at the server).
func TestGetOrLoad(t *testing.T) {
	ms := startMemcached(t, 1)
	errDB := errors.New("database down")
	cases := []struct {
		name      string
		load      func(db *testDB) loadFunc
		wantErr   error
		wantPanic bool
		ctx       func() (context.Context, context.CancelFunc)
	}{
		{name: "ok"},
		{name: "load fails", wantErr: errDB, load: func(db *testDB) loadFunc {
			return func(context.Context, string) (*memcache.Item, error) { db.loads.Add(1); return nil, errDB }
		}},
		{name: "load panics", wantPanic: true, load: func(db *testDB) loadFunc {
			return func(context.Context, string) (*memcache.Item, error) { db.loads.Add(1); panic("boom") }
		}},
		{name: "load hangs past ctx", wantErr: context.Canceled, load: func(db *testDB) loadFunc {
			return func(ctx context.Context, key string) (*memcache.Item, error) {
				db.loads.Add(1)
				<-ctx.Done() // the test cancels it once the load runs
				return nil, ctx.Err()
			}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newTestClient(t, addrsOf(ms))
			db := newTestDB()
			key := fmt.Sprint("gol-", i)
			load := db.load
			if tc.load != nil {
				load = tc.load(db)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.wantErr == context.Canceled {
				go func() {
					for db.loads.Load() == 0 {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
			}
			call := func() (*memcache.Item, error) { return c.GetOrLoad(ctx, key, LoadOptions{}, load) }
			switch {
			case tc.wantPanic:
				require.PanicsWithValue(t, "boom", func() { call() })
			case tc.wantErr != nil:
				_, err := call()
				require.ErrorIs(t, err, tc.wantErr)
			default:
				it, err := call()
				require.NoError(t, err)
				require.Equal(t, key+"-v0", string(it.Value))
				require.Equal(t, uint32(7), it.Flags)
				got, err := c.Get(key)
				require.NoError(t, err)
				require.Equal(t, key+"-v0", string(got.Value))
				require.InDelta(t, 300, metaTTL(t, ms[0].addr, key), 2)
				require.Equal(t, key+"-v0", getOrLoad(t, c, key, LoadOptions{}, db.load))
				require.Equal(t, int64(1), db.loads.Load(), "a hit loads nothing")
				return
			}
			require.Equal(t, int64(1), db.loads.Load())
			require.Equal(t, "EN", rawCommand(t, ms[0].addr, "mg "+key+" v\r\n"), "the lease is released")
			require.Zero(t, c.loads.waiting(key))
			db2 := newTestDB()
			require.Equal(t, key+"-v0", getOrLoad(t, c, key, LoadOptions{Wait: time.Minute, NoLoadAfterWait: true}, db2.load))
			require.Equal(t, int64(1), db2.loads.Load(), "the next caller loads at once")
		})
	}
}

// TestGetOrLoadOneLoadPerClient: 50 callers of one key in one Client
// cost one load, and each gets its value.
func TestGetOrLoadOneLoadPerClient(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	started, release := db.holdLoads()
	const n = 50
	var wg sync.WaitGroup
	vals := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			it, err := c.GetOrLoad(context.Background(), "hot", LoadOptions{}, db.load)
			errs[i] = err
			if err == nil {
				vals[i] = string(it.Value)
			}
		})
	}
	<-started
	eventually(t, "the other callers to wait", func() bool { return c.loads.waiting("hot") == n-1 })
	release()
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, "hot-v0", vals[i])
	}
	require.Equal(t, int64(1), db.loads.Load())
}

// TestGetOrLoadAcrossClients: while one client holds a key's lease, another
// waits for it (and with NoLoadAfterWait, gives up with ErrLoadWait), then
// gets the first client's value: one load.
func TestGetOrLoadAcrossClients(t *testing.T) {
	ms := startMemcached(t, 1)
	a, _ := newTestClient(t, addrsOf(ms))
	b, _ := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	started, release := db.holdLoads()
	defer release()
	done := make(chan string)
	go func() {
		it, err := a.GetOrLoad(context.Background(), "k", LoadOptions{}, db.load)
		if err != nil {
			done <- err.Error()
			return
		}
		done <- string(it.Value)
	}()
	<-started
	_, err := b.GetOrLoad(context.Background(), "k", LoadOptions{Wait: 20 * time.Millisecond, NoLoadAfterWait: true}, db.load)
	require.ErrorIs(t, err, ErrLoadWait)
	waited := make(chan string)
	go func() {
		it, err := b.GetOrLoad(context.Background(), "k", LoadOptions{Wait: time.Minute}, db.load)
		if err != nil {
			waited <- err.Error()
			return
		}
		waited <- string(it.Value)
	}()
	release()
	require.Equal(t, "k-v0", <-done)
	require.Equal(t, "k-v0", <-waited)
	require.Equal(t, int64(1), db.loads.Load())
}

// TestGetOrLoadStaleSet: a caller loads the old value; a writer updates the
// database and then invalidates, deletes or sets the key; the caller's set
// fails, so the cache never holds the old value after the write: the
// caller still gets what it loaded.
func TestGetOrLoadStaleSet(t *testing.T) {
	ms := startMemcached(t, 1)
	cases := []struct {
		name  string
		write func(c *Client, key, v string) error
		want  string // what the cache holds for Get after the race: "" a miss
	}{
		{"invalidate", func(c *Client, key, _ string) error { return c.Invalidate(context.Background(), key) }, ""},
		{"delete", func(c *Client, key, _ string) error { return c.Delete(key) }, ""},
		{"set", func(c *Client, key, v string) error { return c.Set(&memcache.Item{Key: key, Value: []byte(v)}) }, "new"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reader, _ := newTestClient(t, addrsOf(ms))
			writer, _ := newTestClient(t, addrsOf(ms))
			db := newTestDB()
			key := fmt.Sprint("stale-", i)
			started, release := db.holdLoads()
			done := make(chan string)
			go func() {
				it, err := reader.GetOrLoad(context.Background(), key, LoadOptions{}, db.load)
				if err != nil {
					done <- err.Error()
					return
				}
				done <- string(it.Value)
			}()
			<-started // the reader has read version 0
			db.update(key)
			err := tc.write(writer, key, db.value(key))
			if tc.name == "set" {
				require.NoError(t, err)
			}
			release()
			require.Equal(t, key+"-v0", <-done, "the caller gets what it loaded")
			it, err := reader.Get(key)
			if tc.want == "" {
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "the old value was set")
			} else {
				require.NoError(t, err)
				require.Equal(t, key+"-v1", string(it.Value))
			}
			// The next GetOrLoad has the new value (waiting briefly: the Get
			// above took the lease of the invalidated placeholder, as any read
			// of a stale item does).
			require.Equal(t, key+"-v1", getOrLoad(t, reader, key, LoadOptions{Wait: 50 * time.Millisecond}, db.load)) // Get took a stale placeholder's lease
		})
	}
}

// TestInvalidate: after Invalidate, one caller reloads (the lease
// of the stale value) while the others serve the stale value (Stale) or
// wait (and give up with NoLoadAfterWait); one load per invalidation. A
// Get misses it; a plain Delete removes it; a missing key is ErrCacheMiss.
func TestInvalidate(t *testing.T) {
	ms := startMemcached(t, 1)
	a, _ := newTestClient(t, addrsOf(ms))
	b, _ := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	require.Equal(t, "k-v0", getOrLoad(t, a, "k", LoadOptions{}, db.load))

	db.update("k")
	require.NoError(t, b.Invalidate(context.Background(), "k"))
	started, release := db.holdLoads()
	defer release()
	done := make(chan string)
	go func() {
		it, _ := a.GetOrLoad(context.Background(), "k", LoadOptions{}, db.load)
		done <- string(it.Value)
	}()
	<-started // a reloads
	require.Equal(t, "k-v0", getOrLoad(t, b, "k", LoadOptions{Stale: true}, db.load), "stale, served while a reloads")
	_, err := b.GetOrLoad(context.Background(), "k", LoadOptions{Wait: 20 * time.Millisecond, NoLoadAfterWait: true}, db.load)
	require.ErrorIs(t, err, ErrLoadWait)
	release()
	require.Equal(t, "k-v1", <-done)
	require.Equal(t, "k-v1", getOrLoad(t, b, "k", LoadOptions{}, db.load))
	require.Equal(t, int64(2), db.loads.Load(), "one load per invalidation")

	require.NoError(t, a.Invalidate(context.Background(), "k"))
	_, err = b.Get("k")
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
	require.NoError(t, a.Delete("k"))
	require.Equal(t, "EN", rawCommand(t, ms[0].addr, "mg k v\r\n"))
	require.ErrorIs(t, a.Invalidate(context.Background(), "k"), memcache.ErrCacheMiss)
}

// TestInvalidateThenGet: a plain Get of an invalidated key is a miss, and
// does not keep the right to reload it that memcached gives the first
// read: a GetOrLoad after it loads at once, instead of waiting for a load
// that never comes.
func TestInvalidateThenGet(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	require.Equal(t, "k-v0", getOrLoad(t, c, "k", LoadOptions{}, db.load))
	db.update("k")
	require.NoError(t, c.Invalidate(context.Background(), "k"))
	for _, read := range []func() error{
		func() error { _, err := c.Get("k"); return err },
		func() error { _, err := c.GetMulti([]string{"k"}); return err },
	} {
		err := read()
		if err != nil {
			require.ErrorIs(t, err, memcache.ErrCacheMiss)
		}
	}
	it, err := c.GetOrLoad(context.Background(), "k", LoadOptions{Wait: 3 * time.Second, NoLoadAfterWait: true}, db.load)
	require.NoError(t, err, "the Get kept the lease of the invalidated value")
	require.Equal(t, "k-v1", string(it.Value))
	require.Equal(t, int64(2), db.loads.Load())
}

// TestGetOrLoadWaitsForACopy: a handoff copy's placeholder (mg N, as
// wire.Reserve makes it) is another client's lease to GetOrLoad: it waits
// for the copy, and serves it, loading nothing.
func TestGetOrLoadWaitsForACopy(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	reply := rawCommand(t, ms[0].addr, "mg k N30 c\r\n")
	require.True(t, strings.HasSuffix(reply, " W"), reply)
	var cas uint64
	_, err := fmt.Sscanf(reply, "HD c%d W", &cas)
	require.NoError(t, err)
	_, err = c.GetOrLoad(context.Background(), "k", LoadOptions{Wait: 20 * time.Millisecond, NoLoadAfterWait: true}, db.load)
	require.ErrorIs(t, err, ErrLoadWait)
	require.Equal(t, "HD", rawCommand(t, ms[0].addr, fmt.Sprintf("ms k 6 C%d\r\ncopied\r\n", cas)))
	require.Equal(t, "copied", getOrLoad(t, c, "k", LoadOptions{}, db.load))
	require.Zero(t, db.loads.Load())
}

// TestGetOrLoadHandoff: after a scale-up, GetOrLoad of a key that moved
// finds it where it was (the handoff), loads nothing, and leaves it at its
// new server only.
func TestGetOrLoadHandoff(t *testing.T) {
	ms, c, ss, keys := scaledUp(t)
	db := newTestDB()
	moved := 0
	for _, k := range keys {
		if a, _ := ss.PickServer(k); a.String() != ms[2].addr {
			continue
		}
		moved++
		require.Equal(t, k, getOrLoad(t, c, k, LoadOptions{}, db.load))
		it, err := direct(ms[2].addr).Get(k)
		require.NoError(t, err, "%s not at its new server", k)
		require.Equal(t, k, string(it.Value))
		for _, m := range ms[:2] {
			_, err := direct(m.addr).Get(k)
			require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s still at %s", k, m)
		}
	}
	require.Greater(t, moved, 50)
	require.Zero(t, db.loads.Load())
}

// TestGetOrLoadFailover: with a key's server dead, the lease and the value
// live at its stand-in: one load, then hits; when the server returns, it
// serves the value set meanwhile, or a miss, never an older one.
func TestGetOrLoadFailover(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms))
	db := newTestDB()
	key := keysOf(t, ss, ms[0].addr, 1)[0]
	require.Equal(t, key+"-v0", getOrLoad(t, c, key, LoadOptions{}, db.load))
	hangUntilOut(t, c, ms[0], key)
	db.update(key)
	require.NoError(t, c.Invalidate(context.Background(), key)) // at the stand-in; logged for ms[0]
	require.Equal(t, key+"-v1", getOrLoad(t, c, key, LoadOptions{}, db.load))
	require.Equal(t, key+"-v1", getOrLoad(t, c, key, LoadOptions{}, db.load))
	require.Equal(t, int64(2), db.loads.Load())
	it, err := direct(ms[1].addr).Get(key)
	require.NoError(t, err, "the value is at the stand-in")
	require.Equal(t, key+"-v1", string(it.Value))
	ms[0].signal(syscall.SIGCONT)
	eventually(t, "the server to return", func() bool { return stateOf(c, ms[0].addr).State == "up" })
	got := getOrLoad(t, c, key, LoadOptions{}, db.load)
	require.Equal(t, key+"-v1", got, "never the value from before the outage")
}

// TestGetOrLoadClassic: a server without the meta protocol has no leases:
// GetOrLoad loads once per key within the Client, caches with add, and
// Invalidate deletes.
func TestGetOrLoadClassic(t *testing.T) {
	ms := startMemcached(t, 1)
	addr := classicOnly(t, ms[0].addr)
	c, _ := newTestClient(t, []string{addr})
	db := newTestDB()
	started, release := db.holdLoads()
	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			it, err := c.GetOrLoad(context.Background(), "k", LoadOptions{}, db.load)
			if err == nil && string(it.Value) != "k-v0" {
				err = fmt.Errorf("got %q", it.Value)
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	<-started
	eventually(t, "the other callers to wait", func() bool { return c.loads.waiting("k") == n-1 })
	release()
	wg.Wait()
	require.Equal(t, int64(1), db.loads.Load())
	it, err := c.Get("k")
	require.NoError(t, err)
	require.Equal(t, "k-v0", string(it.Value))
	require.NoError(t, c.Invalidate(context.Background(), "k"))
	_, err = c.Get("k")
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
}

// TestGetOrLoadPool: in a replicated pool, the lease lives in the key's
// primary group and the value reaches every group: one load; an
// invalidation marks every replica stale, and the set of a load that
// raced it reaches none of them.
func TestGetOrLoadPool(t *testing.T) {
	ms := startMemcached(t, 3)
	c, _ := newPoolClient(t, ms, []string{"", "", ""}, Replicated())
	other, _ := newPoolClient(t, ms, []string{"", "", ""}, Replicated())
	db := newTestDB()
	require.Equal(t, "k-v0", getOrLoad(t, c, "k", LoadOptions{}, db.load))
	require.Equal(t, "k-v0", getOrLoad(t, other, "k", LoadOptions{}, db.load))
	require.Equal(t, int64(1), db.loads.Load())
	require.Equal(t, 3, holders(ms, "k"), "the value is in every group")

	// A load racing an update and its invalidation writes nowhere.
	require.NoError(t, c.Invalidate(context.Background(), "k"))
	started, release := db.holdLoads()
	done := make(chan string)
	go func() {
		it, _ := c.GetOrLoad(context.Background(), "k", LoadOptions{}, db.load)
		done <- string(it.Value)
	}()
	<-started
	db.update("k")
	require.NoError(t, other.Invalidate(context.Background(), "k"))
	release()
	require.Equal(t, "k-v0", <-done)
	for _, m := range ms { // a raw read takes a stale value's lease: the next calls wait briefly
		reply := rawCommand(t, m.addr, "mg k c\r\n")
		require.True(t, reply == "EN" || strings.Contains(reply, " X"), "the old value was set at %s: %s", m, reply)
	}
	brief := LoadOptions{Wait: 50 * time.Millisecond}
	require.Equal(t, "k-v1", getOrLoad(t, other, "k", brief, db.load))
	require.Equal(t, "k-v1", getOrLoad(t, c, "k", brief, db.load))
	require.Equal(t, int64(3), db.loads.Load())
	require.Equal(t, 3, holders(ms, "k"))
}
