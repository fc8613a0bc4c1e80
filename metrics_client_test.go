package selector

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// minAllocs is the fewest allocations f made a run in 3 rounds: the
// counts are of every goroutine, and a round may catch another's.
func minAllocs(f func()) float64 {
	n := testing.AllocsPerRun(300, f)
	for range 2 {
		n = min(n, testing.AllocsPerRun(300, f))
	}
	return n
}

// The Client's hot path allocates no more with metrics than without: the
// reporting itself allocates nothing, with a counting Metrics on.
func TestMetricsAllocs(t *testing.T) {
	ms := startMemcached(t, 1)
	off, _ := newTestClient(t, addrsOf(ms), WithTimeout(5*time.Second))
	var m countMetrics
	on, _ := newTestClient(t, addrsOf(ms), WithTimeout(5*time.Second), WithMetrics(&m))
	it := &memcache.Item{Key: "alloc-key", Value: []byte("value")}
	require.NoError(t, off.Set(it))
	gm := memcache.New(ms[0].addr)
	for _, tc := range []struct {
		name string
		op   func(c *Client)
		raw  func()
	}{
		{"Get hit", func(c *Client) { c.Get("alloc-key") }, func() { gm.Get("alloc-key") }},
		{"Get miss", func(c *Client) { c.Get("alloc-absent") }, func() { gm.Get("alloc-absent") }},
		{"Set", func(c *Client) { c.Set(it) }, func() { gm.Set(it) }},
	} {
		raw := minAllocs(tc.raw)
		a := minAllocs(func() { tc.op(off) })
		b := minAllocs(func() { tc.op(on) })
		t.Logf("%s: gomemcache %v, without metrics %v, with %v allocs", tc.name, raw, a, b)
		if !raceEnabled { // see raceEnabled
			require.Equal(t, a, b, "%s: allocs with metrics", tc.name)
		}
	}
	require.NotZero(t, m.requests.Load())

	var err error = memcache.ErrCacheMiss
	s := on.rt.Load().owner(on.hash("k"))
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		ctx, st := on.begin(context.Background(), opNameGet)
		on.attempt(ctx, on.rt.Load(), on.hash("k"), s, err, false)
		on.done(ctx, st, &err)
		on.reportFailure(s, timedOut)
	}), "reporting allocates")
}

// requestsOf returns the Request events so far.
func (m *recMetrics) requestsOf() (rs []RequestEvent) {
	m.read(func(m *recMetrics) { rs = slices.Clone(m.requests) })
	for i := range rs {
		rs[i].Duration = 0 // not comparable
	}
	return rs
}

func (m *recMetrics) healthOf(addr string) (hs []HealthEvent) {
	m.read(func(m *recMetrics) {
		for _, h := range m.health {
			if h.Addr == addr {
				hs = append(hs, h)
			}
		}
	})
	return hs
}

