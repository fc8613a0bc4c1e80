package selector

import (
	"net"
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
		d := ss.disc.Stats()
		s = Stats{Synced: d.Synced, LastSync: d.LastSync, LastError: d.LastError, LastErrorTime: d.LastErrorTime,
			Relists: d.Relists, WatchRestarts: d.WatchRestarts}
	}
	s.Servers = ss.Servers()
	return s
}

// HasSynced reports whether discovery has listed the Service's endpoints and
// is watching them, as client-go's informers do: true from NewServerList's
// return on. A ServerList not made by NewServerList is always synced.
func (ss *ServerList) HasSynced() bool {
	return ss.disc == nil || ss.disc.Stats().Synced
}
