package selector

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/bradfitz/gomemcache/memcache"
)

// ErrClosed is returned by the Client's methods called after Close began:
// they send nothing (a request after Close would dial the servers again).
var ErrClosed = errors.New("selector: the Client is closed")

// The errors of a nil argument, which gomemcache's methods panic on (a nil
// *memcache.Item; gomemcache takes no context). The Client returns them
// instead: the caller's bug is then an error of the call, not a crash.
var (
	errNilItem    = errors.New("selector: item is nil")
	errNilContext = errors.New("selector: ctx is nil")
	errNilLoad    = errors.New("selector: load is nil")
)

// calls counts a Client's calls in flight, so that Close waits for them,
// and refuses new ones once Close began. A call's cleanup (see afterWrite)
// needs the Client's goroutines and context: a call cut off by Close would
// leave a key undeleted that the next Client then serves.
type calls struct {
	n    atomic.Int64  // calls in flight, plus closing once Close began
	idle chan struct{} // closed once no call is in flight after Close
	once sync.Once
}

const closing = 1 << 62

func newCalls() *calls { return &calls{idle: make(chan struct{})} }

// enter admits a call, unless Close began.
func (cs *calls) enter() bool {
	if cs.n.Add(1)&closing != 0 {
		cs.leave()
		return false
	}
	return true
}

// leave ends a call that enter admitted.
func (cs *calls) leave() {
	if cs.n.Add(-1) == closing {
		cs.once.Do(func() { close(cs.idle) })
	}
}

// close refuses the calls from now on, and waits for those in flight. It
// reports whether it was the first close.
func (cs *calls) close() bool {
	n := cs.n.Load()
	for ; n&closing == 0; n = cs.n.Load() {
		if cs.n.CompareAndSwap(n, n|closing) {
			if n != 0 {
				<-cs.idle
			}
			return true
		}
	}
	return false
}

// admit admits a call of the Client with context ctx (see calls), which
// then calls c.calls.leave when it returns.
func (c *Client) admit(ctx context.Context) error {
	switch {
	case ctx == nil:
		return errNilContext
	case !c.calls.enter():
		return ErrClosed
	}
	return nil
}

// admitItem is admit for a call that writes item.
func (c *Client) admitItem(ctx context.Context, item *memcache.Item) error {
	if item == nil {
		return errNilItem
	}
	return c.admit(ctx)
}