// A Client over real memcached reports its operations, with their
// outcomes and keys; a server that dies, with its errors; the keys written
// while it is out, their replay, the keys moved back, and its return.
func TestMetricsClient(t *testing.T) {
	ms := startMemcached(t, 2)
	var m recMetrics
	c, ss := newTestClient(t, addrsOf(ms), WithMetrics(&m))
	keys0 := keysOf(t, ss, ms[0].addr, 5)
	keys1 := keysOf(t, ss, ms[1].addr, 2)

	start := time.Now()
	require.NoError(t, c.Set(&memcache.Item{Key: keys1[0], Value: []byte("v")}))
	_, err := c.Get(keys1[0])
	require.NoError(t, err)
	_, err = c.Get(keys1[1])
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
	require.ErrorIs(t, c.Add(&memcache.Item{Key: keys1[0], Value: []byte("v")}), memcache.ErrNotStored)
	_, err = c.Get("a bad key")
	require.ErrorIs(t, err, memcache.ErrMalformedKey)
	require.NoError(t, c.Delete(keys1[0]))
	took := time.Since(start)
	require.Equal(t, []RequestEvent{
		{Op: opNameSet, Outcome: OutcomeOK},
		{Op: opNameGet, Outcome: OutcomeHit, Hits: 1},
		{Op: opNameGet, Outcome: OutcomeMiss, Misses: 1},
		{Op: opNameAdd, Outcome: OutcomeNotStored},
		{Op: opNameGet, Outcome: OutcomeMalformedKey, Misses: 1},
		{Op: opNameDelete, Outcome: OutcomeOK},
	}, m.requestsOf())
	m.read(func(m *recMetrics) {
		var sum time.Duration
		for _, r := range m.requests {
			require.Positive(t, r.Duration)
			sum += r.Duration
		}
		require.LessOrEqual(t, sum, took)
	})

	ms[0].kill()
	_, err = c.Get(keys0[0]) // fails over: a miss at ms[1]
	require.ErrorIs(t, err, memcache.ErrCacheMiss)
	m.read(func(m *recMetrics) {
		// A pooled connection that the kill broke may be tried first (the
		// Client's first contact with a server opens two: a request's and
		// the read of its record of lost slots).
		errs := m.serverErrs
		if len(errs) == 2 && errs[0] == (ServerErrorEvent{Addr: ms[0].addr, Kind: OutcomeBroken}) {
			errs = errs[1:]
		}
		require.Equal(t, []ServerErrorEvent{{Addr: ms[0].addr, Kind: OutcomeUnreachable}}, errs)
	})
	require.Equal(t, RequestEvent{Op: opNameGet, Outcome: OutcomeMiss, Misses: 1}, m.requestsOf()[6])
	require.Equal(t, []HealthEvent{{Addr: ms[0].addr, State: ServerOut, Reason: "unreachable"}}, m.healthOf(ms[0].addr))
	for _, k := range keys0[1:4] {
		require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("new")}))
	}
	m.read(func(m *recMetrics) {
		require.Equal(t, []InvalidationEvent{
			{Addr: ms[0].addr, Kind: InvalidationLogged, Keys: 1},
			{Addr: ms[0].addr, Kind: InvalidationLogged, Keys: 1},
			{Addr: ms[0].addr, Kind: InvalidationLogged, Keys: 1},
		}, m.invalidation)
	})

	ms[0].restart()
	eventually(t, "the server back", func() bool { return stateOf(c, ms[0].addr).State == "up" })
	// Reported just after it is up, and Stats may come in between.
	eventually(t, "the server reported back", func() bool { return len(m.healthOf(ms[0].addr)) == 2 })
	require.Equal(t, []HealthEvent{{Addr: ms[0].addr, State: ServerOut, Reason: "unreachable"}, {Addr: ms[0].addr, State: ServerUp, Reason: "probe"}},
		m.healthOf(ms[0].addr))
	// Its logged keys are deleted in the background once it is back.
	eventually(t, "the replay", func() bool {
		n := 0
		m.read(func(m *recMetrics) { n = len(m.invalidation) })
		return n > 3
	})
	m.read(func(m *recMetrics) {
		require.Equal(t, InvalidationEvent{Addr: ms[0].addr, Kind: InvalidationReplayed, Keys: 3}, m.invalidation[3])
	})

	items, err := c.GetMulti(append(slices.Clone(keys0[1:4]), keys1[1]))
	require.NoError(t, err)
	require.Len(t, items, 3)
	rs := m.requestsOf()
	require.Equal(t, RequestEvent{Op: opNameGetMulti, Outcome: OutcomeHit, Hits: 3, Misses: 1}, rs[len(rs)-1])
}

// A read that misses at a key's new server and finds it where it was
// reports the copy.
func TestMetricsHandoff(t *testing.T) {
	ms := startMemcached(t, 3)
	var m recMetrics
	c, ss := newTestClient(t, addrsOf(ms[:2]), WithMetrics(&m))
	var keys []string
	for i := range 100 {
		keys = append(keys, fmt.Sprint("h", i))
		require.NoError(t, c.Set(&memcache.Item{Key: keys[i], Value: []byte("v")}))
	}
	require.NoError(t, ss.SetServers(addrsOf(ms)...))
	eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) == 1 })
	moved := 0
	for _, k := range keys {
		if a, _ := ss.PickServer(k); a.String() == ms[2].addr {
			moved++
			_, err := c.Get(k)
			require.NoError(t, err)
		}
	}
	require.Positive(t, moved)
	m.read(func(m *recMetrics) {
		require.Len(t, m.handoffs, moved)
		for _, h := range m.handoffs {
			require.Equal(t, ms[2].addr, h.To)
			require.Equal(t, string(handoffRead), h.Cause)
			require.Equal(t, string(handoffCopied), h.Result)
		}
		require.Equal(t, []RingEvent{{Servers: 2, Added: 2}, {Servers: 3, Added: 1}}, m.rings, "a list filled with SetServers reports to its first Client's Metrics")
	})
}

