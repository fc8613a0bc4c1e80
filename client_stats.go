package selector

// ClientStats is the state of a Client: its servers, its moves and its
// discovery.
type ClientStats struct {
	Servers []ServerStats // the members, and those that left recently, by address
	Moves   MoveStats     // the keys moved after changes of servers (see Moves)
	// Discovery is the Stats of the Client's ServerList: the one NewClient
	// made (for AcrossServices, that of NewClient's own Service), or the one
	// NewClientFromList was given.
	Discovery Stats
}

// ServerStats is one server's state for a Client.
type ServerStats struct {
	Addr string
	// State is ServerUp, ServerFailing (failing, but kept in: as many
	// servers are out as the Client allows), ServerOut (out for this client)
	// or ServerGone (left).
	State         ServerState
	Invalidations int  // keys to delete there before they are served again
	Overflowed    bool // its invalidations overflowed: none of its older values will be served
	Floor         bool // values older than a CAS floor are not served (after an overflow or a FlushAll)
}

// Stats returns the state of the Client's servers, moves and discovery.
func (c *Client) Stats() ClientStats {
	st := c.serverStats()
	st.Discovery = c.list.Stats()
	return st
}

func (c *Client) serverStats() ClientStats {
	if c.pool != nil { // its groups' servers: the pool's own are not used
		var st ClientStats
		for _, g := range c.pool.view.Load().all {
			gs := g.c.serverStats()
			st.Servers = append(st.Servers, gs.Servers...)
			st.Moves = st.Moves.plus(gs.Moves)
		}
		sortStats(st.Servers)
		return st
	}
	// After the refresh under way, if any: a server it brings back is
	// reported up once requests are routed to it.
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := ClientStats{Moves: c.mover.totals()}
	for _, s := range c.servers {
		n, over := c.inval.state(s)
		state := ServerState(s.status().String())
		if s.status() == up && s.keptIn.Load() {
			state = ServerFailing
		}
		st.Servers = append(st.Servers, ServerStats{Addr: s.addr.str, State: state,
			Invalidations: n, Overflowed: over, Floor: s.floor.Load() != 0})
	}
	sortStats(st.Servers)
	return st
}
