package selector

import (
	"context"
	"slices"
	"sync"
	"time"
)

// pace is how fast the moves from one source send their batches: at most
// Moves.Rate keys and Moves.Bandwidth bytes a second, and, unless
// Moves.NoYield, slower while the application's requests wait longer at
// the servers the moves use (see Moves for the rule). Its own lock; the
// feed waits on it, and the batches report to it.
type pace struct {
	Moves
	mu    sync.Mutex
	next  time.Time                 // when the next batch may go, by the caps
	delay time.Duration             // the wait between batches that yielding adds
	most  time.Duration             // the longest such wait
	base  map[*server]time.Duration // a no-op's time at each server before the moves
}

const (
	yieldMin   = 5 * time.Millisecond   // the first wait a slow no-op adds
	yieldMax   = 200 * time.Millisecond // the longest: batches of 128 still move 640 keys a second
	yieldSlack = time.Millisecond       // what a no-op may take beyond twice its base: noise, not load
	yieldProbe = 5                      // no-ops timed for a server's base
)

// newPace returns the pace of moves from a server, which left the ring if
// draining: its keys are lost when it stops, so yielding waits yieldMin at
// most there (see Moves).
func newPace(m Moves, draining bool) *pace {
	most := yieldMax
	if draining {
		most = yieldMin
	}
	return &pace{Moves: m, next: time.Now(), base: map[*server]time.Duration{}, most: most}
}

// wait waits until the next batch may go, or ctx ends; it reports false
// then.
func (pc *pace) wait(ctx context.Context) bool {
	pc.mu.Lock()
	until := pc.next.Add(pc.delay)
	pc.mu.Unlock()
	if d := time.Until(until); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctx.Err() == nil
}

// batchSize is how many keys a batch takes: fewer at low rates, so that
// the caps are met smoothly (50 batches a second).
func (pc *pace) batchSize() int {
	if pc.Rate <= 0 {
		return moveBatchSize
	}
	return min(max(pc.Rate/50, 1), moveBatchSize)
}

// sent notes that a batch of n keys and size bytes went: the next waits
// as long as the caps ask for them.
func (pc *pace) sent(n int, size int64) {
	var d time.Duration
	if pc.Rate > 0 {
		d = time.Duration(n) * time.Second / time.Duration(pc.Rate)
	}
	if pc.Bandwidth > 0 {
		d = max(d, time.Duration(float64(size)/float64(pc.Bandwidth)*float64(time.Second)))
	}
	pc.mu.Lock()
	pc.next = later(pc.next, time.Now()).Add(d)
	pc.mu.Unlock()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// probe times a no-op on the application's connections to each of ss,
// and reports whether one waited too long against its base, which the
// first probe of a server takes (the median of a few). Yielding adapts the
// delay by it.
func (pc *pace) probe(ctx context.Context, ss []*server) {
	if pc.NoYield {
		return
	}
	slow := false
	for _, s := range ss {
		pc.mu.Lock()
		base, ok := pc.base[s]
		pc.mu.Unlock()
		if !ok {
			base = noopTime(ctx, s, yieldProbe)
			pc.mu.Lock()
			pc.base[s] = base
			pc.mu.Unlock()
			continue
		}
		if d := noopTime(ctx, s, 1); d > 2*base+yieldSlack {
			slow = true
		}
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	switch {
	case slow:
		pc.delay = min(max(2*pc.delay, yieldMin), pc.most)
	case pc.delay < yieldMin/4:
		pc.delay = 0
	default:
		pc.delay -= pc.delay / 4
	}
}

// noopTime returns the median time of n no-ops at s on the application's
// connections; a failed one counts as the timeout.
func noopTime(ctx context.Context, s *server, n int) time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		if err := s.meta.p.Noop(ctx); err != nil {
			ds[i] = s.timeout
			continue
		}
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return ds[n/2]
}
