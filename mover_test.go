package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// movesDone waits until c has run rounds rounds of moves, and returns its
// totals.
func movesDone(t *testing.T, c *Client, rounds int) MoveStats {
	t.Helper()
	// Longer than eventually waits: a round lists and moves thousands of
	// keys, which on a loaded machine under -race takes seconds.
	require.Eventually(t, func() bool { return c.Stats().Moves.Rounds >= rounds }, time.Minute, time.Millisecond, "a round of moves")
	return c.Stats().Moves
}

// After a scale-up, every key that the new server owns is moved to it
// without a read, with its flags and exact expiration, and none is left
// where it was: each server holds only its own keys.
func TestMovesScaleUp(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]))
	const n = 3000
	for i := range n {
		it := &memcache.Item{Key: fmt.Sprint("mv-", i), Value: []byte(fmt.Sprint("value ", i)), Flags: uint32(i)}
		if i%2 == 0 {
			it.Expiration = 200
		}
		require.NoError(t, c.Set(it))
	}
	set := time.Now()
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	st := movesDone(t, c, 1)

	owned, bytes := 0, 0
	for i := range n {
		k := fmt.Sprint("mv-", i)
		a, err := ss.PickServer(k)
		require.NoError(t, err)
		if a.String() == ms[2].addr {
			bytes += len(fmt.Sprint("value ", i))
		}
		for _, m := range ms {
			it, err := direct(m.addr).Get(k)
			if m.addr != a.String() {
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s left at %s, which does not own it", k, m.addr)
				continue
			}
			require.NoError(t, err, "%s at its owner %s", k, m.addr)
			require.Equal(t, fmt.Sprint("value ", i), string(it.Value))
			require.Equal(t, uint32(i), it.Flags)
		}
		if a.String() == ms[2].addr {
			owned++
			if i%2 == 0 {
				require.InDelta(t, 200-time.Since(set).Seconds(), metaTTL(t, ms[2].addr, k), 3, "%s: what was left of its TTL", k)
			} else {
				require.Equal(t, -1, metaTTL(t, ms[2].addr, k), k)
			}
		}
	}
	require.Greater(t, owned, n/5)
	// A key left by a pass (a request past the timeout on a loaded machine)
	// is listed again by the next, and moved then.
	require.Equal(t, owned, st.Moved, "the keys the new server owns were moved, each once")
	require.Equal(t, owned, st.Listed, "each key listed is counted once, however many listings found it")
	require.Equal(t, 2, st.Sources, "both old servers were listed")
	if st.Left == 0 { // a fill whose reply was lost counts its key when found at its owner, not its bytes
		require.EqualValues(t, bytes, st.Bytes, "the bytes of the values moved")
	} else {
		require.LessOrEqual(t, st.Bytes, int64(bytes), "the bytes of the values moved")
	}
	require.Zero(t, st.ETA(), "nothing pending")
}

func TestMoveStatsETA(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   MoveStats
		want time.Duration
	}{
		{"none pending", MoveStats{Moved: 100, Took: time.Second}, 0},
		{"none moved yet", MoveStats{Pending: 100}, 0},
		{"at the rate so far", MoveStats{Moved: 1000, Took: 2 * time.Second, Pending: 5000}, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, tc.st.ETA()) })
	}
}

// Many clients see the same change: one moves each server's keys, and
// each key is copied once.
func TestMovesOnceAcrossClients(t *testing.T) {
	ms := startMemcached(t, 3)
	const clients, n = 8, 2000
	var cs []*Client
	var lists []*ServerList
	var rec []*recMetrics
	for range clients {
		m := &recMetrics{}
		c, ss := newTestClient(t, addrsOf(ms[:2]), WithMetrics(m))
		cs, lists, rec = append(cs, c), append(lists, ss), append(rec, m)
	}
	for i := range n {
		require.NoError(t, cs[i%clients].Set(&memcache.Item{Key: fmt.Sprint("once-", i), Value: []byte("v")}))
	}
	var wg sync.WaitGroup
	for _, ss := range lists {
		wg.Go(func() { require.NoError(t, ss.SetServers(addrsOf(ms)...)) })
	}
	wg.Wait()
	var total MoveStats
	for _, c := range cs {
		total = total.plus(movesDone(t, c, 1))
	}
	copied := map[string]int{}
	for _, m := range rec {
		m.read(func(m *recMetrics) {
			for _, e := range m.handoffs {
				if e.Result == string(handoffCopied) {
					copied[e.From]++
				}
			}
		})
	}
	moving := 0
	for i := range n {
		if a, _ := lists[0].PickServer(fmt.Sprint("once-", i)); a.String() == ms[2].addr {
			moving++
		}
	}
	require.Equal(t, moving, copied[ms[0].addr]+copied[ms[1].addr], "each key copied once, by all the clients together")
	require.Equal(t, moving, total.Moved)
	require.Equal(t, 2, total.Sources, "one client listed each old server")
	require.Equal(t, 2*(clients-1), total.Claimed, "the others saw the claim")
}

