package discovery

import (
	"sync"
	"time"
)

// Stats is the state of one discovery, the watch's or DNS's: the root's
// Stats without the servers.
type Stats struct {
	Synced        bool      // the first list is published and the watch has started (DNS: the first answer)
	LastSync      time.Time // when the source last answered: a list, a watch, an event, a DNS answer
	LastError     error     // the last error, or nil; kept after discovery recovers
	LastErrorTime time.Time // when
	Relists       int       // LISTs after the first
	WatchRestarts int       // WATCHes after the first
}

// A Kind is a change of state that a Report hears of. Its values are the
// root's DiscoveryKind's.
type Kind string

const (
	KindSynced       Kind = "synced"        // listed and watching, or DNS's first answer
	KindRelist       Kind = "relist"        // a LIST after the first
	KindWatchRestart Kind = "watch_restart" // a WATCH after the first
	KindError        Kind = "error"         // a LIST, WATCH or lookup failed; the members stay as they were
	KindRecovered    Kind = "recovered"     // the source answered after an error
)

// A Report hears of each change of state as it is recorded, outside any
// lock, from the discovery's goroutine: the root's Metrics.
type Report func(k Kind, err error)

// stats is a discovery's Stats, shared with readers, and its Report.
type stats struct {
	mu      sync.Mutex
	s       Stats
	failing bool // an error is the latest news: the next answer is a recovery

	report Report // nil for none
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

// tell reports a change, outside the lock.
func (s *stats) tell(k Kind, err error) {
	if s.report != nil {
		s.report(k, err)
	}
}

func (s *stats) heard() {
	s.mu.Lock()
	s.s.LastSync = time.Now()
	recovered := s.failing
	s.failing = false
	s.mu.Unlock()
	if recovered {
		s.tell(KindRecovered, nil)
	}
}

func (s *stats) synced() {
	s.update(func(st *Stats) { st.Synced = true })
	s.tell(KindSynced, nil)
}

func (s *stats) relisted() {
	s.update(func(st *Stats) { st.Relists++ })
	s.tell(KindRelist, nil)
}

func (s *stats) rewatched() {
	s.update(func(st *Stats) { st.WatchRestarts++ })
	s.tell(KindWatchRestart, nil)
}

func (s *stats) failed(err error) {
	s.mu.Lock()
	s.s.LastError, s.s.LastErrorTime, s.failing = err, time.Now(), true
	s.mu.Unlock()
	s.tell(KindError, err)
}
