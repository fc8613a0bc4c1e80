package histcheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// The stale-set schedule (issue 21) checks cache-aside itself rather than
// a fault: readers read keys through the cache and load them from a
// database on a miss, while writers update the database and then
// invalidate the keys. A reader that loaded a key's old row before an
// update and sets it after the update's invalidation leaves the old value
// in the cache until it expires (here: never). After the run, every key
// the cache holds is compared with the database: a value older than the
// database's is stale. Plain cache-aside (Get, load, Set; Delete on an
// update) is the control; GetOrLoad with Invalidate must leave none.

// StaleSetMode is how the readers and writers of a stale-set run use the
// cache.
type StaleSetMode string

const (
	StaleSetLeases StaleSetMode = "getorload"   // Client.GetOrLoad; writers Invalidate
	StaleSetPlain  StaleSetMode = "cache-aside" // Client.Get, load on a miss, Client.Set; writers Delete
)

// StaleSetConfig is a stale-set run's size.
type StaleSetConfig struct {
	Duration time.Duration
	Servers  int           // memcached processes
	Clients  int           // Clients (application instances), readers and writers spread over them
	Keys     int           // hot keys
	Readers  int           // goroutines reading
	Writers  int           // goroutines updating and invalidating
	Query    time.Duration // how long a database read takes: the race's window
}

// DefaultStaleSet is the bounded run's size.
var DefaultStaleSet = StaleSetConfig{Duration: time.Second, Servers: 2, Clients: 2, Keys: 8, Readers: 16, Writers: 2, Query: time.Millisecond}

// StaleSetReport is a stale-set run's result.
type StaleSetReport struct {
	Mode                  StaleSetMode
	Keys                  int
	Stale                 int // keys whose cached value is older than the database's after the run
	Reads, Loads, Updates int
	ReadErrors            int // reads, and the writers' invalidations, that failed
}

func (r *StaleSetReport) String() string {
	return fmt.Sprintf("%s: %d of %d keys left stale in the cache; %d reads (%d errors), %d loads, %d updates",
		r.Mode, r.Stale, r.Keys, r.Reads, r.ReadErrors, r.Loads, r.Updates)
}

// staleDB is the database: a version per key.
type staleDB struct {
	mu      sync.Mutex
	version []int
	loads   atomic.Int64
	query   time.Duration
}

func (db *staleDB) load(_ context.Context, key string) (*memcache.Item, error) {
	i, _ := strconv.Atoi(key[1:])
	db.mu.Lock()
	v := db.version[i]
	db.mu.Unlock()
	db.loads.Add(1)
	time.Sleep(db.query) // the row is read; the query returns a while later
	return &memcache.Item{Value: []byte(strconv.Itoa(v))}, nil
}

// RunStaleSet runs the stale-set schedule in mode over fresh memcached
// processes.
func RunStaleSet(mode StaleSetMode, cfg StaleSetConfig) (*StaleSetReport, error) {
	bin, err := MemcachedPath()
	if err != nil {
		return nil, err
	}
	addrs := make([]string, cfg.Servers)
	for i := range addrs {
		m, err := StartMemcached(bin)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		addrs[i] = m.Addr
	}
	var list selector.ServerList
	if err := list.SetServers(addrs...); err != nil {
		return nil, err
	}
	clients := make([]*selector.Client, cfg.Clients)
	for i := range clients {
		c, err := selector.NewClientFromList(&list, selector.WithSlog(slog.New(slog.DiscardHandler)), selector.WithTimeout(2*time.Second))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
	}
	db := &staleDB{version: make([]int, cfg.Keys), query: cfg.Query}
	key := func(i int) string { return "s" + strconv.Itoa(i) }
	rep := &StaleSetReport{Mode: mode, Keys: cfg.Keys}
	var reads, readErrs, updates atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range cfg.Readers {
		c := clients[r%len(clients)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for !stopped(stop) {
				k := key(rng.IntN(cfg.Keys))
				reads.Add(1)
				if err := readThrough(mode, c, db, k); err != nil {
					readErrs.Add(1)
				}
			}
		})
	}
	for w := range cfg.Writers {
		c := clients[w%len(clients)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for !stopped(stop) {
				i := rng.IntN(cfg.Keys)
				db.mu.Lock()
				db.version[i]++
				db.mu.Unlock()
				updates.Add(1)
				var err error
				if mode == StaleSetLeases {
					err = c.Invalidate(context.Background(), key(i))
				} else {
					err = c.Delete(key(i))
				}
				if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
					readErrs.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			}
		})
	}
	time.Sleep(cfg.Duration)
	close(stop)
	wg.Wait()
	for i := range cfg.Keys {
		it, err := clients[0].Get(key(i))
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
		case err != nil:
			return nil, fmt.Errorf("the final read of %s: %w", key(i), err)
		case string(it.Value) != strconv.Itoa(db.version[i]):
			rep.Stale++
		}
	}
	rep.Reads, rep.ReadErrors, rep.Loads, rep.Updates = int(reads.Load()), int(readErrs.Load()), int(db.loads.Load()), int(updates.Load())
	return rep, nil
}

func stopped(stop chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// readThrough reads k through the cache in mode, loading it from db on a
// miss.
func readThrough(mode StaleSetMode, c *selector.Client, db *staleDB, k string) error {
	if mode == StaleSetLeases {
		_, err := c.GetOrLoad(context.Background(), k, selector.LoadOptions{}, db.load)
		return err
	}
	_, err := c.Get(k)
	if !errors.Is(err, memcache.ErrCacheMiss) {
		return err
	}
	it, err := db.load(context.Background(), k)
	if err != nil {
		return err
	}
	it.Key = k
	return c.Set(it)
}