// A Delete while the keys move is never undone by a move.
func TestMovesNeverBringBackADelete(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]), WithMoves(Moves{Rate: 500}))
	const n = 3000
	for i := range n {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("del-", i), Value: []byte("v")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the moves to begin", func() bool { return c.Stats().Moves.Moved > 0 })
	deleted := map[string]bool{}
	for i := 0; i < n; i += 2 {
		k := fmt.Sprint("del-", i)
		require.NoError(t, c.Delete(k))
		deleted[k] = true
		if i%200 == 0 {
			time.Sleep(5 * time.Millisecond) // spread over the move
		}
		if i == n/2 {
			require.Zero(t, c.Stats().Moves.Rounds, "half the deletes ran while the keys moved (about 2 s at this rate)")
		}
	}
	movesDone(t, c, 1)
	for k := range deleted {
		_, err := c.Get(k)
		require.ErrorIs(t, err, memcache.ErrCacheMiss, k)
		for _, m := range ms {
			// A placeholder of a copy that was undone (W or Z) may wait
			// for its expiration; it is no value.
			reply := rawCommand(t, m.addr, "mg "+k+" v\r\n")
			a, _ := ss.PickServer(k)
			require.True(t, reply == "EN" || strings.Contains(reply, " W") || strings.Contains(reply, " Z"),
				"%s at %s (owner %s; new %s): %q", k, m.addr, a, ms[2].addr, reply)
		}
	}
}

// A server whose crawler is off cannot list its keys: the Client says so
// once, and its keys still move when read.
func TestMovesRefused(t *testing.T) {
	ms := startMemcached(t, 2)
	ms[0].restartWith("-o", "no_lru_crawler")
	log := &lineLog{}
	c, ss := newTestClient(t, addrsOf(ms[:1]), WithSlog(log.logger()))
	keys := keysOf(t, listOf(t, addrsOf(ms)...), ms[1].addr, 20)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	st := movesDone(t, c, 1)
	require.Equal(t, 1, st.Refused)
	require.Zero(t, st.Moved)
	require.Equal(t, 1, log.count("cannot move keys from this server"))
	for _, k := range keys {
		_, err := c.Get(k)
		require.NoError(t, err, "handed off when read")
	}
}

// lineLog keeps what a slog.Logger wrote, to count lines.
type lineLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lineLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.b.Write(p)
	}), nil))
}

func (l *lineLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), sub)
}

// A server removed while it still serves (a pod terminating, in its grace
// period) has its keys moved out: after it stops, every key is still
// found, without a read during the move.
func TestMovesScaleDown(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	const n = 3000
	held := 0 // by the server removed
	for i := range n {
		k := fmt.Sprint("down-", i)
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(fmt.Sprint("value ", i))}))
		if a, err := ss.PickServer(k); err == nil && a.String() == ms[2].addr {
			held++
		}
	}
	require.NoError(t, ss.SetServers(addrsOf(ms[:2])...))
	st := movesDone(t, c, 1)
	require.Greater(t, held, n/5)
	require.Equal(t, held, st.Moved, "each key of the removed server moved once")
	require.Equal(t, held, st.Listed, "each key listed is counted once, however many listings found it")
	require.Equal(t, 1, st.Sources, "only the removed server lost slots: the others are not listed")
	ms[2].kill()
	for i := range n {
		it, err := c.Get(fmt.Sprint("down-", i))
		require.NoError(t, err, "down-%d", i)
		require.Equal(t, fmt.Sprint("value ", i), string(it.Value))
	}
}

