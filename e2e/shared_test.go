package e2e

import (
	"fmt"
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

// Shared servers (issue 26): a plain gomemcache application, with its own
// crc32 hashing over a fixed list of the first 3 pods, shares the
// memcached pods with a Client that scales up, replaces and rolls them.
const (
	shPods     = 3
	shKeys     = 20_000 // each application's
	shPrefix   = "app:" // the Client's keys, and its Moves.Prefix
	shFillers  = 16
	shBatch    = 500 // keys a GetMulti when counting
	shAttempts = 5   // of a GetMulti that failed (a timeout on a loaded machine is not a miss)
	shSamples  = 5   // missing or wrong keys logged
)

func shAppKey(i int) string   { return shPrefix + strconv.Itoa(i) }
func shOtherKey(i int) string { return "other-" + strconv.Itoa(i) }

func shValue(key string, version int) []byte { return []byte(key + ":v" + strconv.Itoa(version)) }

// otherApp is an application of gomemcache alone, as memcache.New(addrs...)
// makes it: crc32 over a fixed list, which never learns of a change.
type otherApp struct {
	ss    memcache.ServerList
	c     *memcache.Client
	owner []string // by key index: the server its hashing picks
	at    map[string]int
}

func newOtherApp(t *testing.T, addrs []string) *otherApp {
	t.Helper()
	a := &otherApp{owner: make([]string, shKeys), at: map[string]int{}}
	require.NoError(t, a.ss.SetServers(addrs...))
	a.c = memcache.NewFromSelector(&a.ss) // what memcache.New(addrs...) is
	a.c.Timeout = 2 * time.Second         // a loaded 2-core machine: counted keys, not latency
	a.c.MaxIdleConns = 8
	for i := range shKeys {
		s, err := a.ss.PickServer(shOtherKey(i))
		require.NoError(t, err)
		a.owner[i] = s.String()
		a.at[s.String()]++
	}
	return a
}

// fill sets every key of the application.
func (a *otherApp) fill(t *testing.T) {
	t.Helper()
	var failed atomic.Int64
	var wg sync.WaitGroup
	for g := range shFillers {
		wg.Go(func() {
			for i := g; i < shKeys; i += shFillers {
				k := shOtherKey(i)
				if a.c.Set(&memcache.Item{Key: k, Value: shValue(k, 1)}) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "the gomemcache application's sets failed")
}

// shCount is what a count of one application's keys found.
type shCount struct {
	expected, found, wrong int
	samples                []string // missing or wrong keys
}

func (c shCount) share() float64 { return float64(c.found) / float64(max(c.expected, 1)) }

func (c shCount) String() string {
	return fmt.Sprintf("%d of %d found (%.3f%%), %d wrong", c.found, c.expected, 100*c.share(), c.wrong)
}

// shGetMulti reads keys with get, again on an error (a timeout under load
// is not a miss): it fails t if every attempt failed.
func shGetMulti(t *testing.T, who string, get func([]string) (map[string]*memcache.Item, error), keys []string) map[string]*memcache.Item {
	var err error
	for range shAttempts {
		var got map[string]*memcache.Item
		if got, err = get(keys); err == nil {
			return got
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("%s: GetMulti of %d keys failed %d times: %v", who, len(keys), shAttempts, err)
	return nil
}

// shCountKeys reads the keys of index in idx (each with key(i)) in batches
// with get, and counts those found with want(i), and wrong.
func shCountKeys(t *testing.T, who string, get func([]string) (map[string]*memcache.Item, error), idx []int,
	key func(int) string, want func(int) []byte, where func(int) string) shCount {
	t.Helper()
	var mu sync.Mutex
	out := shCount{expected: len(idx)}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for b := int(next.Add(1) - 1); b*shBatch < len(idx); b = int(next.Add(1) - 1) {
				part := idx[b*shBatch : min((b+1)*shBatch, len(idx))]
				ks := make([]string, len(part))
				for j, i := range part {
					ks[j] = key(i)
				}
				got := shGetMulti(t, who, get, ks)
				if got == nil {
					continue
				}
				mu.Lock()
				for j, i := range part {
					it := got[ks[j]]
					switch {
					case it != nil && string(it.Value) == string(want(i)):
						out.found++
						continue
					case it != nil:
						out.wrong++
					}
					if len(out.samples) < shSamples {
						s := fmt.Sprintf("%s missing (its server %s)", ks[j], where(i))
						if it != nil {
							s = fmt.Sprintf("%s read %q, want %q (its server %s)", ks[j], it.Value, want(i), where(i))
						}
						out.samples = append(out.samples, s)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// count reads, through the application, each of its keys whose server (by
// its own hashing) is in live.
func (a *otherApp) count(t *testing.T, live []string) shCount {
	t.Helper()
	var idx []int
	for i, s := range a.owner {
		if slices.Contains(live, s) {
			idx = append(idx, i)
		}
	}
	return shCountKeys(t, "the gomemcache application", a.c.GetMulti, idx, shOtherKey,
		func(i int) []byte { return shValue(shOtherKey(i), 1) }, func(i int) string { return a.owner[i] })
}

// shFillClient sets every key of the Client, version 1.
func shFillClient(t *testing.T, c *selector.Client) {
	t.Helper()
	var failed atomic.Int64
	var wg sync.WaitGroup
	for g := range shFillers {
		wg.Go(func() {
			for i := g; i < shKeys; i += shFillers {
				k := shAppKey(i)
				if c.Set(&memcache.Item{Key: k, Value: shValue(k, 1)}) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "the Client's sets failed")
}

// shCountClient reads every key of the Client through it, want(i) the
// value of key i.
func shCountClient(t *testing.T, c *selector.Client, l *lib, want func(int) []byte) shCount {
	t.Helper()
	idx := make([]int, shKeys)
	for i := range idx {
		idx[i] = i
	}
	return shCountKeys(t, "the Client", c.GetMulti, idx, shAppKey, want, func(i int) string {
		if a, err := l.PickServer(shAppKey(i)); err == nil {
			return a.String()
		}
		return "?"
	})
}

// shStep is one change's figures, for the log and the report.
type shStep struct {
	name          string
	other, client shCount
	atOwners      int                // the Client's keys at their owners before it read them
	moves         selector.MoveStats // during the step
	drain         string             // the terminating pod's preStop: what it waited for
}

func shMovesSince(now, before selector.MoveStats) selector.MoveStats {
	return selector.MoveStats{
		Rounds: now.Rounds - before.Rounds, Sources: now.Sources - before.Sources, Claimed: now.Claimed - before.Claimed,
		Refused: now.Refused - before.Refused, Listed: now.Listed - before.Listed, Foreign: now.Foreign - before.Foreign,
		Moved: now.Moved - before.Moved, Left: now.Left - before.Left, Took: now.Took - before.Took,
	}
}

func shMovesString(m selector.MoveStats) string {
	return fmt.Sprintf("rounds %d, servers listed %d, refused %d, claimed %d, keys listed %d, foreign %d, moved %d, left %d",
		m.Rounds, m.Sources, m.Refused, m.Claimed, m.Listed, m.Foreign, m.Moved, m.Left)
}

// shHandoffs counts a Client's handoffs (reads' and the mover's copies)
// by cause and result.
type shHandoffs struct {
	selector.NopMetrics
	mu sync.Mutex
	n  map[string]int
}

func (h *shHandoffs) Handoff(ev selector.HandoffEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[string(ev.Cause)+" "+string(ev.Result)]++
}

func (h *shHandoffs) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k, v := range h.n {
		out = append(out, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// shAtOwners reads each key of the Client directly at its owner (l's
// PickServer): the keys there, and samples of the others.
func shAtOwners(t *testing.T, l *lib) (int, []string) {
	t.Helper()
	byOwner := map[string][]string{}
	for i := range shKeys {
		a, err := l.PickServer(shAppKey(i))
		require.NoError(t, err)
		byOwner[a.String()] = append(byOwner[a.String()], shAppKey(i))
	}
	n := 0
	var samples []string
	for addr, ks := range byOwner {
		c := memcache.New(addr)
		c.Timeout = 2 * time.Second
		for from := 0; from < len(ks); from += shBatch {
			part := ks[from:min(from+shBatch, len(ks))]
			got := shGetMulti(t, "direct "+addr, c.GetMulti, part)
			for _, k := range part {
				if got[k] != nil {
					n++
				} else if len(samples) < shSamples {
					samples = append(samples, k+" not at "+addr)
				}
			}
		}
	}
	return n, samples
}

// shWaitClient waits until the Client routes by the ServerList's change:
// addr is in state want for it. (The Client applies a change a moment
// after the ServerList shows it; a read in between goes by the routing
// before, which serves a key from a terminating server without handing it
// off.)
func shWaitClient(t *testing.T, c *selector.Client, addr, want string) {
	t.Helper()
	_, err := waitState(c, addr, want, time.Now(), cRingWait)
	require.NoError(t, err)
}

// shClientKeysAt reads every key of the Client directly at addr: how
// many it holds.
func shClientKeysAt(t *testing.T, addr string) int {
	t.Helper()
	c := memcache.New(addr)
	c.Timeout = 2 * time.Second
	n := 0
	for from := 0; from < shKeys; from += shBatch {
		ks := make([]string, 0, shBatch)
		for i := from; i < min(from+shBatch, shKeys); i++ {
			ks = append(ks, shAppKey(i))
		}
		n += len(shGetMulti(t, "direct "+addr, c.GetMulti, ks))
	}
	return n
}

// preStopUntilNoClientKeys is a preStop hook that waits until the
// memcached at addr holds none of the Client's keys (the mover moved them
// out; the gomemcache application's, and the Client's claims, stay), or
// the grace period ends: it returns how long it waited, the Client's keys
// left, and the items left.
func preStopUntilNoClientKeys(t *testing.T, addr string) (time.Duration, int, int) {
	t.Helper()
	start := time.Now()
	for {
		n := shClientKeysAt(t, addr)
		if n == 0 || time.Since(start) > mvGrace {
			return time.Since(start), n, itemsAt(t, []string{addr})
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// liveOf returns the addresses of addrs that are in pods.
func liveOf(all []string, pods []string) []string {
	var out []string
	for _, a := range all {
		if slices.Contains(pods, a) {
			out = append(out, a)
		}
	}
	return out
}

// TestClientSharedServers: a gomemcache application (memcache.New over the
// first 3 pods' addresses: crc32, a fixed list) and a Client share the
// memcached pods, each with 20,000 keys; the Client's pods change. The
// gomemcache application must find every key of its own whose server is
// still up, after every change (the mover never moves its keys), and the
// Client >= 99.9% of its own, none wrong.
//
// With Moves.Prefix the Client scales up from 3 to 4 pods, replaces one
// of the shared pods (a new pod joins; the old one's preStop waits until
// it holds only the other application's keys), and rolls two more pods
// (one it alone used, one shared). Without it, the mover refuses the
// shared servers, and the Client's keys move when read.
func TestClientSharedServers(t *testing.T) {
	t.Run("prefix", testSharedPrefix)
	t.Run("noprefix", testSharedNoPrefix)
}

func testSharedPrefix(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, shPods, podOpts{prefix: "shp"})
	shared := addrs(pods, 11211)
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, shared, cRingWait)
	hs := &shHandoffs{}
	sel := e.newSelClient(l, selector.WithMoves(selector.Moves{Prefix: shPrefix}), selector.WithMetrics(hs))
	app := newOtherApp(t, shared)
	start := time.Now()
	shFillClient(t, sel)
	app.fill(t)
	t.Logf("shared servers, prefix: %d keys of the Client (%q...) and %d of a gomemcache application (other-...) set in %v; the application's per server: %v",
		shKeys, shPrefix, shKeys, time.Since(start).Round(time.Millisecond), app.at)
	v1 := func(i int) []byte { return shValue(shAppKey(i), 1) }

	var steps []shStep
	check := func(name, drain string, before selector.MoveStats) {
		t.Helper()
		st := shStep{name: name, drain: drain, moves: shMovesSince(sel.Stats().Moves, before)}
		st.other = app.count(t, liveOf(shared, addrs(pods, 11211)))
		var notAt []string
		st.atOwners, notAt = shAtOwners(t, l) // where the mover put them: before the Client's reads hand any off
		st.client = shCountClient(t, sel, l, v1)
		steps = append(steps, st)
		t.Logf("shared servers, prefix: %s: gomemcache application %v; Client %v, %d at their owners before it read them; mover: %s; handoffs so far: %v",
			name, st.other, st.client, st.atOwners, shMovesString(st.moves), hs)
		assert.GreaterOrEqual(t, float64(st.atOwners)/shKeys, 0.999, "%s: the Client's keys at their owners, moved there by the mover (e.g. %v)", name, notAt)
		assert.Equal(t, st.other.expected, st.other.found, "%s: the gomemcache application's keys on its surviving servers, all found (e.g. %v)", name, st.other.samples)
		assert.Zero(t, st.other.wrong, "%s: the gomemcache application's values read back wrong", name)
		assert.GreaterOrEqual(t, st.client.share(), 0.999, "%s: the Client's keys found (e.g. %v)", name, st.client.samples)
		assert.Zero(t, st.client.wrong, "%s: the Client's values read back wrong (e.g. %v)", name, st.client.samples)
		assert.Zero(t, st.moves.Refused, "%s: servers the mover refused (with Moves.Prefix, none)", name)
	}

	// The scale-up from 3 to 4.
	before := sel.Stats().Moves
	pods = append(pods, e.runPods(shPods, 1, podOpts{prefix: "shp"})[0])
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	shWaitClient(t, sel, pods[shPods].Addr(11211), "up")
	require.Eventually(t, func() bool { return sel.Stats().Moves.Rounds > before.Rounds }, mvGrace, 100*time.Millisecond, "the scale-up's round")
	waitMovesDone(t, sel)
	check(fmt.Sprintf("scale-up to %d", len(pods)), "", before)
	require.Positive(t, steps[0].moves.Moved, "the scale-up moved the Client's keys")
	require.Positive(t, steps[0].moves.Foreign, "the listings counted the gomemcache application's keys as foreign")

	// A replace (a new pod joins, then an old one terminates, its preStop
	// waiting until the Client's keys left it: it keeps the gomemcache
	// application's), then rolling steps, the same way.
	next := shPods + 1
	replace := func(name string, old int) {
		t.Helper()
		before := sel.Stats().Moves
		oldPod := pods[old]
		oldAddr := oldPod.Addr(11211)
		newPod := e.runPods(next, 1, podOpts{prefix: "shp"})[0]
		next++
		pods = append(slices.Delete(slices.Clone(pods), old, old+1), newPod)
		l.waitServers(t, append(addrs(pods, 11211), oldAddr), cRingWait)
		shWaitClient(t, sel, newPod.Addr(11211), "up")
		time.Sleep(time.Second) // the Deployment waits for the new pod's readiness, not for moves
		require.NoError(t, oldPod.Delete(e.ctx))
		l.waitServers(t, addrs(pods, 11211), cRingWait)
		shWaitClient(t, sel, oldAddr, "gone")
		keep := app.at[oldAddr] // 0 where the application never wrote
		d, left, items := preStopUntilNoClientKeys(t, oldAddr)
		drain := fmt.Sprintf("%s: %d of the Client's keys left in %v; %d items (%d of them the gomemcache application's)", oldPod.Name, left, d.Round(time.Millisecond), items, keep)
		t.Logf("shared servers, prefix: %s: preStop: %s", name, drain)
		assert.Zero(t, left, "%s: the terminating pod drained of the Client's keys within its grace period", name)
		assert.LessOrEqual(t, items, keep+2*mvDrained, "%s: the terminating pod holds the gomemcache application's keys, and a few claims", name)
		// Before it stops: the terminating pod still holds every key of
		// the gomemcache application's there.
		if keep > 0 {
			c := app.count(t, []string{oldAddr})
			assert.Equal(t, c.expected, c.found, "%s: the gomemcache application's keys at the terminating pod %s, all there before it stops (e.g. %v)", name, oldAddr, c.samples)
		}
		require.NoError(t, oldPod.ForceDelete(e.ctx))
		waitMovesDone(t, sel)
		check(name, drain, before)
	}
	replace("replace of a shared pod", 0)            // shp-0: the gomemcache application's
	replace("rolling step: the Client's own pod", 2) // shp-3: the Client's alone
	replace("rolling step: another shared pod", 0)   // shp-1: the gomemcache application's

	total := sel.Stats().Moves
	t.Logf("shared servers, prefix: the mover in all: %s", shMovesString(total))
	report(t, "### Client: shared servers\n\n")
	report(t, "A gomemcache application (`memcache.New` over the first %d pods: crc32, a fixed list) and a Client with `Moves{Prefix: %q}` share the pods, %d keys each; the Client's pods change. Keys found after each change: the gomemcache application's on its surviving servers, and the Client's.\n\n",
		shPods, shPrefix, shKeys)
	report(t, "| change | gomemcache application | Client | Client's at their owners | moved | foreign | refused | terminating pod |\n|---|---|---|---|---|---|---|---|\n")
	for _, st := range steps {
		report(t, "| %s | %d of %d (%.2f%%) | %d of %d (%.3f%%) | %d | %d | %d | %d | %s |\n", st.name, st.other.found, st.other.expected, 100*st.other.share(),
			st.client.found, st.client.expected, 100*st.client.share(), st.atOwners, st.moves.Moved, st.moves.Foreign, st.moves.Refused, st.drain)
	}
	report(t, "\n")
}

func testSharedNoPrefix(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, shPods, podOpts{prefix: "shn"})
	shared := addrs(pods, 11211)
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, shared, cRingWait)
	hs := &shHandoffs{}
	sel := e.newSelClient(l, selector.WithMetrics(hs)) // the default Moves: no prefix
	app := newOtherApp(t, shared)
	shFillClient(t, sel)
	app.fill(t)

	// The scale-up from 3 to 4: the shared servers are refused.
	before := sel.Stats().Moves
	pods = append(pods, e.runPods(shPods, 1, podOpts{prefix: "shn"})[0])
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	require.Eventually(t, func() bool { return sel.Stats().Moves.Rounds > before.Rounds }, mvGrace, 100*time.Millisecond, "the scale-up's round")
	waitMovesDone(t, sel)
	mv := shMovesSince(sel.Stats().Moves, before)
	other := app.count(t, liveOf(shared, addrs(pods, 11211)))
	t.Logf("shared servers, no prefix: scale-up to %d: mover: %s; gomemcache application %v", len(pods), shMovesString(mv), other)
	assert.Positive(t, mv.Refused, "the mover refuses the shared servers")
	assert.Equal(t, other.expected, other.found, "scale-up: the gomemcache application's keys, all found (e.g. %v)", other.samples)
	warned := slices.ContainsFunc(l.log.messages(), func(m string) bool {
		return strings.Contains(m, "cannot move keys from this server") && strings.Contains(m, "Moves.Prefix")
	})
	assert.True(t, warned, "the refusal's warning names Moves.Prefix")

	// Read (each key the scale-up moved is handed off), then overwrite one
	// key in 10 after the change: a read must never see version 1 of those.
	v1 := func(i int) []byte { return shValue(shAppKey(i), 1) }
	afterScale := shCountClient(t, sel, l, v1)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for g := range shFillers {
		wg.Go(func() {
			for i := g * 10; i < shKeys; i += shFillers * 10 {
				if sel.Set(&memcache.Item{Key: shAppKey(i), Value: shValue(shAppKey(i), 2)}) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "overwrites failed")
	want := func(i int) []byte {
		if i%10 == 0 {
			return shValue(shAppKey(i), 2)
		}
		return v1(i)
	}

	// A replace of a shared pod: the application reads its keys as they
	// change servers (each read hands the key off), until the old pod stops.
	oldPod := pods[0]
	oldAddr := oldPod.Addr(11211)
	newPod := e.runPods(shPods+1, 1, podOpts{prefix: "shn"})[0]
	pods = append(pods[1:], newPod)
	l.waitServers(t, append(addrs(pods, 11211), oldAddr), cRingWait)
	shWaitClient(t, sel, newPod.Addr(11211), "up")
	joined := shCountClient(t, sel, l, want)
	require.NoError(t, oldPod.Delete(e.ctx))
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	shWaitClient(t, sel, oldAddr, "gone")
	terminating := shCountClient(t, sel, l, want)
	atOwners, notAt := shAtOwners(t, l)
	atOld := app.count(t, []string{oldAddr})
	require.NoError(t, oldPod.ForceDelete(e.ctx))
	waitMovesDone(t, sel)
	after := shCountClient(t, sel, l, want)
	other = app.count(t, liveOf(shared, addrs(pods, 11211)))
	mv = shMovesSince(sel.Stats().Moves, before)
	t.Logf("shared servers, no prefix: the Client: after the scale-up %v; after the overwrite of 1 in 10 and a pod joined %v; the old pod terminating %v (then %d keys at their owners); after it stopped %v; handoffs: %v",
		afterScale, joined, terminating, atOwners, after, hs)
	t.Logf("shared servers, no prefix: the gomemcache application: at the terminating pod %v; on its surviving servers after %v; mover: %s", atOld, other, shMovesString(mv))
	assert.Equal(t, shKeys, atOwners, "every key of the Client read while the old pod terminated was handed off to its owner (e.g. %v)", notAt)
	for _, c := range []struct {
		name string
		c    shCount
	}{{"after the scale-up", afterScale}, {"after a pod joined", joined}, {"the old pod terminating", terminating}, {"after the replace", after}} {
		assert.GreaterOrEqual(t, c.c.share(), 0.999, "%s: the Client's keys found (e.g. %v)", c.name, c.c.samples)
		assert.Zero(t, c.c.wrong, "%s: the Client's values read back wrong, or stale (e.g. %v)", c.name, c.c.samples)
	}
	assert.Equal(t, atOld.expected, atOld.found, "the gomemcache application's keys at the terminating pod, all there before it stops (e.g. %v)", atOld.samples)
	assert.Equal(t, other.expected, other.found, "replace: the gomemcache application's keys on its surviving servers, all found (e.g. %v)", other.samples)
	assert.Zero(t, other.wrong, "the gomemcache application's values read back wrong")

	report(t, "Without `Moves.Prefix`, the mover refused the shared servers (%d refusals over a scale-up to %d and a replace; %d keys moved, from the pod only the Client used); the Client's keys moved when read: %d of %d found after the scale-up and the replace (%d wrong or stale); the gomemcache application's: %d of %d.\n\n",
		mv.Refused, shPods+1, mv.Moved, after.found, after.expected, after.wrong, other.found, other.expected)
}
