package selector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

func TestMergeLost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		a, b    []lostRun
		want    []lostRun
		wantLen int // instead of want, for coarsen
	}{
		{name: "empty", want: nil},
		{name: "one side", a: []lostRun{{1, 3, 5}}, want: []lostRun{{1, 3, 5}}},
		{name: "disjoint", a: []lostRun{{1, 3, 5}}, b: []lostRun{{7, 9, 2}}, want: []lostRun{{1, 3, 5}, {7, 9, 2}}},
		{name: "adjacent of one floor join", a: []lostRun{{1, 3, 5}}, b: []lostRun{{4, 9, 5}}, want: []lostRun{{1, 9, 5}}},
		{name: "overlap takes the higher floor", a: []lostRun{{1, 10, 5}}, b: []lostRun{{4, 6, 9}},
			want: []lostRun{{1, 3, 5}, {4, 6, 9}, {7, 10, 5}}},
		{name: "a lower floor changes nothing", a: []lostRun{{1, 10, 9}}, b: []lostRun{{4, 6, 5}}, want: []lostRun{{1, 10, 9}}},
		{name: "the last slot", a: []lostRun{{1<<slotBits - 2, 1<<slotBits - 1, 3}}, b: []lostRun{{0, 0, 3}},
			want: []lostRun{{0, 0, 3}, {1<<slotBits - 2, 1<<slotBits - 1, 3}}},
		{name: "too many runs are joined", a: spacedRuns(maxLostRuns + 10), wantLen: (maxLostRuns + 11) / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeLost(tc.a, tc.b)
			if tc.wantLen > 0 {
				require.Len(t, got, tc.wantLen)
				for _, r := range tc.a { // every slot lost keeps a floor at least its own
					require.GreaterOrEqual(t, floorAt(got, r.lo), r.floor)
				}
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// spacedRuns returns n runs of one slot, with a slot between each.
func spacedRuns(n int) []lostRun {
	rs := make([]lostRun, n)
	for i := range rs {
		rs[i] = lostRun{uint32(2 * i), uint32(2 * i), uint64(i + 1)}
	}
	return rs
}

// floorAt returns the floor of slot in runs, or 0.
func floorAt(runs []lostRun, slot uint32) uint64 {
	for _, r := range runs {
		if r.lo <= slot && slot <= r.hi {
			return r.floor
		}
	}
	return 0
}

func TestLostRecordEncoding(t *testing.T) {
	for _, rec := range []lostRecord{
		{},
		{start: 1733400000, runs: []lostRun{{0, 0, 1}}},
		{start: -5, runs: []lostRun{{3, 700, 1 << 40}, {701, 1<<slotBits - 1, 2}}},
		{start: 7, runs: spacedRuns(1000)},
	} {
		got, err := decodeLost(rec.encode())
		require.NoError(t, err)
		require.Equal(t, rec.start, got.start)
		require.Equal(t, len(rec.runs), len(got.runs))
		for i := range rec.runs {
			require.Equal(t, rec.runs[i], got.runs[i])
		}
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"another application's value", []byte("hello")},
		{"truncated", lostRecord{start: 1, runs: []lostRun{{1, 2, 3}}}.encode()[:4]},
		{"trailing bytes", append(lostRecord{start: 1, runs: []lostRun{{1, 2, 3}}}.encode(), 0)},
		{"a run past the last slot", lostRecord{start: 1, runs: []lostRun{{1 << slotBits, 1 << slotBits, 3}}}.encode()},
		{"a floor of 0", lostRecord{start: 1, runs: []lostRun{{1, 2, 0}}}.encode()},
		{"more runs than bytes", []byte{lostVersion, 2, 0xff, 0xff, 0x03}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeLost(tc.b)
			require.Error(t, err)
		})
	}
}

// FuzzDecodeLost: any value under lostKey (another application may write
// one) decodes to runs in slot order, disjoint, within the slots, or is an
// error; what decodes encodes back to the same bytes.
func FuzzDecodeLost(f *testing.F) {
	f.Add(lostRecord{start: 9, runs: []lostRun{{3, 700, 1 << 40}, {701, 800, 2}}}.encode())
	f.Add([]byte{lostVersion, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeLost(b)
		if err != nil {
			return
		}
		next := uint32(0)
		for i, r := range rec.runs {
			if (i > 0 && r.lo < next) || r.hi < r.lo || r.hi >= 1<<slotBits || r.floor == 0 {
				t.Fatalf("run %d: %+v", i, r)
			}
			next = r.hi + 1
		}
		again, err := decodeLost(rec.encode())
		require.NoError(t, err)
		require.Equal(t, rec.runs, again.runs)
	})
}

// TestMoveBackSeenByANewClient: keys move away from servers that keep
// their values (a scale-up; a pod NotReady without a restart), are written
// where they moved after the handoff window (moves off, so that nothing
// cleans the old values), and move back. A Client started after that saw
// neither change: it must still serve none of the old values, which the
// servers' records of their lost slots tell it are older than the loss.
// Read as the new Client starts, the floors apply at once. Read late (its
// first read failed), they apply at once where the Client that saw the
// move back marked it there; unmarked, the slots wait, serving nothing,
// and then take the floors.
func TestMoveBackSeenByANewClient(t *testing.T) {
	type tcase struct {
		name       string
		from, away []int // the members before and while the keys are away
		back       []int // the members that own again slots they lost
		unmarked   bool  // the marks of the move back are gone
		late       bool  // the new client reads the records late
	}
	var cases []tcase
	for _, v := range []struct {
		suffix         string
		unmarked, late bool
	}{{"", false, false}, {", unmarked", true, false}, {", read late", false, true}, {", unmarked, read late", true, true}} {
		for _, tc := range []tcase{
			{name: "scale up, then down", from: []int{0, 1}, away: []int{0, 1, 2}, back: []int{0, 1}},
			{name: "a member leaves and returns", from: []int{0, 1, 2}, away: []int{0, 1}, back: []int{2}},
		} {
			tc.name += v.suffix
			tc.unmarked, tc.late = v.unmarked, v.late
			cases = append(cases, tc)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ms := startMemcached(t, 3)
			pick := func(idx []int) []string {
				var a []string
				for _, i := range idx {
					a = append(a, ms[i].addr)
				}
				return a
			}
			c, ss := newTestClient(t, pick(tc.from), WithHandoff(Handoff{Window: 100 * time.Millisecond}), WithMoves(Moves{Rate: -1}))
			change := func(addrs []string, what string) {
				require.NoError(t, ss.SetServers(addrs...))
				eventually(t, what, func() bool { return c.rt.Load().base == ss.ring.Load() })
			}
			var keys []string
			for i := range 300 {
				keys = append(keys, fmt.Sprint("b", i))
				require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("old")}))
			}
			change(pick(tc.away), "the client to see the keys move away")
			time.Sleep(200 * time.Millisecond) // past the handoff window: a write no longer deletes where the key was
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
			}
			change(pick(tc.from), "the client to see them move back")
			time.Sleep(time.Second) // the second passes of the changes ran, and marked again what they raised (see remark)
			for _, i := range tc.back {
				eventually(t, "the return of the slots to be marked", func() bool { return allMarked(t, ms[i].addr) })
			}
			hits := 0
			for _, k := range keys {
				it, err := c.Get(k)
				if err == nil {
					require.Equal(t, "new", string(it.Value))
					hits++
				}
			}
			t.Logf("the client that saw the changes found %d of %d keys", hits, len(keys))
			require.NoError(t, c.Close()) // it marks no more (see remark)
			for _, i := range tc.back {
				if tc.unmarked {
					require.NoError(t, direct(ms[i].addr).Delete(backKey))
				}
			}
			learnFast := Option(func(o *options) { o.client.learnWait = 3 * time.Second }) // longer than its reads take under -race
			var fresh *Client
			if tc.late {
				var stopped []*memcached
				for _, i := range tc.back {
					stopped = append(stopped, ms[i])
				}
				fresh = lateLearner(t, ss, stopped, learnFast)
			} else {
				var err error
				fresh, err = NewClientFromList(ss, fastFailover, WithSlog(slog.New(slog.DiscardHandler)), WithMoves(Moves{Rate: -1}), learnFast)
				require.NoError(t, err)
				defer fresh.Close()
			}
			countOld := func() (old int) {
				for _, k := range keys {
					if it, err := fresh.Get(k); err == nil && string(it.Value) == "old" {
						old++
					}
				}
				return old
			}
			require.Zero(t, countOld(), "values from before the keys moved away, served by a client started after they moved back")
			for _, i := range tc.back { // read by now, or by a request after a read that timed out again
				s := serverOf(fresh, ms[i].addr)
				eventually(t, "the record to be read", func() bool { return fresh.lossesKnown(context.Background(), s) })
			}
			if tc.unmarked && tc.late {
				require.Positive(t, waitingGains(fresh), "unmarked, the slots that came back wait")
				eventually(t, "the floors to be taken after the wait", func() bool { return waitingGains(fresh) == 0 })
				require.Zero(t, countOld(), "values from before the keys moved away, served after the wait")
			}
			require.Zero(t, waitingGains(fresh), "the floors applied (at once, or after the wait)")
			away := listOf(t, pick(tc.away)...)
			for _, i := range tc.back {
				e := fresh.gains.of(serverOf(fresh, ms[i].addr), fresh.hash(keyBack(t, ss, away, ms[i].addr, keys)), nil)
				require.NotNil(t, e, "a floor applied at %s", ms[i].addr)
				require.NotEqual(t, uint64(math.MaxUint64), e.floor.Load())
			}
		})
	}
}

