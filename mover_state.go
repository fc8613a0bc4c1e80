package selector

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// MoveStats are the totals of the key moves a Client ran (see Moves).
type MoveStats struct {
	Rounds  int           // rounds run: one per change of servers, or burst of changes
	Sources int           // servers whose keys this client listed and moved
	Claimed int           // servers another client was moving, or had moved, the keys of
	Refused int           // servers that cannot list their keys (crawler off, no meta protocol), or that other applications share (see Moves)
	Listed  int           // keys of the Client's found at a server that does not own them, each counted once a server and change
	Foreign int           // keys found at the servers listed that the Client did not place there (see Moves): left alone
	Moved   int           // of those, at their owner now (copied, or there already), and deleted where they were
	Left    int           // of those, left where they were: a server failed, the owner is out, another copy was under way, or the value is not servable
	Bytes   int64         // the bytes of the values copied to their owners
	Took    time.Duration // the time spent listing and moving, summed over the servers

	// Now, not totals: what this client has still to do for the servers
	// it routes by: this client's moves are done when Busy is false, and
	// Pending is then what they left (see docs/client.md, Moves).
	Pending int  // keys listed at servers that do not own them and not moved yet: the round's, those left for its next try, and, once Busy is false, those given up on (they move when read, or in the next change's round)
	Busy    bool // a round is due, under way, or will try again the keys it left
}

func (a MoveStats) plus(b MoveStats) MoveStats {
	return MoveStats{a.Rounds + b.Rounds, a.Sources + b.Sources, a.Claimed + b.Claimed, a.Refused + b.Refused,
		a.Listed + b.Listed, a.Foreign + b.Foreign, a.Moved + b.Moved, a.Left + b.Left, a.Bytes + b.Bytes, a.Took + b.Took,
		a.Pending + b.Pending, a.Busy || b.Busy}
}

// ETA is how long the keys pending take to move at the rate this client
// has moved keys so far (Moved over Took), or 0 if none is pending or
// none has moved yet: what a preStop hook or an operator waits for.
func (a MoveStats) ETA() time.Duration {
	if a.Pending == 0 || a.Moved == 0 || a.Took <= 0 {
		return 0
	}
	return time.Duration(float64(a.Pending) / float64(a.Moved) * float64(a.Took))
}

// mover is the state of a Client's moves: totals, and the servers whose
// refusal was logged. Its own lock; the Client calls it, never the reverse.
type mover struct {
	Moves                 // its settings
	claim   time.Duration // a claim's expiration, renewed at a third of it
	token   string        // this client's claim value
	kick    chan struct{} // a change to move the keys of
	mu      sync.Mutex
	stats   MoveStats
	told    map[string]bool     // servers whose refusal was logged
	left    map[string][]string // keys a round left at a server (by address), for the next round
	pending map[string]int      // keys listed at a server (by address) and not moved yet
	busy    bool                // see MoveStats.Busy
	seen    time.Time           // when this client saw the members it routes by
}

func newMover(m Moves) *mover {
	var b [8]byte
	rand.Read(b[:])
	return &mover{Moves: m, claim: defaultClaimTTL, token: hex.EncodeToString(b[:]), kick: make(chan struct{}, 1),
		told: map[string]bool{}, left: map[string][]string{}, pending: map[string]int{}}
}

func (m *mover) signal() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// newMembers notes that the client routes by new members from now, and
// signals the move loop.
func (m *mover) newMembers(now time.Time) {
	m.mu.Lock()
	m.seen = now
	if m.Rate >= 0 { // else no move loop runs
		m.busy = true
		m.signal() // under the lock: idle sees the kick, or busy is set after it
	}
	m.mu.Unlock()
}

// idle notes that the move loop waits for a change, unless one came.
func (m *mover) idle() {
	m.mu.Lock()
	if len(m.kick) == 0 {
		m.busy = false
	}
	m.mu.Unlock()
}

// setPending notes that n keys listed at addr are still to move.
func (m *mover) setPending(addr string, n int) {
	m.mu.Lock()
	if n == 0 {
		delete(m.pending, addr)
	} else {
		m.pending[addr] = n
	}
	m.mu.Unlock()
}

// sinceMembers is the time since the client saw the members it routes by.
func (m *mover) sinceMembers() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.seen)
}

func (m *mover) add(f func(st *MoveStats)) {
	m.mu.Lock()
	f(&m.stats)
	m.mu.Unlock()
}

func (m *mover) totals() MoveStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stats
	for _, n := range m.pending {
		st.Pending += n
	}
	st.Busy = m.busy
	return st
}

// firstRefusal reports whether addr's refusal is news, to be logged once.
func (m *mover) firstRefusal(addr string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.told[addr] {
		return false
	}
	m.told[addr] = true
	return true
}

// keepLeft keeps the keys a round left at addr, for the next round.
func (m *mover) keepLeft(addr string, keys []string) {
	m.mu.Lock()
	m.left[addr] = keys
	m.mu.Unlock()
}

// leftAt returns the keys a round left at addr, for the next round.
func (m *mover) leftAt(addr string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.left[addr]
}

// movedOne notes that one of the keys pending at addr moved.
func (m *mover) movedOne(addr string) {
	m.mu.Lock()
	if m.pending[addr] > 0 {
		m.pending[addr]--
	}
	m.mu.Unlock()
}

// takeLeft returns, and forgets, the keys a round left at addr.
func (m *mover) takeLeft(addr string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := m.left[addr]
	delete(m.left, addr)
	return keys
}

// forgetLeft forgets the keys rounds left: a new change's round lists
// every server again.
func (m *mover) forgetLeft() {
	m.mu.Lock()
	clear(m.left)
	clear(m.pending)
	m.mu.Unlock()
}
