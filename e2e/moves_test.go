package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Moves at scale (issues 20 and 28): pods of 200,000 keys each (E2E_MOVES_PER_POD
// sets another number: make bench-e2e runs 1,000,000), of which 1% are
// read during a rolling restart.
var (
	mvPerPod   = envInt("E2E_MOVES_PER_POD", 200_000)
	mvKeys     = mvPods * mvPerPod
	mvMemoryMB = max(64, mvPerPod/4000) // memcached's -m: about 150 bytes an item, with room
)

const (
	mvPods      = 3
	mvValue     = 32  // bytes a value
	mvHotEvery  = 100 // one key in 100 is read during the roll
	mvReaders   = 8
	mvGrace     = 120 * time.Second // the pods' terminationGracePeriodSeconds: what bounds the preStop
	mvDrained   = 6                 // items a drained pod may hold: the mover's claims, a few rounds' worth, and its record of lost slots
	mvSettle    = 2 * time.Second
	mvFillers   = 32
	mvCheckSize = 500 // keys a GetMulti when counting
)

func mvKey(i int) string { return "mv-" + strconv.Itoa(i) }

func mvValueOf(i int) []byte {
	v := make([]byte, mvValue)
	copy(v, strconv.Itoa(i))
	return v
}

// TestClientMovesAtScale: 3 pods of 200,000 keys each, a rolling restart
// (maxSurge 1: a new pod joins, then an old one terminates) in which each
// terminating pod's preStop waits until the pod holds no keys (the Client
// moves them out, and deletes them there) or the grace period ends, then a
// scale-up from 3 to 4 pods. Only 1% of the keys are read meanwhile, by
// cache-aside readers through the same Client. Counted after the roll and
// after the scale-up: the keys found, of all; and the items the servers
// hold, against the keys (a key held twice would count twice). Measured:
// the mover's keys/s and MB/s, each preStop's time, and the readers' p99
// during the roll against before.
func TestClientMovesAtScale(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, mvPods, podOpts{prefix: "big", memoryMB: mvMemoryMB})
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	sel := e.newSelClient(l)

	start := time.Now()
	fillMoveKeys(t, sel)
	t.Logf("moves at scale: %d keys of %d bytes set in %v", mvKeys, mvValue, time.Since(start).Round(time.Millisecond))

	rd := &hotReaders{c: sel}
	stop := rd.run(e.ctx)
	defer stop()
	time.Sleep(3 * time.Second)
	before := rd.phase()

	var drains []time.Duration
	for i := range mvPods {
		oldPod := pods[0]
		newPod := e.runPods(mvPods+i, 1, podOpts{prefix: "big", memoryMB: mvMemoryMB})[0]
		pods = append(pods[1:], newPod)
		l.waitServers(t, append(addrs(pods, 11211), oldPod.Addr(11211)), cRingWait)
		time.Sleep(time.Second) // the Deployment waits for the new pod's readiness, not for moves
		require.NoError(t, oldPod.Delete(e.ctx))
		l.waitServers(t, addrs(pods, 11211), cRingWait)
		d, items := preStopUntilDrained(t, oldPod.Addr(11211))
		drains = append(drains, d)
		t.Logf("moves at scale: step %d: %s drained to %d items in %v", i+1, oldPod.Name, items, d.Round(time.Millisecond))
		require.NoError(t, oldPod.ForceDelete(e.ctx))
	}
	// The survivors' keys that the new pods own move after the last
	// terminating pod's: wait for the last round.
	waitMovesDone(t, sel)
	during := rd.phase()
	afterRoll, wrong := countMoveKeys(t, sel)
	heldRoll := itemsAt(t, addrs(pods, 11211))

	rounds := sel.Stats().Moves.Rounds
	pods = append(pods, e.runPods(2*mvPods, 1, podOpts{prefix: "big", memoryMB: mvMemoryMB})[0])
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	require.Eventually(t, func() bool { return sel.Stats().Moves.Rounds > rounds }, mvGrace, 100*time.Millisecond, "the scale-up's round")
	waitMovesDone(t, sel)
	scale := rd.phase()
	stop()
	afterScale, wrongScale := countMoveKeys(t, sel)
	heldScale := itemsAt(t, addrs(pods, 11211))

	mv := sel.Stats().Moves
	keysPerSec := float64(mv.Moved) / mv.Took.Seconds()
	mbPerSec := keysPerSec * float64(mvValue+len(mvKey(mvKeys/2))) / 1e6
	var drainStr []string
	for _, d := range drains {
		drainStr = append(drainStr, d.Round(100*time.Millisecond).String())
	}
	t.Logf("moves at scale: after the roll %d of %d keys found (%.3f%%), %d wrong, %d items at the servers; after the scale-up %d found (%.3f%%), %d wrong, %d items",
		afterRoll, mvKeys, 100*float64(afterRoll)/float64(mvKeys), wrong, heldRoll, afterScale, 100*float64(afterScale)/float64(mvKeys), wrongScale, heldScale)
	t.Logf("moves at scale: the mover: %d rounds, %d servers listed, %d keys listed, %d moved, %d left, in %v: %.0f keys/s, %.2f MB/s; preStop per step %s",
		mv.Rounds, mv.Sources, mv.Listed, mv.Moved, mv.Left, mv.Took.Round(time.Millisecond), keysPerSec, mbPerSec, strings.Join(drainStr, " "))
	t.Logf("moves at scale: readers of 1%% of the keys: hit rate before %.2f%%, during the roll %.2f%%, during the scale-up %.2f%%; p99 before %v, during the roll %v (%.2fx), during the scale-up %v (%.2fx); errors %d",
		100*before.hitRate(), 100*during.hitRate(), 100*scale.hitRate(), before.p99, during.p99, float64(during.p99)/float64(before.p99),
		scale.p99, float64(scale.p99)/float64(before.p99), before.errs+during.errs+scale.errs)
	report(t, "### Client: moves at scale: a rolling restart of %d pods of %d keys each, then a scale-up to %d\n\n", mvPods, mvPerPod, mvPods+1)
	report(t, "Each terminating pod's preStop waits until the pod holds no keys (the Client moves them out) or its grace period of %v ends; only 1%% of the keys are read meanwhile.\n\n", mvGrace)
	report(t, "| | keys found | items at the servers | readers' hit rate | readers' p99 |\n|---|---|---|---|---|\n")
	report(t, "| before | %d | | %.2f%% | %v |\n", mvKeys, 100*before.hitRate(), before.p99)
	report(t, "| after the roll | %d (%.3f%%) | %d | %.2f%% | %v (%.2fx) |\n", afterRoll, 100*float64(afterRoll)/float64(mvKeys), heldRoll, 100*during.hitRate(), during.p99, float64(during.p99)/float64(before.p99))
	report(t, "| after the scale-up | %d (%.3f%%) | %d | %.2f%% | %v (%.2fx) |\n\n", afterScale, 100*float64(afterScale)/float64(mvKeys), heldScale, 100*scale.hitRate(), scale.p99, float64(scale.p99)/float64(before.p99))
	report(t, "The mover (one Client): %d keys moved in %v, %.0f keys/s, %.2f MB/s; each terminating pod drained in %s.\n\n",
		mv.Moved, mv.Took.Round(time.Millisecond), keysPerSec, mbPerSec, strings.Join(drainStr, ", "))

	assert.GreaterOrEqual(t, float64(afterRoll)/float64(mvKeys), 0.999, "keys found after the roll")
	assert.Equal(t, afterRoll, afterScale, "every key found before the scale-up is found after it")
	assert.Zero(t, wrong+wrongScale, "values read back wrong")
	assert.LessOrEqual(t, heldScale, afterScale+mvDrained*len(pods), "each key held once, at its owner (the rest are the mover's claims)")
	assert.Zero(t, before.errs+during.errs+scale.errs, "readers' errors")
	for i, d := range drains {
		assert.Less(t, d, mvGrace, "step %d: the terminating pod drained within its grace period", i+1)
	}
}

