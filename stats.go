package selector

import (
	"net"
	"sync"
	"time"
)

// Stats is a snapshot of a ServerList's discovery, for health checks and
// metrics of your own. With discovery by DNS, LastSync is the last answer,
// Synced is true from the first, and Relists and WatchRestarts stay 0.
type Stats struct {
	Servers       []net.Addr // the current servers, sorted
	Synced        bool       // the first list is published and the watch has started; always true without discovery, as HasSynced
	LastSync      time.Time  // when the API server last answered: a list, a watch, an event
	LastError     error      // the last discovery error, or nil; kept after discovery recovers
	LastErrorTime time.Time  // when; discovery is healthy if LastSync is later
	Relists       int        // LISTs after the first
	WatchRestarts int        // WATCHes after the first
}

// Stats returns the state of discovery. On a ServerList not made by
// NewServerList it has only the servers, and Synced, as HasSynced says.
func (ss *ServerList) Stats() Stats {
	s := Stats{Synced: true}
	if ss.disc != nil {
		s = ss.disc.get()
	}
	s.Servers = ss.Servers()
	return s
}

// HasSynced reports whether discovery has listed the Service's endpoints and
// is watching them, as client-go's informers do: true from NewServerList's
// return on. A ServerList not made by NewServerList is always synced.
func (ss *ServerList) HasSynced() bool {
	return ss.disc == nil || ss.disc.get().Synced
}

// DiscoveryStats returns the state of the Client's discovery: the Stats of
// the ServerList that NewClient made (for AcrossServices, that of
// NewClient's own Service), or of the one NewClientFromList was given.
func (c *Client) DiscoveryStats() Stats { return c.list.Stats() }

// HasSynced reports whether the Client's ServerList has synced (see
// ServerList.HasSynced): always true for a Client from NewClient, which
// returns only once it has.
func (c *Client) HasSynced() bool { return c.list.HasSynced() }

// stats is the watcher's part of Stats, shared with readers, and the
// ServerList's Metrics, told of each change as it is recorded.
type stats struct {
	mu      sync.Mutex
	s       Stats
	failing bool // an error is the latest news: the next answer is a recovery

	m       Metrics // nil for none
	service string  // "namespace/name", for m
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

// report tells the Metrics of a change, outside the lock.
func (s *stats) report(k DiscoveryKind, err error) {
	if s.m != nil {
		s.m.Discovery(DiscoveryEvent{Service: s.service, Kind: k, Err: err})
	}
}

func (s *stats) heard() {
	s.mu.Lock()
	s.s.LastSync = time.Now()
	recovered := s.failing
	s.failing = false
	s.mu.Unlock()
	if recovered {
		s.report(DiscoveryRecovered, nil)
	}
}

func (s *stats) synced() {
	s.update(func(st *Stats) { st.Synced = true })
	s.report(DiscoverySynced, nil)
}

func (s *stats) relisted() {
	s.update(func(st *Stats) { st.Relists++ })
	s.report(DiscoveryRelist, nil)
}

func (s *stats) rewatched() {
	s.update(func(st *Stats) { st.WatchRestarts++ })
	s.report(DiscoveryWatchRestart, nil)
}

func (s *stats) failed(err error) {
	s.mu.Lock()
	s.s.LastError, s.s.LastErrorTime, s.failing = err, time.Now(), true
	s.mu.Unlock()
	s.report(DiscoveryError, err)
}