// keyBack returns the first of keys that ss routes to addr and away did
// not.
func keyBack(t *testing.T, ss, away *ServerList, addr string, keys []string) string {
	t.Helper()
	for _, k := range keys {
		a, _ := ss.PickServer(k)
		b, _ := away.PickServer(k)
		if a.String() == addr && b.String() != addr {
			return k
		}
	}
	t.Fatalf("no key at %s", addr)
	return ""
}

// TestLossesOfAChange: a change's losses are, for each server of the ring
// before, exactly the slots it no longer owns; a record of them stays
// small; and a Client that learns it (one that saw neither change) floors
// exactly the slots the server owns again, keeping a gain it saw itself.
func TestLossesOfAChange(t *testing.T) {
	var w gainsWorld
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprint("m", i)
	}
	w.change(t, ids...)
	before := w.rt
	w.change(t, append(ids, "new")...) // a scale-up
	require.Len(t, w.losses, len(ids), "every server gives slots to the new one")
	size := 0
	for _, l := range w.losses {
		for _, r := range l.runs {
			for i := r.lo; i <= r.hi; i++ {
				h := uint64(i) << (64 - slotBits)
				require.Same(t, l.s, before.owner(h))
				require.Same(t, w.srv["new"], w.rt.owner(h))
			}
		}
		rec := lostRecord{start: 1, runs: l.runs}
		for i := range rec.runs {
			rec.runs[i].floor = 1 << 33
		}
		size = max(size, len(rec.encode()))
	}
	t.Logf("the largest record of a scale-up from %d servers: %d bytes", len(ids), size)
	require.Less(t, size, 8<<10)

	m0 := w.srv["m0"]
	rec := lostRecord{start: 1, runs: slices.Clone(w.losses[slices.IndexFunc(w.losses, func(l loss) bool { return l.s == m0 })].runs)}
	for i := range rec.runs {
		rec.runs[i].floor = 500
	}
	w.change(t, ids...) // the scale-down: m0 owns its slots again

	var unmarked gains // a Client that saw neither change, and finds no marks
	waiting := unmarked.learn(m0, w.rt, rec, nil)
	require.Len(t, waiting, 1, "one floor, not marked: its gain waits")
	h0 := uint64(rec.runs[0].lo) << (64 - slotBits)
	require.Same(t, waiting[0], unmarked.of(m0, h0, nil))
	require.Equal(t, uint64(math.MaxUint64), waiting[0].floor.Load(), "none of m0's values served or deleted")
	require.Nil(t, unmarked.pending(m0, h0), "a write does not take a floor in its place")
	settle(waiting)
	require.Equal(t, uint64(500), waiting[0].floor.Load(), "settled: the floor learned")

	var fresh gains // a Client that saw neither change, and finds the slots marked
	require.Empty(t, fresh.learn(m0, w.rt, rec, rec.runs))
	floored, other := 0, 0
	for _, r := range rec.runs {
		for i := r.lo; i <= r.hi; i++ {
			h := uint64(i) << (64 - slotBits)
			e := fresh.of(m0, h, nil)
			require.NotNil(t, e, "slot %d: m0 lost it and owns it again", i)
			require.Equal(t, uint64(500), e.floor.Load())
			floored++
		}
	}
	for i := uint64(0); i < 1<<slotBits; i += 4099 {
		h := i << (64 - slotBits)
		if floorAt(rec.runs, uint32(i)) == 0 && fresh.of(m0, h, nil) != nil {
			other++
		}
	}
	require.Zero(t, other, "slots m0 did not lose have no floor")
	t.Logf("%d slots floored", floored)

	// The Client that saw the changes keeps its own, later, gains.
	seen := w.g.of(m0, uint64(rec.runs[0].lo)<<(64-slotBits), w.rt.past)
	require.NotNil(t, seen)
	was := seen.floor.Load()
	w.g.learn(m0, w.rt, rec, rec.runs)
	require.Same(t, seen, w.g.of(m0, uint64(rec.runs[0].lo)<<(64-slotBits), w.rt.past))
	require.Equal(t, was, seen.floor.Load())
}

