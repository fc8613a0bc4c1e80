package selector

import (
	"sync"
	"sync/atomic"
)

// copies tracks the handoff copies and pool repairs in flight, by key, so
// that a delete of a key while it is being copied (a Delete, a FlushAll)
// marks the copy overtaken: the copy is undone, and until it is, the read
// gate serves no value of the key (another client may, for the time of the
// copy's check and undo: two round trips at most; see the README's
// "Consistency"). A write needs no mark: a copy is added with add, so it
// cannot land over a write, and one that landed first is overwritten.
type copies struct {
	n        atomic.Int32 // copies in flight: the gate's fast path
	flushing atomic.Int32 // FlushAlls under way: every copy is overtaken
	mu       sync.Mutex
	m        map[string]*copyState
}

type copyState struct {
	refs      int
	overtaken bool
}

// begin registers a copy of key; end with done.
func (cs *copies) begin(key string) *copyState {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[string]*copyState{}
	}
	st := cs.m[key]
	if st == nil {
		st = &copyState{}
		cs.m[key] = st
	}
	st.refs++
	if cs.flushing.Load() > 0 {
		st.overtaken = true
	}
	cs.n.Add(1)
	return st
}

// flush marks every copy overtaken until end is called: a FlushAll is under
// way, and a copy from a server not flushed yet to one flushed already
// would bring a flushed value back.
func (cs *copies) flush() (end func()) {
	cs.flushing.Add(1)
	cs.mu.Lock()
	for _, st := range cs.m {
		st.overtaken = true
	}
	cs.mu.Unlock()
	return func() { cs.flushing.Add(-1) }
}

// done ends a copy that begin registered, and reports whether a write or
// delete overtook it.
func (cs *copies) done(key string, st *copyState) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st.refs--
	if st.refs == 0 {
		delete(cs.m, key)
	}
	cs.n.Add(-1)
	return st.overtaken
}

// written marks the copies of key in flight overtaken: a delete of key is
// under way.
func (cs *copies) written(key string) {
	if cs.n.Load() == 0 {
		return
	}
	cs.mu.Lock()
	if st := cs.m[key]; st != nil {
		st.overtaken = true
	}
	cs.mu.Unlock()
}

// check reports whether the copy st (nil for none) was overtaken so far.
func (cs *copies) check(st *copyState) bool {
	if st == nil {
		return false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return st.overtaken
}

// overtaken reports whether a copy of key in flight was overtaken.
func (cs *copies) overtaken(key string) bool {
	if cs.n.Load() == 0 {
		return false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	st := cs.m[key]
	return st != nil && st.overtaken
}