// A mover that dies leaves its claim to expire: another client then takes
// over, and moves the keys.
func TestMovesTakeOver(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms[:2]))
	c.mover.claim = 3 * time.Second
	const n = 1000
	for i := range n {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("take-", i), Value: []byte("v")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the new ring", func() bool { return c.rt.Load().base == ss.ring.Load() })
	key := claimPrefix + ringID(c.rt.Load())
	for _, m := range ms[:2] { // a mover that claimed both, and died
		require.NoError(t, direct(m.addr).Add(&memcache.Item{Key: key, Value: []byte("dead"), Expiration: 3}))
	}
	owned := 0
	for i := range n {
		if a, _ := ss.PickServer(fmt.Sprint("take-", i)); a.String() == ms[2].addr {
			owned++
		}
	}
	eventually(t, "the keys moved", func() bool { return c.Stats().Moves.Moved == owned })
	st := c.Stats().Moves
	require.Equal(t, 2, st.Claimed, "the first round found the claims")
	require.Equal(t, 2, st.Sources, "the second took both over")
	for i := range n {
		k := fmt.Sprint("take-", i)
		if a, _ := ss.PickServer(k); a.String() == ms[2].addr {
			_, err := direct(ms[2].addr).Get(k)
			require.NoError(t, err, k)
		}
	}
}

// A change while a round moves ends it: the next round starts over from
// the new rings, and moves the keys of the server that stops serving
// first, before the ones the earlier change left at the servers that stay.
// As in a rolling restart, where a pod is removed a moment after its
// successor joins.
func TestMovesAChangeEndsTheRound(t *testing.T) {
	ms := startMemcached(t, 4)
	c, ss := newTestClient(t, addrsOf(ms[:3]), WithMoves(Moves{Rate: 800}))
	ss.drains = true // as with discovery: a server removed serves while it drains
	const n = 12000
	for i := range n {
		require.NoError(t, c.Set(&memcache.Item{Key: fmt.Sprint("chg-", i), Value: []byte("v")}))
	}
	// The keys the first change gives ms[3] (and the second leaves it).
	final := listOf(t, addrsOf(ms[1:])...)
	var first []string
	for i := range n {
		k := fmt.Sprint("chg-", i)
		if a, _ := final.PickServer(k); a.String() == ms[3].addr {
			if b, _ := ss.PickServer(k); b.String() != ms[0].addr {
				first = append(first, k)
			}
		}
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...)) // ms[3] joins: about 3000 keys to move, 4 s at this rate
	eventually(t, "the first round's moves", func() bool { return c.Stats().Moves.Moved > 0 })
	ss.setDraining([]string{ms[0].addr})                  // first, as ServerList.publish does
	require.NoError(t, ss.SetServers(addrsOf(ms[1:])...)) // ms[0] is removed, and still serves
	// While the removed server's keys move, the first change's wait: the
	// round goes to the servers that left first. Counted once half of the
	// removed server's keys left it, in one batch a server, at once (a
	// count by one Get a key took seconds under -race on a loaded CI
	// machine, long enough for the mover to finish them, and found 0).
	held := currItems(t, ms[0].addr)
	require.Eventually(t, func() bool { return currItems(t, ms[0].addr) < held/2 }, time.Minute, 10*time.Millisecond,
		"the removed server's keys move")
	left := 0
	for _, m := range ms[1:3] {
		got, err := direct(m.addr).GetMulti(first)
		require.NoError(t, err)
		left += len(got)
	}
	t.Logf("%d of the first change's %d keys waited", left, len(first))
	require.Positive(t, left, "the first change's keys wait: the removed server's go first")
	// The removed server's keys moved: it holds the claims of the two
	// rounds at most, its record of the slots it lost, and the keys the
	// round left (MoveStats.Left: a copy of the round the change ended
	// may still hold its placeholder at the key's owner; a later round
	// moves them, after the other servers').
	require.Eventually(t, func() bool { return currItems(t, ms[0].addr) <= 3+c.Stats().Moves.Left }, time.Minute, 10*time.Millisecond,
		"the removed server's keys moved")
	st := movesDone(t, c, 1)
	require.Equal(t, 1, st.Rounds, "the round the second change ended is not counted")
	for i := range n {
		it, err := c.Get(fmt.Sprint("chg-", i))
		require.NoError(t, err, "chg-%d", i)
		require.Equal(t, "v", string(it.Value))
	}
}

// currItems is memcached's count of the items at addr.
func currItems(t *testing.T, addr string) int { return int(statOf(t, addr, "curr_items")) }