// TestLossNotedByManyClients: the clients that see a change all write the
// loss at once (200 application pods); each ends within its bound, by
// writing or by finding its slots covered by a later floor, and the
// record holds each slot, with a floor below the server's CAS ids since.
func TestLossNotedByManyClients(t *testing.T) {
	ms := startMemcached(t, 1)
	l := loss{runs: []lostRun{{lo: 10, hi: 20}, {lo: 1000, hi: 5000}}}
	var clients []*Client
	for range 40 {
		c, _ := newTestClient(t, addrsOf(ms))
		clients = append(clients, c)
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*c.cfg.conn.timeout)
			defer cancel()
			errs[i] = c.noteLoss(ctx, loss{s: serverOf(c, ms[0].addr), runs: l.runs}, i%2 == 0)
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "client %d", i)
	}
	last, err := clients[0].casNow(context.Background(), serverOf(clients[0], ms[0].addr))
	require.NoError(t, err)
	it, err := direct(ms[0].addr).Get(lostKey)
	require.NoError(t, err)
	rec, err := decodeLost(it.Value)
	require.NoError(t, err)
	require.Len(t, rec.runs, 2)
	for i, r := range rec.runs {
		require.Equal(t, l.runs[i].lo, r.lo)
		require.Equal(t, l.runs[i].hi, r.hi)
		require.Less(t, r.floor, last)
	}
	t.Logf("floor %d, %d after", rec.runs[0].floor, last)
}

