package selector

import (
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
	keys       map[string]*server // key -> the stand-in that took its write, or nil
	overflowed bool               // keys were lost: a CAS floor replaces them
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
		l.total -= len(sl.keys)
		sl.keys, sl.overflowed = nil, true
	default:
		if sl.keys == nil {
			sl.keys = map[string]*server{}
		}
		if _, ok := sl.keys[key]; !ok {
			l.total++
		}
		if old := sl.keys[key]; standIn == nil && old != nil {
			standIn = old // keep the stand-in that holds a copy
		}
		sl.keys[key] = standIn
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
	l.total -= len(sl.keys)
	sl.keys, sl.overflowed = nil, true
	s.pending.Store(true)
}

// lookup reports whether key is logged at s, and the stand-in that took it.
// An overflowed log holds every key, with no stand-in known.
func (l *invalLog) lookup(s *server, key string) (logged bool, standIn *server) {
	if !s.pending.Load() {
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		return false, nil
	}
	standIn, ok := sl.keys[key]
	return ok || sl.overflowed, standIn
}

// done removes key from s's log: it was deleted or overwritten there.
func (l *invalLog) done(s *server, key string) {
	if !s.pending.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		return
	}
	if _, ok := sl.keys[key]; ok {
		delete(sl.keys, key)
		l.total--
	}
	l.settle(s, sl)
}

// take empties s's log and returns what it held.
func (l *invalLog) take(s *server) serverLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.logs[s]
	if sl == nil {
		return serverLog{}
	}
	delete(l.logs, s)
	l.total -= len(sl.keys)
	s.pending.Store(false)
	return *sl
}

// keys returns a copy of s's logged keys, with their stand-ins.
func (l *invalLog) keys(s *server) map[string]*server {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]*server{}
	if sl := l.logs[s]; sl != nil {
		for k, v := range sl.keys {
			out[k] = v
		}
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
