package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Steady traffic: loadWorkers goroutines, each sending a request every
// loadInterval.
const (
	loadWorkers  = 4
	loadInterval = 2 * time.Millisecond
)

// cache is what the demo asks of a memcached client: *memcache.Client and
// *selector.Client both have it, as they have the rest of gomemcache's
// method set.
type cache interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Set(item *memcache.Item) error
}

// load is steady cache-aside traffic through one path (a client) over the
// keys 0 ... n-1 of prefix: a Get of a random key, and a Set of it
// after a miss. It counts requests, hits and errors in windows: each
// request counts, once done, in the window current when it started (so
// that one still running when its window ends does not count as a miss),
// and a window that ended is read once those are done (settle), so that
// what a table prints is what the summary adds up.
type load struct {
	name   string // the path, as the tables show it
	cache  cache
	prefix string
	keys   int
	log    *slog.Logger

	cur    atomic.Pointer[window]
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// window counts the requests of one stretch of time.
type window struct {
	start                         time.Time
	took                          time.Duration // set when it ends
	reqs, hits, errs, routingErrs atomic.Int64
	logged                        atomic.Int32
	running                       atomic.Int64 // requests started in it and not done
}

// settle waits until the requests of a window that ended are done, for at
// most a Get and a Set that time out (then it counts what it has).
func (w *window) settle() {
	for deadline := time.Now().Add(5 * time.Second); w.running.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

func (w *window) requests() int64 { return w.reqs.Load() }
func (w *window) errors() int64   { return w.errs.Load() }

func (w *window) hitRate() float64 {
	if n := w.reqs.Load(); n > 0 {
		return float64(w.hits.Load()) / float64(n)
	}
	return 0
}

func startLoad(name string, mc cache, prefix string, keys int, log *slog.Logger) *load {
	l := &load{name: name, cache: mc, prefix: prefix, keys: keys, log: log}
	l.cur.Store(&window{start: time.Now()})
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for range loadWorkers {
		l.wg.Go(func() {
			tick := time.NewTicker(loadInterval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					l.once(key(l.prefix, rand.IntN(l.keys)))
				}
			}
		})
	}
	return l
}

// rate is the requests per second the load sends.
func (l *load) rate() int { return loadWorkers * int(time.Second/loadInterval) }

// current returns the window being counted.
func (l *load) current() *window { return l.cur.Load() }

// next starts a new window and returns the one that ended.
func (l *load) next() *window {
	now := time.Now()
	w := l.cur.Swap(&window{start: now})
	w.took = now.Sub(w.start)
	return w
}

func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *load) once(key string) {
	// Counted as running in the current window, checked to be current
	// still: a window that ended before this request started counts none
	// of it, and settle waits for all that it counts.
	var w *window
	for {
		w = l.cur.Load()
		w.running.Add(1)
		if l.cur.Load() == w {
			break
		}
		w.running.Add(-1)
	}
	defer w.running.Add(-1)
	_, err := l.cache.Get(key)
	if err == nil {
		w.hits.Add(1)
		w.reqs.Add(1)
		return
	}
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = l.cache.Set(&memcache.Item{Key: key, Value: []byte("value")})
	}
	w.reqs.Add(1)
	if err == nil {
		return
	}
	w.errs.Add(1)
	if isRoutingError(err) {
		w.routingErrs.Add(1)
	}
	if w.logged.Add(1) <= 3 { // a few samples per window, in the log file
		l.log.Warn("demo: request failed", "path", l.name, "key", key, "err", err)
	}
}

// isRoutingError reports whether err is what a client gets from a server
// that has stopped: a refused, reset or closed connection.
func isRoutingError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}