// A key the mover could not move in a round (its owner held another
// copy's placeholder, as a copy whose reply was lost leaves it for
// reserveTTL) is listed again by a later round, without a change: a
// server that drains keeps none of the Client's keys for want of a round.
// (A CI run of e2e's TestClientSharedServers: a terminating pod kept the
// Client's keys until its grace period ended.)
func TestMovesRetryWhatTheyLeft(t *testing.T) {
	ms := startMemcached(t, 3)
	c, ss := newTestClient(t, addrsOf(ms))
	ss.drains = true // as with discovery
	keys := keysOf(t, ss, ms[2].addr, 40)
	for _, k := range keys {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte(k)}))
	}
	// Another copy's placeholder for keys[0] at its next owner, for longer
	// than a round's listings of a draining server take.
	after := listOf(t, addrsOf(ms[:2])...)
	a, err := after.PickServer(keys[0])
	require.NoError(t, err)
	next := a.String()
	_, _, reserved, err := serverOf(c, next).wire().Reserve(context.Background(), keys[0], 6)
	require.NoError(t, err)
	require.True(t, reserved)

	require.NoError(t, ss.SetServers(addrsOf(ms[:2])...))
	ss.setDraining([]string{ms[2].addr})
	st := movesDone(t, c, 1)
	require.Positive(t, st.Left, "the first round left the key whose owner held a placeholder")
	// Stats first: a key still at its source then was not moved when they
	// were taken (it leaves its source before it counts as moved).
	st = c.Stats().Moves
	if _, err := direct(ms[2].addr).Get(keys[0]); err == nil {
		require.True(t, st.Busy, "a key left is tried again: %+v", st)
		require.Equal(t, 1, st.Pending, "the key left is pending: %+v", st)
	}
	require.Eventually(t, func() bool {
		_, err := direct(ms[2].addr).Get(keys[0])
		return errors.Is(err, memcache.ErrCacheMiss)
	}, time.Minute, 50*time.Millisecond, "a later round moved the key left")
	require.Eventually(t, func() bool { st := c.Stats().Moves; return !st.Busy && st.Pending == 0 },
		10*time.Second, 10*time.Millisecond, "the mover is done once the key moved: %+v", c.Stats().Moves)
	st = c.Stats().Moves
	require.Equal(t, len(keys), st.Moved, "every key moved, once")
	require.Equal(t, 1, st.Sources, "the later rounds resumed the first's claim")
	for _, k := range keys {
		a, err := after.PickServer(k)
		require.NoError(t, err)
		it, err := direct(a.String()).Get(k)
		require.NoError(t, err, "%s at its owner %s", k, a)
		require.Equal(t, k, string(it.Value))
	}
}

// TestPaceCaps: the caps space the batches by their keys and bytes.
func TestPaceCaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moves Moves
		keys  int
		bytes int64
		want  time.Duration
	}{
		{"no cap", Moves{}, 128, 1 << 20, 0},
		{"keys", Moves{Rate: 1000}, 100, 0, 100 * time.Millisecond},
		{"bytes", Moves{Bandwidth: 1 << 20}, 0, 1 << 19, 500 * time.Millisecond},
		{"the slower of both", Moves{Rate: 1000, Bandwidth: 1 << 20}, 10, 1 << 19, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := newPace(tc.moves, false)
			start := time.Now()
			pc.sent(tc.keys, tc.bytes)
			require.InDelta(t, float64(tc.want), float64(pc.next.Sub(start)), float64(20*time.Millisecond))
		})
	}
	require.Equal(t, moveBatchSize, newPace(Moves{}, false).batchSize())
	require.Equal(t, 20, newPace(Moves{Rate: 1000}, false).batchSize(), "50 batches a second")
}

