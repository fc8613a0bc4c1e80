package selector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
)

// flights runs one load per key at a time within a Client (see
// GetOrLoad), as golang.org/x/sync/singleflight does: the first caller of
// a key runs it, and the callers that come while it runs wait for its
// result, each bounded by its own context. Its zero value is ready.
type flights struct {
	n  atomic.Int32 // loads running: written's fast path, on every write
	mu sync.Mutex
	m  map[string]*flight
}

// flight is one run of a key's load, and its result once done is closed.
type flight struct {
	done    chan struct{}
	waiters int // callers waiting for it (for tests)
	it      *memcache.Item
	err     error
}

// errLoadPanicked is the error of the callers that waited for a load that
// panicked: the panic is the caller's whose load it was.
var (
	errLoadPanicked = errors.New("load panicked")
	errLoadExited   = errors.New("load called runtime.Goexit")
)

// do returns fn's result for key: fn's own, run now, or that of the run of
// another caller in flight, with a copy of its value (the caller may change
// it). A caller that waits returns ctx's error if ctx ends first. One whose
// leader gave up (its context ended, which its result wraps) while ctx has
// not runs again. If fn panics, the panic goes on in the caller that ran
// it, after its flight ended: those waiting get an error.
func (fs *flights) do(ctx context.Context, key string, fn func() (*memcache.Item, error)) (*memcache.Item, error) {
	for {
		fs.mu.Lock()
		if fl := fs.m[key]; fl != nil {
			fl.waiters++
			fs.mu.Unlock()
			select {
			case <-fl.done:
			case <-ctx.Done():
				fs.leave(fl)
				return nil, ctx.Err()
			}
			fs.leave(fl)
			if isCtxErr(fl.err) && ctx.Err() == nil {
				continue // the leader gave up, not this caller
			}
			return cloneItem(fl.it), fl.err
		}
		if fs.m == nil {
			fs.m = map[string]*flight{}
		}
		fl := &flight{done: make(chan struct{})}
		fs.m[key] = fl
		fs.n.Add(1)
		fs.mu.Unlock()
		return fs.run(key, fl, fn)
	}
}

// run runs fn as key's flight fl, and ends fl however fn returns.
func (fs *flights) run(key string, fl *flight, fn func() (*memcache.Item, error)) (it *memcache.Item, err error) {
	finished := false
	defer func() {
		if !finished {
			p := recover()
			if p == nil { // runtime.Goexit: the caller's goroutine ends
				fl.err = fmt.Errorf("selector: the load of %q that this call waited for: %w", key, errLoadExited)
				fs.end(key, fl)
				return
			}
			fl.err = fmt.Errorf("selector: the load of %q that this call waited for: %w: %v", key, errLoadPanicked, p)
			fs.end(key, fl)
			panic(p)
		}
		fs.end(key, fl)
	}()
	fl.it, fl.err = fn()
	finished = true
	return fl.it, fl.err
}

func (fs *flights) end(key string, fl *flight) {
	fs.mu.Lock()
	if fs.m[key] == fl {
		delete(fs.m, key)
	}
	fs.n.Add(-1)
	fs.mu.Unlock()
	close(fl.done)
}

// written notes that a write or delete of key by this Client begins: the
// load in flight may return a value older than it, so callers that come
// from now on do not join that load, but start one of their own. Those
// waiting already began before the write, and may return the older value.
func (fs *flights) written(key string) {
	if fs.n.Load() == 0 {
		return
	}
	fs.mu.Lock()
	if fs.m != nil {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
}

func (fs *flights) leave(fl *flight) {
	fs.mu.Lock()
	fl.waiters--
	fs.mu.Unlock()
}

// waiting returns how many callers wait for key's flight in progress.
func (fs *flights) waiting(key string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fl := fs.m[key]; fl != nil {
		return fl.waiters
	}
	return 0
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func cloneItem(it *memcache.Item) *memcache.Item {
	if it == nil {
		return nil
	}
	cp := *it
	cp.Value = bytes.Clone(it.Value)
	return &cp
}