func TestCovers(t *testing.T) {
	have := []lostRun{{1, 10, 5}, {11, 20, 7}, {30, 40, 2}}
	for _, tc := range []struct {
		name string
		want []lostRun
		ok   bool
	}{
		{"inside one run", []lostRun{{2, 3, 0}}, true},
		{"across two runs that touch", []lostRun{{5, 15, 0}}, true},
		{"several", []lostRun{{1, 1, 0}, {20, 20, 0}, {35, 40, 0}}, true},
		{"a gap", []lostRun{{18, 32, 0}}, false},
		{"past the end", []lostRun{{38, 41, 0}}, false},
		{"before the start", []lostRun{{0, 0, 0}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.ok, covers(have, tc.want)) })
	}
	require.False(t, covers(nil, []lostRun{{1, 1, 0}}), "no record")
}

// TestWaitingFloorsAtTheNextChange: a Client started as slots came back
// to a server, before any Client marked them, lets their floors wait. If
// the slots leave again before the wait ends, the floors are kept for the
// past ring where they were marked meanwhile (the loss was followed by a
// return), so that no value from before the first loss is handed off; and
// dropped where they were not (the loss it learned is this change's).
func TestWaitingFloorsAtTheNextChange(t *testing.T) {
	for _, tc := range []struct {
		name            string
		markedMeanwhile bool
		scaleUp         bool // the next change adds a server (it keeps some of the slots), or removes it again
		oldServed       bool
	}{
		{"it leaves again, marked meanwhile", true, false, false},
		{"it leaves again, unmarked", false, false, true}, // the limit docs/consistency.md states
		{"a scale-up, unmarked", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			markedMeanwhile := tc.markedMeanwhile
			ms := startMemcached(t, 4)
			spare := ms[3].addr
			ms = ms[:3]
			all, away := addrsOf(ms), addrsOf(ms[:2])
			c, ss := newTestClient(t, all, WithHandoff(Handoff{Window: 100 * time.Millisecond}), WithMoves(Moves{Rate: -1}))
			change := func(cl *Client, addrs []string, what string) {
				require.NoError(t, ss.SetServers(addrs...))
				eventually(t, what, func() bool {
					rt := cl.rt.Load()
					return rt.base == ss.ring.Load() && len(rt.liveSrv) == len(addrs)
				})
			}
			keys := keysOf(t, ss, ms[2].addr, 100)
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("old")}))
			}
			change(c, away, "the keys to move away")
			time.Sleep(200 * time.Millisecond) // past the handoff window
			for _, k := range keys {
				require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
			}
			change(c, all, "the keys to move back")
			time.Sleep(time.Second) // the second passes of the changes ran, and marked again what they raised (see remark)
			eventually(t, "the return to be marked", func() bool { return allMarked(t, ms[2].addr) })
			require.NoError(t, c.Close()) // it marks no more (its second passes mark again: see remark)
			marks, err := direct(ms[2].addr).Get(backKey)
			require.NoError(t, err)
			require.NoError(t, direct(ms[2].addr).Delete(backKey)) // as if the new client came before any mark

			slow := Option(func(o *options) { o.client.learnWait = time.Hour })
			fresh := lateLearner(t, ss, ms[2:3], WithHandoff(Handoff{Window: time.Minute}), slow)
			for _, k := range keys {
				_, err := fresh.Get(k)
				require.ErrorIs(t, err, memcache.ErrCacheMiss, "%s: its slot waits", k)
			}
			s2 := serverOf(fresh, ms[2].addr)
			eventually(t, "the record to be read", func() bool { return fresh.lossesKnown(context.Background(), s2) })
			require.Positive(t, waitingGains(fresh))
			if markedMeanwhile {
				require.NoError(t, direct(ms[2].addr).Set(marks))
			}
			next := away
			if tc.scaleUp {
				next = append(addrsOf(ms), spare)
			}
			change(fresh, next, "the new client to see the keys move away again")
			for _, k := range keys {
				a, err := ss.PickServer(k)
				require.NoError(t, err)
				if err := direct(a.String()).Delete(k); !errors.Is(err, memcache.ErrCacheMiss) {
					require.NoError(t, err) // evicted at the owner: a read hands off from ms[2]
				}
			}
			old := 0
			for _, k := range keys {
				if it, err := fresh.Get(k); err == nil && string(it.Value) == "old" {
					old++
				}
			}
			if tc.oldServed {
				// The limit docs/consistency.md states ("A return no
				// Client could mark").
				require.Positive(t, old, "unmarked, and every slot lost again: the floors dropped")
			} else {
				require.Zero(t, old, "values from before the first loss, handed off")
			}
		})
	}
}