// TestPaceYields: a server whose no-op takes longer than before the moves
// makes the mover wait between batches, twice as long each time; once it
// answers as before, the wait shrinks to none. NoYield never waits; moves
// from a server that left (draining) wait yieldMin at most.
func TestPaceYields(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms), WithTimeout(100*time.Millisecond))
	require.NoError(t, c.Ping())
	s := c.servers[ms[0].addr]
	ctx := context.Background()
	for _, tc := range []struct {
		name              string
		noYield, draining bool
		second            time.Duration // the wait after two slow probes
	}{
		{"yields", false, false, 2 * yieldMin},
		{"no yield", true, false, 0},
		{"draining", false, true, yieldMin},
	} {
		pc := newPace(Moves{NoYield: tc.noYield}, tc.draining)
		pc.probe(ctx, []*server{s}) // the base
		require.Zero(t, pc.delay, tc.name)
		ms[0].signal(syscall.SIGSTOP)
		pc.probe(ctx, []*server{s})
		first := pc.delay
		pc.probe(ctx, []*server{s})
		ms[0].signal(syscall.SIGCONT)
		require.Equal(t, tc.second, pc.delay, tc.name)
		if tc.noYield {
			continue
		}
		require.Equal(t, yieldMin, first, tc.name)
		require.Eventually(t, func() bool { pc.probe(ctx, []*server{s}); return pc.delay == 0 }, 10*time.Second, time.Millisecond)
	}
}

// A Client that learns a server's record of lost slots only after another
// Client wrote there a loss of a change it has not seen yet (its first
// read of the record failed; a new application pod as a memcached pod
// scales up) must not take that loss for one from before: the server's
// values of those slots are the keys' values, which its mover moves, not
// older ones to delete (TestClientMovesManyClients: one server's keys
// deleted instead of moved).
func TestMovesAfterLearningTheirOwnChange(t *testing.T) {
	ms := startMemcached(t, 3)
	fast, fastList := newTestClient(t, addrsOf(ms[:2]), WithMoves(Moves{Rate: -1}))
	late, lateList := newTestClient(t, addrsOf(ms[:2]))
	const n = 3000
	for i := range n {
		require.NoError(t, late.Set(&memcache.Item{Key: fmt.Sprint("own-", i), Value: []byte("v")}))
	}
	for _, m := range ms[:2] { // as if its first reads of the records had failed
		s := serverOf(late, m.addr)
		require.Eventually(t, func() bool { late.mu.Lock(); defer late.mu.Unlock(); return s.learning == nil }, time.Minute, time.Millisecond)
		s.lossesKnown.Store(false)
	}
	require.NoError(t, fastList.SetServers(addrsOf(ms)...))
	eventually(t, "the fast client to see the scale-up", func() bool { return fast.rt.Load().base == fastList.ring.Load() })
	for _, m := range ms[:2] {
		it, err := direct(m.addr).Get(lostKey)
		require.NoError(t, err, "the fast client recorded %s's loss", m.addr)
		rec, err := decodeLost(it.Value)
		require.NoError(t, err)
		require.NotEmpty(t, rec.runs)
	}
	itemsBefore := 0
	for _, m := range ms {
		itemsBefore += currItems(t, m.addr)
	}
	missed := 0
	for i := range n { // the late client reads its keys, learning the records, by its old ring
		if _, err := late.Get(fmt.Sprint("own-", i)); errors.Is(err, memcache.ErrCacheMiss) {
			missed++ // a slot that waits: not served
		} else {
			require.NoError(t, err)
		}
	}
	require.Positive(t, waitingGains(late), "the losses learned before the change wait")
	itemsWindow := 0
	for _, m := range ms {
		itemsWindow += currItems(t, m.addr)
	}
	t.Logf("before the late client saw the change: %d of %d keys missed; %d items, %d before", missed, n, itemsWindow, itemsBefore)
	require.Equal(t, itemsBefore, itemsWindow, "nothing deleted while the late client routes by its old ring")
	require.NoError(t, lateList.SetServers(addrsOf(ms)...))
	st := movesDone(t, late, 1)
	found, items := 0, 0
	for i := range n {
		if it, err := late.Get(fmt.Sprint("own-", i)); err == nil && string(it.Value) == "v" {
			found++
		}
	}
	for _, m := range ms {
		items += currItems(t, m.addr)
	}
	t.Logf("moved %d, left %d, listed %d; %d of %d keys found, %d items", st.Moved, st.Left, st.Listed, found, n, items)
	require.Equal(t, n, found, "every key found after the late client moved them")
	require.Equal(t, missed, st.Moved, "the keys of the slots that waited are the ones moved, each moved")
}

// waitingGains returns how many gains of c wait for their floors (see
// gains.learn).
func waitingGains(c *Client) int {
	n := 0
	if p := c.gains.events.Load(); p != nil {
		for _, e := range *p {
			if e != nil && e.waiting() {
				n++
			}
		}
	}
	return n
}
