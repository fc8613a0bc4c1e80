package selector

import (
	"net"
	"sync"
	"time"
)

// Stats is a snapshot of a ServerList's discovery, for health checks and
// metrics of your own.
type Stats struct {
	Servers       []net.Addr // the current servers, sorted
	Synced        bool       // the first list is published and the watch has started
	LastSync      time.Time  // when the API server last answered: a list, a watch, an event
	LastError     error      // the last discovery error, or nil; kept after discovery recovers
	LastErrorTime time.Time  // when; discovery is healthy if LastSync is later
	Relists       int        // LISTs after the first
	WatchRestarts int        // WATCHes after the first
}

// stats is the watcher's part of Stats, shared with readers.
type stats struct {
	mu sync.Mutex
	s  Stats
}

func (s *stats) get() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s
}

func (s *stats) update(f func(*Stats)) {
	s.mu.Lock()
	f(&s.s)
	s.mu.Unlock()
}

func (s *stats) heard()     { s.update(func(st *Stats) { st.LastSync = time.Now() }) }
func (s *stats) relisted()  { s.update(func(st *Stats) { st.Relists++ }) }
func (s *stats) rewatched() { s.update(func(st *Stats) { st.WatchRestarts++ }) }
func (s *stats) failed(err error) {
	s.update(func(st *Stats) { st.LastError, st.LastErrorTime = err, time.Now() })
}