// lateLearner returns a Client of ss whose first read of the records of
// the servers stopped failed (they are hung, SIGSTOP, as it starts): it
// reads them late, once they answer again, as a Client whose first read
// timed out on a loaded machine does.
func lateLearner(t *testing.T, ss *ServerList, stopped []*memcached, opt ...Option) *Client {
	t.Helper()
	for _, m := range stopped {
		m.signal(syscall.SIGSTOP)
	}
	opt = append([]Option{WithSlog(slog.New(slog.DiscardHandler)), fastFailover, WithTimeout(100 * time.Millisecond), WithMoves(Moves{Rate: -1})}, opt...)
	c, err := NewClientFromList(ss, opt...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	for _, m := range stopped {
		s := serverOf(c, m.addr)
		require.Eventually(t, func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return s.learning == nil
		}, time.Minute, time.Millisecond, "the first read of %s's record to fail", m.addr)
		require.False(t, s.lossesKnown.Load())
		m.signal(syscall.SIGCONT)
	}
	for _, m := range stopped {
		eventually(t, "the stopped server to be back", func() bool { return stateOf(c, m.addr).State == ServerUp })
	}
	return c
}

// allMarked reports whether every floor of the record of lost slots at
// addr is marked as past (see backKey).
func allMarked(t *testing.T, addr string) bool {
	t.Helper()
	var recs [2]lostRecord
	for i, k := range []string{lostKey, backKey} {
		it, err := direct(addr).Get(k)
		if errors.Is(err, memcache.ErrCacheMiss) {
			return false
		}
		require.NoError(t, err)
		recs[i], err = decodeLost(it.Value)
		require.NoError(t, err)
	}
	for _, r := range marked(recs[0].runs, recs[1].runs) {
		if !r.back {
			return false
		}
	}
	return recs[0].start == recs[1].start
}