// A server that fails while the cap on servers out keeps it in is reported
// failing once, and up when it answers.
func TestMetricsKeptIn(t *testing.T) {
	ms := startMemcached(t, 2)
	var m recMetrics
	c, ss := newTestClient(t, addrsOf(ms), WithMetrics(&m), WithTimeout(50*time.Millisecond))
	for _, ms := range ms { // hung: soft failures, which the cap counts
		ms.signal(syscall.SIGSTOP)
	}
	for i := range 30 {
		c.Get(fmt.Sprint("k", i))
	}
	kept := ""
	for _, s := range c.Stats().Servers {
		if s.State == "failing" {
			kept = s.Addr
		}
	}
	require.NotEmpty(t, kept, "a server failing, kept in: %+v", c.Stats())
	require.Equal(t, []HealthEvent{{Addr: kept, State: ServerFailing, Reason: "timeout"}}, m.healthOf(kept))
	for _, ms := range ms {
		ms.signal(syscall.SIGCONT)
	}
	// It is reported up when it answers. A write that times out first (50
	// ms, on a loaded machine) may take it out now that the other is back,
	// and then its probe brings it back: reported out, then up.
	var lastErr error
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last write: %v; reported: %v; stats: %+v", lastErr, m.healthOf(kept), c.Stats().Servers)
		}
	})
	eventually(t, "the server kept in, reported up", func() bool {
		lastErr = c.Set(&memcache.Item{Key: keysOf(t, ss, kept, 1)[0], Value: []byte("v")})
		h := m.healthOf(kept)
		return h[len(h)-1].State == ServerUp
	})
	h := m.healthOf(kept)
	require.Equal(t, HealthEvent{Addr: kept, State: ServerFailing, Reason: "timeout"}, h[0])
	if len(h) == 2 {
		require.Equal(t, HealthEvent{Addr: kept, State: ServerUp, Reason: "answered"}, h[1])
	} else {
		require.Len(t, h, 3, "after its failing report: %v", h)
		require.Equal(t, HealthEvent{Addr: kept, State: ServerOut, Reason: "timeout"}, h[1])
	}
}

// A pool reports each operation once, not once a group too.
func TestMetricsPool(t *testing.T) {
	ms := startMemcached(t, 2)
	var m recMetrics
	members, err := staticMembers(addrsOf(ms))
	require.NoError(t, err)
	ss := new(ServerList)
	_, _, err = ss.update(members)
	require.NoError(t, err)
	c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithPool(Replicated()), WithMetrics(&m))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
	_, err = c.Get("k")
	require.NoError(t, err)
	require.Equal(t, []RequestEvent{{Op: opNameSet, Outcome: OutcomeOK}, {Op: opNameGet, Outcome: OutcomeHit, Hits: 1}}, m.requestsOf())
}

// BenchmarkReport is the cost of reporting one operation, without metrics
// (a nil test) and with countMetrics (two clock reads and the counting).
func BenchmarkReport(b *testing.B) {
	for _, tc := range []struct {
		name string
		m    Metrics
	}{{"metrics=off", nil}, {"metrics=count", &countMetrics{}}} {
		b.Run(tc.name, func(b *testing.B) {
			c := &Client{cfg: clientOptions{metrics: tc.m}}
			var err error = memcache.ErrCacheMiss
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				ctx, st := c.begin(ctx, opNameGet)
				c.done(ctx, st, &err)
			}
		})
	}
}

// traceMetrics records Begin, Step and End as a tracer sees them: Begin
// returns a context that names its operation, and each Step and End is
// recorded with the name its context holds.
type traceMetrics struct {
	NopMetrics
	mu    sync.Mutex
	n     int
	calls []traceCall
}

type traceCall struct {
	what string // "begin", "step" or "end"
	op   int    // the operation the context names; 0 for none
	step StepEvent
	req  RequestEvent
	err  error
}

type opKey struct{}

func (m *traceMetrics) Begin(ctx context.Context, op string) context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	m.calls = append(m.calls, traceCall{what: "begin", op: m.n, req: RequestEvent{Op: op}})
	return context.WithValue(ctx, opKey{}, m.n)
}

func (m *traceMetrics) Step(ctx context.Context, e StepEvent) {
	m.record(traceCall{what: "step", op: opOf(ctx), step: e})
}

func (m *traceMetrics) End(ctx context.Context, e RequestEvent, err error) {
	e.Duration = 0
	m.record(traceCall{what: "end", op: opOf(ctx), req: e, err: err})
}

func (m *traceMetrics) record(c traceCall) { m.mu.Lock(); m.calls = append(m.calls, c); m.mu.Unlock() }

