package selector

import (
	"slices"
	"sync"
)

// invalLog is a Client's invalidation log: for each server, the keys it
// must not serve until they are deleted there. A key is logged when a write
// or delete of it went elsewhere while the server was out (with the
// stand-in that took it, which is cleaned too), or when a delete there
// failed. The Client's read gate checks the log before it trusts a value
// (see Client.clean); a returning server's log is drained in the background
// while the gate keeps its logged keys from being served.
//
// The log is bounded: past maxKeys keys for one server, or maxTotal for all,
// the server's log overflows. An overflowed log forgets its keys and, when
// the server is next used, becomes a CAS floor (see server.floor): none of
// the server's values older than that moment is served. So no server is
// ever flushed because of this client's log: other clients' values stay.
//
// A logged key is cleaned once (see claim): the first request that uses it
// deletes it, and the others wait for that. Each deleting on its own, a
// delete held up somewhere landed after another request's delete and
// write, and deleted an acknowledged value.
//
// invalLog has its own lock, taken for no longer than a map operation, and
// never calls out while holding it.
type invalLog struct {
	maxKeys, maxTotal int

	mu    sync.Mutex
	logs  map[*server]*serverLog
	total int // keys in all the logs
}

// serverLog is one server's part of the log.
type serverLog struct {
	keys       map[string]*loggedKey
	overflowed bool // keys were lost: a CAS floor replaces them
}

// loggedKey is a key of a server's log.
type loggedKey struct {
	standIns []*server     // the stand-ins that took its writes: each one's, not only the last
	cleaning chan struct{} // closed when the clean under way ends; nil if none
	again    bool          // logged again while being cleaned: it stays
}

// end ends e's clean, if one is under way, and wakes its waiters.
func (e *loggedKey) end() {
	if e.cleaning != nil {
		close(e.cleaning)
		e.cleaning = nil
	}
}

func newInvalLog(maxKeys, maxTotal int) *invalLog {
	return &invalLog{maxKeys: maxKeys, maxTotal: maxTotal, logs: map[*server]*serverLog{}}
}

// add logs key at s; standIn is where its write went instead, or nil.
func (l *invalLog) add(s *server, key string, standIn *server) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		sl = &serverLog{}
		l.logs[s] = sl
	}
	switch {
	case sl.overflowed:
	case len(sl.keys) >= l.maxKeys || l.total >= l.maxTotal:
		l.dropKeys(sl)
		sl.overflowed = true
	default:
		if sl.keys == nil {
			sl.keys = map[string]*loggedKey{}
		}
		e := sl.keys[key]
		if e == nil {
			e = &loggedKey{}
			sl.keys[key] = e
			l.total++
		}
		if standIn != nil && !slices.Contains(e.standIns, standIn) {
			// Each stand-in that took a write of key while s was out holds
			// a copy, the older ones too: forgetting one when the next
			// took a write left its copy to be read when it stood in again
			// (histcheck two-out on 1.6.45 under load: a value deleted 3 s
			// before, served).
			e.standIns = append(e.standIns, standIn)
		}
		e.again = e.cleaning != nil
	}
	s.pending.Store(true)
}

// overflow marks s's log overflowed, as add does past its bound: for a
// FlushAll that s missed, or a server whose history is lost.
func (l *invalLog) overflow(s *server) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		sl = &serverLog{}
		l.logs[s] = sl
	}
	l.dropKeys(sl)
	sl.overflowed = true
	s.pending.Store(true)
}

// lookup reports whether key is logged at s. An overflowed log holds
// every key.
func (l *invalLog) lookup(s *server, key string) (logged bool) {
	if !s.pending.Load() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		return false
	}
	return sl.keys[key] != nil || sl.overflowed
}

// claim claims the clean of key at s, if it is logged there: it reports
// whether it is, with the stand-ins that took its writes, and wait, nil if
// the caller is to clean it and then call done (or release, if it could
// not), or else the channel closed when the clean under way ends. An
// overflowed log's keys are not claimed (a floor stands for them).
func (l *invalLog) claim(s *server, key string) (logged bool, standIns []*server, wait <-chan struct{}) {
	if !s.pending.Load() {
		return false, nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil || sl.keys[key] == nil {
		return false, nil, nil
	}
	e := sl.keys[key]
	if e.cleaning != nil {
		return true, nil, e.cleaning
	}
	e.cleaning = make(chan struct{})
	return true, slices.Clone(e.standIns), nil
}

// done removes key from s's log, where it was deleted or overwritten,
// unless it was logged again since its clean began; it ends the clean.
func (l *invalLog) done(s *server, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil || sl.keys[key] == nil {
		return
	}
	e := sl.keys[key]
	e.end()
	if e.again {
		e.again = false
		return
	}
	delete(sl.keys, key)
	l.total--
	l.settle(s, sl)
}

// release ends a clean of key at s that failed: key stays logged.
func (l *invalLog) release(s *server, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl := l.logs[s]; sl != nil && sl.keys[key] != nil {
		sl.keys[key].end()
		sl.keys[key].again = false
	}
}

// dropKeys forgets sl's keys, ending their cleans. Called with l.mu held.
func (l *invalLog) dropKeys(sl *serverLog) {
	for _, e := range sl.keys {
		e.end()
	}
	l.total -= len(sl.keys)
	sl.keys = nil
}

// take empties s's log and returns its keys, with their stand-ins.
func (l *invalLog) take(s *server) map[string][]*server {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		return nil
	}
	keys := standIns(sl)
	delete(l.logs, s)
	l.dropKeys(sl)
	s.pending.Store(false)
	return keys
}

// keys returns a copy of s's logged keys, with their stand-ins.
func (l *invalLog) keys(s *server) map[string][]*server {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl := l.logs[s]; sl != nil {
		return standIns(sl)
	}
	return map[string][]*server{}
}

// holds reports whether every key of keys is logged at s still: none was
// cleaned, or each was logged again.
func (l *invalLog) holds(s *server, keys map[string][]*server) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil || sl.overflowed {
		return false
	}
	for k := range keys {
		if sl.keys[k] == nil {
			return false
		}
	}
	return true
}

// standIns returns sl's keys with their stand-ins. Called with l.mu held.
func standIns(sl *serverLog) map[string][]*server {
	out := make(map[string][]*server, len(sl.keys))
	for k, e := range sl.keys {
		out[k] = slices.Clone(e.standIns)
	}
	return out
}

// clearOverflow ends s's overflow, once a CAS floor stands for it.
func (l *invalLog) clearOverflow(s *server) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl := l.logs[s]; sl != nil {
		sl.overflowed = false
		l.settle(s, sl)
	}
}

// forget drops s's log: s is no longer remembered.
func (l *invalLog) forget(s *server) { l.take(s) }

// state returns the number of keys logged at s and whether it overflowed.
func (l *invalLog) state(s *server) (n int, overflowed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl := l.logs[s]; sl != nil {
		return len(sl.keys), sl.overflowed
	}
	return 0, false
}

// settle drops an empty log. Called with l.mu held.
func (l *invalLog) settle(s *server, sl *serverLog) {
	if len(sl.keys) == 0 && !sl.overflowed {
		delete(l.logs, s)
		s.pending.Store(false)
	}
}
