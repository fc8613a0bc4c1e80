package selector

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

func TestMarked(t *testing.T) {
	run := func(lo, hi uint32, f uint64) lostRun { return lostRun{lo, hi, f} }
	m := func(lo, hi uint32, f uint64, back bool) markedRun { return markedRun{run(lo, hi, f), back} }
	for _, tc := range []struct {
		name       string
		runs, back []lostRun
		want       []markedRun
	}{
		{"no marks", []lostRun{run(1, 5, 10)}, nil, []markedRun{m(1, 5, 10, false)}},
		{"marked whole", []lostRun{run(1, 5, 10)}, []lostRun{run(0, 9, 10)}, []markedRun{m(1, 5, 10, true)}},
		{"a mark of an earlier loss", []lostRun{run(1, 5, 10)}, []lostRun{run(0, 9, 9)}, []markedRun{m(1, 5, 10, false)}},
		{"a mark of a later floor", []lostRun{run(1, 5, 10)}, []lostRun{run(1, 5, 11)}, []markedRun{m(1, 5, 10, true)}},
		{"marked in the middle", []lostRun{run(1, 9, 10)}, []lostRun{run(3, 4, 10)},
			[]markedRun{m(1, 2, 10, false), m(3, 4, 10, true), m(5, 9, 10, false)}},
		{"one mark over two runs", []lostRun{run(1, 2, 10), run(5, 6, 20)}, []lostRun{run(2, 5, 15)},
			[]markedRun{m(1, 1, 10, false), m(2, 2, 10, true), m(5, 6, 20, false)}},
		{"two marks in one run", []lostRun{run(0, 10, 7)}, []lostRun{run(0, 1, 7), run(2, 3, 7), run(9, 20, 7)},
			[]markedRun{m(0, 3, 7, true), m(4, 8, 7, false), m(9, 10, 7, true)}},
		{"marks of other slots", []lostRun{run(5, 6, 7)}, []lostRun{run(0, 4, 9), run(7, 8, 9)}, []markedRun{m(5, 6, 7, false)}},
		{"none", nil, []lostRun{run(0, 4, 9)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, marked(tc.runs, tc.back)) })
	}
}

func TestWithin(t *testing.T) {
	run := func(lo, hi uint32, f uint64) lostRun { return lostRun{lo, hi, f} }
	for _, tc := range []struct {
		name       string
		have, want []lostRun
		out        []lostRun
	}{
		{"disjoint", []lostRun{run(1, 5, 10)}, []lostRun{run(6, 9, 1)}, nil},
		{"inside", []lostRun{run(1, 9, 10)}, []lostRun{run(3, 4, 1)}, []lostRun{run(3, 4, 10)}},
		{"across runs", []lostRun{run(1, 3, 10), run(5, 8, 20)}, []lostRun{run(2, 6, 1)}, []lostRun{run(2, 3, 10), run(5, 6, 20)}},
		{"two wanted in one", []lostRun{run(0, 20, 5)}, []lostRun{run(1, 2, 1), run(8, 30, 1)}, []lostRun{run(1, 2, 5), run(8, 20, 5)}},
		{"none wanted", []lostRun{run(0, 20, 5)}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.out, within(tc.have, tc.want)) })
	}
}

// noteRegain marks the slots a server owns again with the floors its
// record holds of them, merged with the marks there, and none of the
// slots it never lost; marks of an earlier process of the server are
// replaced.
func TestNoteRegain(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	s := serverOf(c, ms[0].addr)
	ctx := context.Background()
	start, err := serverStart(ctx, s, c.cfg.conn)
	require.NoError(t, err)
	marks := func() lostRecord {
		it, err := direct(ms[0].addr).Get(backKey)
		require.NoError(t, err)
		r, err := decodeLost(it.Value)
		require.NoError(t, err)
		return r
	}
	gained := loss{s: s, runs: []lostRun{{lo: 0, hi: 100, floor: 1}}}

	require.NoError(t, c.noteRegain(ctx, gained))
	_, err = direct(ms[0].addr).Get(backKey)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "no record of lost slots: nothing to mark")

	rec := lostRecord{start: start, runs: []lostRun{{10, 20, 50}, {90, 200, 60}}}
	require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: lostKey, Value: rec.encode()}))
	stale := lostRecord{start: start - 1, runs: []lostRun{{0, 5, 99}}} // of a process before a restart
	require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: backKey, Value: stale.encode()}))
	require.NoError(t, c.noteRegain(ctx, gained))
	require.Equal(t, lostRecord{start: start, runs: []lostRun{{10, 20, 50}, {90, 100, 60}}}, marks())

	// Another client's marks, and a later loss of some of the slots.
	rec.runs = []lostRun{{10, 20, 70}, {90, 200, 60}}
	require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: lostKey, Value: rec.encode()}))
	require.NoError(t, c.noteRegain(ctx, loss{s: s, runs: []lostRun{{lo: 15, hi: 150, floor: 1}}}))
	require.Equal(t, lostRecord{start: start, runs: []lostRun{{10, 14, 50}, {15, 20, 70}, {90, 150, 60}}}, marks())
}

// A server that returns from being out for a Client (its members
// unchanged) regains no slot it lost in a change: the Client marks
// nothing, so that a loss another Client wrote there, of a change this one
// has not seen, is not marked as past.
func TestReturnFromOutMarksNothing(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms), WithTimeout(100*time.Millisecond))
	s := serverOf(c, ms[0].addr)
	start, err := serverStart(context.Background(), s, c.cfg.conn)
	require.NoError(t, err)
	rec := lostRecord{start: start, runs: []lostRun{{lo: 0, hi: 1 << 19, floor: 1 << 40}}} // another client's
	require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: lostKey, Value: rec.encode()}))

	ms[0].signal(syscall.SIGSTOP)
	keys := keysOf(t, ss, ms[0].addr, 20)
	eventually(t, "the server to be out", func() bool {
		c.Get(keys[0])
		return stateOf(c, ms[0].addr).State == ServerOut
	})
	ms[0].signal(syscall.SIGCONT)
	eventually(t, "the server to be back", func() bool { return stateOf(c, ms[0].addr).State == ServerUp })
	_, err = direct(ms[0].addr).Get(backKey)
	require.ErrorIs(t, err, memcache.ErrCacheMiss, "a return from out marked a loss as past")

	// A change of members that gives it slots back marks them.
	require.NoError(t, ss.SetServers(ms[1].addr))
	eventually(t, "the change", func() bool { return len(c.rt.Load().baseSrv) == 1 })
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the return to be marked", func() bool { _, err := direct(ms[0].addr).Get(backKey); return err == nil })
}

// The Client's own keys at a server (its records, marks, claims,
// tombstones, probe) are never listed as keys to move, nor counted.
func TestListingSkipsTheClientsOwnKeys(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms[:1]), WithMoves(Moves{Rate: -1}))
	own := []string{lostKey, backKey, claimPrefix + "0123456789abcdef", tombKey("k"), probeKey}
	for _, k := range own {
		require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: k, Value: []byte("x")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the change", func() bool { return c.rt.Load().base == ss.ring.Load() })
	l, err := c.listMovable(context.Background(), serverOf(c, ms[0].addr))
	require.NoError(t, err)
	require.Empty(t, l.keys)
	require.Zero(t, l.ours+l.foreign+l.others, "the Client's own keys counted")
}