func opOf(ctx context.Context) int { n, _ := ctx.Value(opKey{}).(int); return n }

// take returns the calls so far, and forgets them.
func (m *traceMetrics) take() []traceCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := m.calls
	m.calls = nil
	return cs
}

// steps returns the steps of cs, without their times and errors (see
// StepEvent.Outcome), checking that each has its operation's context.
func steps(t *testing.T, cs []traceCall) []StepEvent {
	t.Helper()
	var ss []StepEvent
	for _, c := range cs {
		if c.what == "step" {
			require.Equal(t, cs[0].op, c.op, "a step without its operation's context: %+v", c)
			c.step.Start, c.step.Duration, c.step.Err = time.Time{}, 0, nil
			ss = append(ss, c.step)
		}
	}
	return ss
}

// What a tracer is given: each operation's Begin, its steps and its End,
// with the context Begin returned, in order; a request's server; a retry
// and a failover when a server dies; a GetMulti's request to each server,
// with its time; a handoff; and in a pool, one operation, not one a group.
func TestMetricsTrace(t *testing.T) {
	ms := startMemcached(t, 3)
	var m traceMetrics
	c, ss := newTestClient(t, addrsOf(ms[:2]), WithMetrics(&m), WithTimeout(2*time.Second))
	k0, k1 := keysOf(t, ss, ms[0].addr, 1)[0], keysOf(t, ss, ms[1].addr, 1)[0]
	require.NoError(t, c.Set(&memcache.Item{Key: k1, Value: []byte("v")}))
	m.take()

	type caller struct{}
	parent := context.WithValue(context.Background(), caller{}, "the caller's")
	var loadCtx context.Context
	for _, tc := range []struct {
		name  string
		op    func() error
		req   RequestEvent
		steps []StepEvent
	}{
		{"Get hit", func() error { _, err := c.GetContext(parent, k1); return err },
			RequestEvent{Op: opNameGet, Outcome: OutcomeHit, Hits: 1},
			[]StepEvent{{Kind: StepRequest, Addr: ms[1].addr, Outcome: OutcomeOK}}},
		{"Get miss", func() error { _, err := c.GetContext(parent, k0); return err },
			RequestEvent{Op: opNameGet, Outcome: OutcomeMiss, Misses: 1},
			[]StepEvent{{Kind: StepRequest, Addr: ms[0].addr, Outcome: OutcomeMiss}}},
		{"Set", func() error { return c.SetContext(parent, &memcache.Item{Key: k0, Value: []byte("v")}) },
			RequestEvent{Op: opNameSet, Outcome: OutcomeOK},
			[]StepEvent{{Kind: StepRequest, Addr: ms[0].addr, Outcome: OutcomeOK}}},
		{"a malformed key", func() error { _, err := c.GetContext(parent, "a bad key"); return err },
			RequestEvent{Op: opNameGet, Outcome: OutcomeMalformedKey, Misses: 1}, nil},
		{"GetOrLoad", func() error {
			_, err := c.GetOrLoad(parent, "load-"+k1, LoadOptions{}, func(ctx context.Context, _ string) (*memcache.Item, error) {
				loadCtx = ctx
				return &memcache.Item{Value: []byte("v")}, nil
			})
			return err
		}, RequestEvent{Op: opNameGetOrLoad, Outcome: OutcomeOK}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			cs := m.take()
			require.GreaterOrEqual(t, len(cs), 2)
			begin, end := cs[0], cs[len(cs)-1]
			require.Equal(t, traceCall{what: "begin", op: begin.op, req: RequestEvent{Op: tc.req.Op}}, begin)
			require.Equal(t, traceCall{what: "end", op: begin.op, req: tc.req, err: err}, end)
			if tc.steps != nil {
				require.Equal(t, tc.steps, steps(t, cs))
			}
		})
	}
	require.Equal(t, "the caller's", loadCtx.Value(caller{}), "the load function's context is the caller's")
	require.NotZero(t, opOf(loadCtx), "the load function's context is Begin's")

	t.Run("GetMulti", func(t *testing.T) {
		before := time.Now()
		_, err := c.GetMulti([]string{k0, k1, "x" + k0})
		require.NoError(t, err)
		cs := m.take()
		var got []StepEvent
		for _, c := range cs {
			if c.what == "step" {
				require.Equal(t, cs[0].op, c.op)
				require.False(t, c.step.Start.Before(before), "a request's start %v", c.step.Start)
				require.Positive(t, c.step.Duration)
				c.step.Start, c.step.Duration = time.Time{}, 0
				got = append(got, c.step)
			}
		}
		slices.SortFunc(got, func(a, b StepEvent) int { return strings.Compare(a.Addr, b.Addr) })
		keys := map[string]int{}
		for _, k := range []string{k0, k1, "x" + k0} {
			a, _ := ss.PickServer(k)
			keys[a.String()]++
		}
		var want []StepEvent
		for _, addr := range addrsOf(ms[:2]) {
			if keys[addr] > 0 {
				want = append(want, StepEvent{Kind: StepRequest, Addr: addr, Keys: keys[addr], Outcome: OutcomeOK})
			}
		}
		slices.SortFunc(want, func(a, b StepEvent) int { return strings.Compare(a.Addr, b.Addr) })
		require.Equal(t, want, got)
		require.Equal(t, traceCall{what: "end", op: cs[0].op, req: RequestEvent{Op: opNameGetMulti, Outcome: OutcomeHit, Hits: 2, Misses: 1}}, cs[len(cs)-1])
	})

	t.Run("a handoff", func(t *testing.T) {
		old := keysOf(t, ss, ms[1].addr, 50)
		for _, k := range old {
			require.NoError(t, c.Set(&memcache.Item{Key: k, Value: []byte("v")}))
		}
		require.NoError(t, ss.SetServers(addrsOf(ms)...))
		eventually(t, "the client to see the new ring", func() bool { return len(c.rt.Load().past) > 0 })
		moved := ""
		for _, k := range old {
			if a, _ := ss.PickServer(k); a.String() == ms[2].addr {
				moved = k
				break
			}
		}
		require.NotEmpty(t, moved)
		m.take()
		_, err := c.Get(moved)
		require.NoError(t, err)
		require.Equal(t, []StepEvent{
			{Kind: StepRequest, Addr: ms[2].addr, Outcome: OutcomeMiss},
			{Kind: StepHandoff, Addr: ms[2].addr, From: ms[1].addr, Outcome: OutcomeOK},
		}, steps(t, m.take()))
	})

	t.Run("a server killed", func(t *testing.T) {
		k := k0 // at ms[0] before the change, and after
		if a, _ := ss.PickServer(k); a.String() != ms[0].addr {
			for _, x := range keysOf(t, ss, ms[0].addr, 20) {
				if a, _ := listOf(t, addrsOf(ms[:2])...).PickServer(x); a.String() == ms[0].addr {
					k = x
					break
				}
			}
		}
		ms[0].kill()
		m.take()
		_, err := c.Get(k) // retried at the dead server, then a failover: a miss at the next
		require.ErrorIs(t, err, memcache.ErrCacheMiss)
		got := steps(t, m.take())
		require.GreaterOrEqual(t, len(got), 3, "%+v", got)
		for _, s := range got[:len(got)-2] {
			require.Equal(t, StepRetry, s.Kind, "%+v", got)
			require.Equal(t, ms[0].addr, s.Addr)
			require.Contains(t, []Outcome{OutcomeUnreachable, OutcomeBroken}, s.Outcome)
		}
		next := got[len(got)-1].Addr
		require.NotEqual(t, ms[0].addr, next)
		require.Equal(t, []StepEvent{
			{Kind: StepFailover, Addr: next, From: ms[0].addr},
			{Kind: StepRequest, Addr: next, Outcome: OutcomeMiss},
		}, got[len(got)-2:])
	})

	t.Run("a pool", func(t *testing.T) {
		members, err := staticMembers(addrsOf(ms[1:]))
		require.NoError(t, err)
		pl := new(ServerList)
		_, _, err = pl.update(members)
		require.NoError(t, err)
		var m traceMetrics
		c, err := NewClientFromList(pl, WithSlog(slog.New(slog.DiscardHandler)), WithPool(Replicated()), WithMetrics(&m))
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
		cs := m.take()
		require.Equal(t, 1, len(slices.DeleteFunc(slices.Clone(cs), func(c traceCall) bool { return c.what != "begin" })), "%+v", cs)
		require.Equal(t, "begin", cs[0].what)
		require.Equal(t, traceCall{what: "end", op: cs[0].op, req: RequestEvent{Op: opNameSet, Outcome: OutcomeOK}}, cs[len(cs)-1])
		var at []string
		for _, s := range steps(t, cs) { // both groups' requests, in the pool's operation
			at = append(at, s.Addr)
		}
		want := addrsOf(ms[1:])
		slices.Sort(at)
		slices.Sort(want)
		require.Equal(t, want, at)
	})
}