// fillMoveKeys sets the mvKeys keys through c.
func fillMoveKeys(t *testing.T, c *selector.Client) {
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range mvFillers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < mvKeys; i = int(next.Add(1) - 1) {
				if c.Set(&memcache.Item{Key: mvKey(i), Value: mvValueOf(i)}) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "sets failed")
}

// countMoveKeys reads every key through c: the number found with their
// value, and of a wrong value.
func countMoveKeys(t *testing.T, c *selector.Client) (found, wrong int) {
	t.Helper()
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	var errs atomic.Int64
	for range 8 {
		wg.Go(func() {
			for b := int(next.Add(1) - 1); b*mvCheckSize < mvKeys; b = int(next.Add(1) - 1) {
				var ks []string
				for i := b * mvCheckSize; i < min((b+1)*mvCheckSize, mvKeys); i++ {
					ks = append(ks, mvKey(i))
				}
				got, err := c.GetMulti(ks)
				if err != nil {
					errs.Add(1)
					continue
				}
				f, w := 0, 0
				for i := b * mvCheckSize; i < min((b+1)*mvCheckSize, mvKeys); i++ {
					switch it := got[mvKey(i)]; {
					case it == nil:
					case string(it.Value) == string(mvValueOf(i)):
						f++
					default:
						w++
					}
				}
				mu.Lock()
				found, wrong = found+f, wrong+w
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Zero(t, errs.Load(), "GetMulti errors while counting")
	return found, wrong
}

// preStopUntilDrained is a preStop hook that waits until the memcached at
// addr holds at most mvDrained items, or the grace period ends: it returns
// how long it waited, and the items left.
func preStopUntilDrained(t *testing.T, addr string) (time.Duration, int) {
	t.Helper()
	start := time.Now()
	for {
		n := itemsAt(t, []string{addr})
		if n <= mvDrained || time.Since(start) > mvGrace {
			return time.Since(start), n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// itemsAt is the sum of memcached's curr_items over addrs.
func itemsAt(t *testing.T, addrs []string) int {
	t.Helper()
	total := 0
	for _, a := range addrs {
		st, err := mcStat(a)
		require.NoError(t, err, "stats of %s", a)
		total += int(st["curr_items"])
	}
	return total
}

// waitMovesDone waits until the movers of cs are done (MoveStats: none
// Busy; keys Pending then are left, not tried again) and have moved
// nothing for mvSettle. A quiet spell
// alone is not the end: a client whose claim of a server failed (a timeout
// under load) tries again after the claim's expiration, and 1,616 keys
// moved after the test had counted (TestClientMovesManyClients on a loaded
// machine).
func waitMovesDone(t *testing.T, cs ...*selector.Client) {
	t.Helper()
	totals := func() (all selector.MoveStats) {
		for _, c := range cs {
			st := c.Stats().Moves
			all.Rounds += st.Rounds
			all.Listed += st.Listed
			all.Moved += st.Moved
			all.Left += st.Left
			all.Claimed += st.Claimed
			all.Pending += st.Pending
			all.Busy = all.Busy || st.Busy
		}
		return all
	}
	last, since := totals(), time.Now()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Since(since) < mvSettle || last.Busy {
		require.True(t, time.Now().Before(deadline), "moves still running after 5 minutes: %+v", last)
		time.Sleep(100 * time.Millisecond)
		if now := totals(); now != last {
			last, since = now, time.Now()
		}
	}
}

// hotReaders read the keys one in mvHotEvery, as cache-aside: a miss sets
// the key's value. Each phase counts hits, misses, errors and the p99 of
// the Gets.
type hotReaders struct {
	c    *selector.Client
	mu   sync.Mutex
	lat  []time.Duration
	hits int
	miss int
	errs int
}

type readPhase struct {
	hits, miss, errs int
	p99              time.Duration
}

func (p readPhase) hitRate() float64 { return float64(p.hits) / float64(max(p.hits+p.miss, 1)) }

func (r *hotReaders) run(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range mvReaders {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := rand.IntN(mvKeys/mvHotEvery) * mvHotEvery
				start := time.Now()
				it, err := r.c.Get(mvKey(i))
				d := time.Since(start)
				if err == memcache.ErrCacheMiss {
					err = r.c.Set(&memcache.Item{Key: mvKey(i), Value: mvValueOf(i)})
				}
				r.mu.Lock()
				r.lat = append(r.lat, d)
				switch {
				case err != nil:
					r.errs++
				case it == nil:
					r.miss++
				default:
					r.hits++
				}
				r.mu.Unlock()
				time.Sleep(time.Millisecond) // a service's pace, not a benchmark's
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// phase returns the counts since the last phase, and resets them.
func (r *hotReaders) phase() readPhase {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := readPhase{hits: r.hits, miss: r.miss, errs: r.errs}
	if len(r.lat) > 0 {
		slices.Sort(r.lat)
		p.p99 = r.lat[len(r.lat)*99/100]
	}
	r.lat, r.hits, r.miss, r.errs = nil, 0, 0, 0
	return p
}

// moveCopies counts the copies a Client's mover made (see
// selector.HandoffEvent).
type moveCopies struct {
	selector.NopMetrics
	n       atomic.Int64 // copied
	present atomic.Int64 // found at the owner already (a copy whose reply was lost, moved again)
}

func (m *moveCopies) Handoff(ev selector.HandoffEvent) {
	switch {
	case ev.Cause != "move":
	case ev.Result == "copied":
		m.n.Add(1)
	case ev.Result == "present":
		m.present.Add(1)
	}
}

// TestClientMovesManyClients: 200 Clients, each with a ServerList and a
// watch of its own, over 3 pods holding 30,000 keys, see a scale-up to 4
// pods. One moves each old pod's keys: each key that the new pod owns is
// copied once, by all 200 together, as each Client's metrics count.
func TestClientMovesManyClients(t *testing.T) {
	const clients, keys = 200, 30000
	e := newEnv(t)
	pods := e.runPods(0, mvPods, podOpts{prefix: "many"})
	var cs []*selector.Client
	var recs []*moveCopies
	var libs []*lib
	for range clients {
		l := e.mustLib(serviceName + ":11211")
		rec := &moveCopies{}
		libs, recs = append(libs, l), append(recs, rec)
		cs = append(cs, e.newSelClient(l, selector.WithMetrics(rec)))
	}
	for _, l := range libs {
		l.waitServers(t, addrs(pods, 11211), cRingWait)
	}
	key := func(i int) string { return "many-" + strconv.Itoa(i) }
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < keys; i += 16 {
				assert.NoError(t, cs[i%clients].Set(&memcache.Item{Key: key(i), Value: []byte(key(i))}))
			}
		})
	}
	wg.Wait()
	var was []string
	for i := range keys {
		a, err := libs[0].PickServer(key(i))
		require.NoError(t, err)
		was = append(was, a.String())
	}

	// A client whose first view had fewer pods moved (nothing) when it saw
	// them all: only the scale-up's moves are counted.
	waitMovesDone(t, cs...)
	before := make([]selector.MoveStats, clients)
	var copiesBefore, presentBefore int64
	for i, c := range cs {
		before[i] = c.Stats().Moves
		copiesBefore += recs[i].n.Load()
		presentBefore += recs[i].present.Load()
	}
	pods = append(pods, e.runPods(mvPods, 1, podOpts{prefix: "many"})[0])
	for _, l := range libs {
		l.waitServers(t, addrs(pods, 11211), cRingWait)
	}
	moving := 0
	for i := range keys {
		if a, _ := libs[0].PickServer(key(i)); a.String() != was[i] {
			moving++
		}
	}
	require.Eventually(t, func() bool {
		for i, c := range cs {
			if c.Stats().Moves.Rounds == before[i].Rounds {
				return false
			}
		}
		return true
	}, mvGrace, 100*time.Millisecond, "every Client's round")
	var total selector.MoveStats
	copies, present, movers := 0, 0, 0
	waitMovesDone(t, cs...)
	for i, c := range cs {
		st, b := c.Stats().Moves, before[i]
		st.Moved, st.Sources, st.Claimed, st.Left = st.Moved-b.Moved, st.Sources-b.Sources, st.Claimed-b.Claimed, st.Left-b.Left
		total.Moved += st.Moved
		total.Sources += st.Sources
		total.Claimed += st.Claimed
		total.Left += st.Left
		copies += int(recs[i].n.Load())
		present += int(recs[i].present.Load())
		if st.Sources > 0 {
			movers++
		}
	}
	copies -= int(copiesBefore)
	present -= int(presentBefore)
	held := itemsAt(t, addrs(pods, 11211))
	t.Logf("moves, %d clients: %d of %d keys changed owner; copied %d times in all (and %d found copied by a copy whose reply was lost), by %d clients (%d servers listed, %d claims seen, %d keys moved, %d left); %d items at the servers",
		clients, moving, keys, copies, present, movers, total.Sources, total.Claimed, total.Moved, total.Left, held)
	report(t, "### Client: moves, %d clients\n\n%d Clients, each with its own ServerList, see a scale-up from %d to %d pods holding %d keys: %d keys changed owner, and were copied %d times in all, by %d of the clients (%d keys left).\n\n",
		clients, clients, mvPods, mvPods+1, keys, moving, copies, movers, total.Left)
	// A copy whose reply was lost is found at the owner by the next
	// listing's move (present): it was made once all the same. So is a
	// key that a client which took over an expired claim (its holder's
	// renewals timed out, on a loaded machine) finds at its owner, copied
	// by the holder; and a client that waited on a claim lists the server
	// again, finding nothing, once the claim's mark of a finished server
	// expired. On an idle machine: 3 servers listed, each key copied once,
	// none present.
	assert.GreaterOrEqual(t, total.Moved, moving, "each key that changed owner moved")
	assert.LessOrEqual(t, copies, moving, "no key copied twice, by all the clients together")
	assert.GreaterOrEqual(t, copies+present, moving, "each key that changed owner copied")
	assert.GreaterOrEqual(t, total.Sources, mvPods, "each old pod listed")
	assert.LessOrEqual(t, total.Sources, 2*mvPods, "each old pod listed by one client, and by one more at most (a claim taken over)")
	direct := map[string]*memcache.Client{}
	for i := range keys {
		if i%7 != 0 {
			continue
		}
		a, err := libs[0].PickServer(key(i))
		require.NoError(t, err)
		if direct[a.String()] == nil {
			direct[a.String()] = memcache.New(a.String())
		}
		it, err := direct[a.String()].Get(key(i))
		if assert.NoError(t, err, "%s at its owner", key(i)) {
			assert.Equal(t, key(i), string(it.Value))
		}
	}
	assert.LessOrEqual(t, held, keys+mvDrained*len(pods), "each key held once (the rest are the mover's claims)")
}

// envInt returns the number the environment variable name gives, or def.
func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			panic(fmt.Sprintf("%s=%q: give a positive number", name, v))
		}
		return n
	}
	return def
}
