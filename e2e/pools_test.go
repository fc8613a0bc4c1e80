package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
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
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// The pool scenarios: a replicated pool and a zoned pool (selector.WithPool)
// against real memcached in pods bound to Nodes of three zones, whose
// topology.kubernetes.io/zone label the EndpointSlice controller copies
// into the endpoints' zone field, which the zoned pool splits by. The
// traffic is the versioned cache-aside traffic of the Client scenarios
// (vtraffic), which checks every read for staleness.

// The zones, their Nodes' name prefix, and the client's zone.
const (
	poolNodePrefix = "e2e-pool-node"
	poolHomeZone   = "zone-a"
)

var poolZones = []string{"zone-a", "zone-b", "zone-c"}

// Parameters of the pool scenarios. The phases are short: the suite runs
// on 2 cores with many other scenarios, and at cInterval per worker each
// phase still holds thousands of requests.
const (
	poolSteady       = 3 * time.Second // traffic in steady state, before a fault
	poolAfter        = 1500 * time.Millisecond
	poolMeasure      = 2 * time.Second // the window in which the returned zone's hit rate is measured
	poolSettle       = 2 * time.Second // traffic before steady state is measured: see TestPoolZones
	poolPerZone      = 3               // pods per zone in TestPoolZones
	poolWorkers      = 4               // of TestPoolZones, whose hit rates want many Gets a phase
	poolMinHomeShare = 0.99            // of the Gets that hit, those served in the client's zone
	poolMaxHitDrop   = 0.01            // hit rate lost while a whole zone is down, and not regained after one pass
	statsTimeout     = 2 * time.Second
)

// runZonedPods creates a Node per zone (once for the whole suite: Nodes
// are cluster-wide) and runs perZone pods on each, named mc-<zone>-<i>, in
// parallel; it returns them by zone, in poolZones' order.
func (e *env) runZonedPods(perZone int) [][]*cluster.Pod {
	e.t.Helper()
	nodes, err := kubelet.CreateZonedNodes(e.ctx, poolNodePrefix, poolZones...)
	require.NoError(e.t, err)
	pods := make([][]*cluster.Pod, len(poolZones))
	for z := range pods {
		pods[z] = make([]*cluster.Pod, perZone)
	}
	err = forEach(len(poolZones)*perZone, func(i int) error {
		z, j := i/perZone, i%perZone
		p, err := kubelet.RunPod(e.ctx, cluster.PodSpec{
			Namespace: e.ns,
			Name:      fmt.Sprintf("mc-%s-%d", poolZones[z], j),
			Labels:    map[string]string{"app": appLabel},
			NodeName:  nodes[z],
		})
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.pods = append(e.pods, p) // for the env's cleanup
		e.mu.Unlock()
		pods[z][j] = p
		return nil
	})
	require.NoError(e.t, err)
	return pods
}

// mcStat reads memcached's counters at addr with the text protocol's
// stats command, on a connection of its own: gomemcache has no stats, and
// the Client's connections must not be disturbed.
func mcStat(addr string) (map[string]uint64, error) {
	c, err := net.DialTimeout("tcp", addr, statsTimeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(statsTimeout)); err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "END" {
			return out, nil
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "STAT" {
			continue
		}
		if v, err := strconv.ParseUint(f[2], 10, 64); err == nil {
			out[f[1]] = v
		}
	}
	return nil, fmt.Errorf("stats from %s: no END: %v", addr, sc.Err())
}

// getCounts are memcached's Get counters, summed over servers, and the
// items they hold (not a counter: sub keeps g's).
type getCounts struct{ gets, hits, items uint64 }

func (g getCounts) sub(o getCounts) getCounts {
	return getCounts{g.gets - o.gets, g.hits - o.hits, g.items}
}

func (g getCounts) hitRate() float64 {
	if g.gets == 0 {
		return 0
	}
	return float64(g.hits) / float64(g.gets)
}

// getStats returns cmd_get (one a key, for multi-gets too) and get_hits of
// each pod, in order.
func getStats(t *testing.T, pods []*cluster.Pod) []getCounts {
	t.Helper()
	out := make([]getCounts, len(pods))
	for i, p := range pods {
		st, err := mcStat(p.Addr(11211))
		require.NoError(t, err)
		out[i] = getCounts{st["cmd_get"], st["get_hits"], st["curr_items"]}
	}
	return out
}

// served is the share of the application's gets (or keys of a pass) that
// the servers of g answered with a hit: a zone's hit rate as the
// application sees it. memcached's own get_hits/cmd_get would count a miss
// twice where the Client also reads a key's previous server (its handoff,
// after the zone's ring changed), and is logged alongside.
func served(g getCounts, gets int64) float64 {
	if gets == 0 {
		return 0
	}
	return float64(g.hits) / float64(gets)
}

func total(gs []getCounts) getCounts {
	var s getCounts
	for _, g := range gs {
		s.gets += g.gets
		s.hits += g.hits
		s.items += g.items
	}
	return s
}

// zoneStats returns the Get counters of each zone, in poolZones' order.
func zoneStats(t *testing.T, pods [][]*cluster.Pod) []getCounts {
	t.Helper()
	out := make([]getCounts, len(pods))
	for z, ps := range pods {
		out[z] = total(getStats(t, ps))
	}
	return out
}

// lossCounter is a cache that counts the Get misses of keys that should
// be there: whose last write, not changed during the Get, was a successful
// Set. The application's hit rate also counts the misses its own deletes
// cause; these are the hits a fault lost.
//
// It also keeps each key's last writes (vtraffic holds a key's lock
// around a write, so the version it gave out is the write's), which
// logStaleKeys prints for the keys read stale.
type lossCounter struct {
	cache
	tr   *vtraffic
	lost atomic.Int64

	mu     sync.Mutex
	writes map[string][]string
}

// poolKeyWrites is how many writes of a key lossCounter keeps.
const poolKeyWrites = 4

func (c *lossCounter) wrote(key, op string, err error) {
	i, _ := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:])
	res := "ok"
	if err != nil {
		res = err.Error()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writes == nil {
		c.writes = map[string][]string{}
	}
	h := append(c.writes[key], fmt.Sprintf("v%d %s %s at %s", c.tr.keys[i].next.Load(), op, res, time.Now().Format("15:04:05.000000")))
	c.writes[key] = h[max(0, len(h)-poolKeyWrites):]
}

func (c *lossCounter) Set(it *memcache.Item) error {
	err := c.cache.Set(it)
	c.wrote(it.Key, "Set", err)
	return err
}

func (c *lossCounter) Delete(key string) error {
	err := c.cache.Delete(key)
	c.wrote(key, "Delete", err)
	return err
}

func (c *lossCounter) history(key string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.writes[key])
}

func (c *lossCounter) Get(key string) (*memcache.Item, error) {
	i, _ := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:])
	k := &c.tr.keys[i]
	d := k.done.Load() // as vtraffic.sweep: a key with a write in flight is not counted
	w, st := k.writes.Load(), k.state.Load()
	it, err := c.cache.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) && st == keyPresent && w == d && k.writes.Load() == w {
		c.lost.Add(1)
	}
	return it, err
}

// presentIn returns, of tr's keys that should be there (their last write a
// successful Set), how many, and how many of them pods hold, read directly
// from each memcached.
func presentIn(t *testing.T, tr *vtraffic, pods []*cluster.Pod) (want, held int) {
	t.Helper()
	var keys []string
	for i := range tr.keys {
		if tr.keys[i].state.Load() == keyPresent {
			keys = append(keys, tr.key(i))
		}
	}
	found := map[string]bool{}
	for _, p := range pods {
		mc := memcache.New(p.Addr(11211))
		mc.Timeout = statsTimeout
		for from := 0; from < len(keys); from += vSweepBatch {
			items, err := mc.GetMulti(keys[from:min(from+vSweepBatch, len(keys))])
			require.NoError(t, err)
			for k := range items {
				found[k] = true
			}
		}
		mc.Close()
	}
	return len(keys), len(found)
}

// logStaleKeys logs what the application last did to each key it read
// stale, so that a stale read can be told apart: a value back after a
// Delete, or an old value after a Set.
func logStaleKeys(t *testing.T, scenario string, tr *vtraffic, lc *lossCounter) {
	t.Helper()
	seen := map[string]bool{}
	for _, s := range tr.staleSamples() {
		key, _, _ := strings.Cut(s, " ")
		if seen[key] {
			continue
		}
		seen[key] = true
		i, _ := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:])
		k := &tr.keys[i]
		last := map[int32]string{keyUnknown: "unknown (a write failed)", keyPresent: "Set", keyAbsent: "Delete"}[k.state.Load()]
		t.Logf("%s: stale key %s: its last successful write, version %d, was a %s; versions given out %d; its last writes: %s",
			scenario, key, k.lastOK.Load(), last, k.next.Load(), strings.Join(lc.history(key), "; "))
	}
}

// TestPoolReplicated: a replicated pool of 3 pods, one per zone. The
// memcached of two of them dies (SIGKILL), the one the client reads from
// among them, so that reads must fail over; the pods turn NotReady
// killNotReady later, as a kubelet's readiness probe would report. With
// one replica left, the application must see no read error, find every key
// it wrote before, have every write succeed (the pool's policy: a write
// succeeds if one replica took it), and never read a stale value.
func TestPoolReplicated(t *testing.T) {
	e := newEnv(t)
	byZone := e.runZonedPods(1)
	pods := slices.Concat(byZone...)
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	cl := e.newSelClient(l, selector.WithPool(selector.Replicated()))
	tr := newVTraffic("replicated", cl, cKeys, cWorkers, cInterval)
	warmAll(t, tr)
	for _, p := range pods {
		require.Equal(t, "up", stateOf(cl, p.Addr(11211)), "Stats of %s", p.Name)
	}

	// Steady state: find the replica this client reads from (chosen per
	// client), by the Gets each memcached answered.
	stop := runAll(e.ctx, tr)
	defer stop()
	s0 := getStats(t, pods)
	time.Sleep(poolSteady)
	steady := tr.phase()
	s1 := getStats(t, pods)
	reader := 0
	for i := range pods {
		if s1[i].sub(s0[i]).gets > s1[reader].sub(s0[reader]).gets {
			reader = i
		}
	}
	readShare := float64(s1[reader].sub(s0[reader]).gets) / float64(total(s1).sub(total(s0)).gets)
	victims := []*cluster.Pod{pods[reader], pods[(reader+1)%len(pods)]}
	survivor := pods[(reader+2)%len(pods)]

	killed := time.Now()
	for _, v := range victims {
		v.Crash()
	}
	// While the killed pods are still Ready (in the ring), every key must
	// be found on the survivor.
	tr.sweep()
	time.Sleep(time.Until(killed.Add(killNotReady)))
	crashed := tr.phase()
	notReady := time.Now()
	for _, v := range victims {
		require.NoError(t, v.SetReady(e.ctx, false))
	}
	toRing := l.waitServers(t, []string{survivor.Addr(11211)}, cRingWait)
	time.Sleep(poolAfter)
	stop()
	tr.sweep()
	after := tr.phase()

	t.Logf("replicated: steady state: %s; %.1f%% of memcached's Gets at %s, the replica this client reads from", steady, 100*readShare, victims[0].Name)
	t.Logf("replicated: SIGKILL of %s and %s (the reader first), NotReady %v later; the ring dropped them %v after NotReady",
		victims[0].Name, victims[1].Name, killNotReady, toRing.Round(time.Millisecond))
	during, _ := tr.errorsBetween(killed, notReady)
	t.Logf("replicated: SIGKILL to NotReady: %s (errors %s); after: %s", crashed, fmtErrs(during), after)
	readErrs, writeErrs, kept := checkNoLoss(t, "replicated", tr, crashed, after)
	report(t, "### Pool: replicated, 2 of 3 replicas SIGKILLed\n\n"+
		"3 pods, one per zone; the memcached of the replica the client reads from and of one more killed, their pods NotReady %v later.\n\n"+
		"| read errors | keys written before, found | write errors | stale reads | requests |\n|---|---|---|---|---|\n"+
		"| %d | %d of %d (%.2f%%) | %d | %d | %d |\n\n",
		killNotReady, readErrs, kept.kept.Load(), kept.expected.Load(), 100*kept.keptShare(), writeErrs, tr.all.stale.Load(), tr.all.ops.Load())

	assert.Greater(t, readShare, 0.9, "the client's reads are not on one replica: which one is the reader?")
}

// checkNoLoss logs and checks what a pool must show after losing replicas
// under tr's traffic: no read or write error, every key written before the
// loss found by the sweeps of the phases after it, no stale read. It
// returns the errors and the sweeps' counts, for the report.
func checkNoLoss(t *testing.T, name string, tr *vtraffic, after ...*vcounters) (readErrs, writeErrs int64, kept *vcounters) {
	t.Helper()
	readErrs, writeErrs = tr.all.getErrs.Load(), tr.all.setErrs.Load()+tr.all.delErrs.Load()
	kept = &vcounters{}
	for _, ph := range after {
		kept.add(ph)
	}
	t.Logf("%s: read errors %d (target 0); keys written before found %d of %d, %.2f%% (target all); write errors %d of %d requests (target 0); stale reads %d (target 0)",
		name, readErrs, kept.kept.Load(), kept.expected.Load(), 100*kept.keptShare(), writeErrs, tr.all.ops.Load(), tr.all.stale.Load())
	for _, s := range tr.errorSamples(3) {
		t.Logf("%s: error sample: %s", name, s)
	}
	logConsistency(t, name, tr)
	assert.Zero(t, readErrs, "read errors: %v", tr.errorSamples(5))
	assert.Positive(t, kept.expected.Load(), "the sweeps found no key that should be there")
	assert.Equal(t, kept.expected.Load(), kept.kept.Load(), "keys written before the kill, lost")
	assert.Zero(t, writeErrs, "write errors: %v", tr.errorSamples(5))
	assert.Zero(t, tr.all.stale.Load(), "stale reads: %v", tr.staleSamples())
	return readErrs, writeErrs, kept
}

// TestPoolZones: one Service of 3 zones x 3 pods, and a client in zone-a
// with a zoned pool and miss failover. In steady state the client's Gets
// must be served in its zone. Then every memcached of zone-a dies (SIGKILL)
// and the pods turn NotReady: reads go to the other zones, with no error
// and the same hit rate. Then zone-a's containers restart, empty, and the
// pods are Ready: misses there fail over, and the hits are copied back, so
// that one pass over the keys brings its hit rate back. No read may be
// stale throughout (the returning zone must not serve a value overwritten
// or deleted while it was down).
func TestPoolZones(t *testing.T) {
	e := newEnv(t)
	byZone := e.runZonedPods(poolPerZone)
	home := byZone[slices.Index(poolZones, poolHomeZone)]
	pods := slices.Concat(byZone...)
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	cl := e.newSelClient(l, selector.WithPool(selector.ByZone(poolHomeZone).WithMissFailover()))
	lc := &lossCounter{cache: cl}
	tr := newVTraffic("zoned", lc, cKeys, poolWorkers, cInterval)
	lc.tr = tr
	warmAll(t, tr)
	stop := runAll(e.ctx, tr)
	defer stop()
	// Right after warming every key is there; the deletes bring the hit
	// rate down to its equilibrium within about a second (the time the
	// traffic takes to read every key once or so). Measure from there.
	time.Sleep(poolSettle)
	tr.phase()
	lost0 := lc.lost.Load()

	// Steady state: the Gets that hit, by zone (a miss fails over to the
	// other zones by design, so the Gets sent out of zone are logged too).
	z0 := zoneStats(t, byZone)
	time.Sleep(poolSteady)
	steady := tr.phase()
	lost1 := lc.lost.Load()
	z1 := zoneStats(t, byZone)
	homeIdx := slices.Index(poolZones, poolHomeZone)
	d := make([]getCounts, len(z1))
	for i := range d {
		d[i] = z1[i].sub(z0[i])
	}
	all := total(d)
	homeShare := float64(d[homeIdx].hits) / float64(all.hits)
	homeGetShare := float64(d[homeIdx].gets) / float64(all.gets)
	homeRate := served(d[homeIdx], steady.gets.Load())

	// The whole zone dies.
	killed := time.Now()
	for _, p := range home {
		p.Crash()
	}
	time.Sleep(killNotReady)
	for _, p := range home {
		require.NoError(t, p.SetReady(e.ctx, false))
	}
	var rest []*cluster.Pod
	for _, p := range pods {
		if !slices.Contains(home, p) {
			rest = append(rest, p)
		}
	}
	toRing := l.waitServers(t, addrs(rest, 11211), cRingWait)
	time.Sleep(poolAfter)
	down := tr.phase()
	lost2 := lc.lost.Load()
	downFor := time.Since(killed)

	// It returns, empty.
	for _, p := range home {
		require.NoError(t, p.RestartProcesses(e.ctx))
		require.NoError(t, p.SetReady(e.ctx, true))
	}
	l.waitServers(t, addrs(pods, 11211), cRingWait)
	back := time.Now()
	for _, p := range home {
		_, err := waitState(cl, p.Addr(11211), "up", back, cUpWait)
		require.NoError(t, err, "zone %s's server did not come back for the client", poolHomeZone)
	}
	toUp := time.Since(back)
	returned := tr.phase()

	// One pass over the keys (GetMulti, which fails over on a miss and
	// copies the hits back, as Get does), then the zone's hit rate.
	p0 := total(getStats(t, home))
	tr.sweep()
	passGets := tr.phase().swept.Load()
	pass := total(getStats(t, home)).sub(p0)
	wantKeys, heldKeys := presentIn(t, tr, home) // its own reads, outside the windows measured
	tr.phase()
	p1 := total(getStats(t, home))
	time.Sleep(poolMeasure)
	recovered := tr.phase()
	after := total(getStats(t, home)).sub(p1)
	homeAfter := served(after, recovered.gets.Load())
	stop()
	tr.sweep()
	tr.phase()

	readErrs := tr.all.getErrs.Load()
	t.Logf("zones: steady state: %s", steady)
	t.Logf("zones: steady state: Gets that hit served in %s: %.2f%% (%d of %d; target >= %.0f%%); Gets sent to %s: %.2f%% (misses fail over); %s hit rate %.2f%% (memcached's get_hits/cmd_get there %.2f%%)",
		poolHomeZone, 100*homeShare, d[homeIdx].hits, all.hits, 100*poolMinHomeShare, poolHomeZone, 100*homeGetShare, poolHomeZone, 100*homeRate, 100*d[homeIdx].hitRate())
	t.Logf("zones: %s SIGKILLed, NotReady %v later, the ring dropped it %v after; down %v: %s",
		poolHomeZone, killNotReady, toRing.Round(time.Millisecond), downFor.Round(time.Millisecond), down)
	t.Logf("zones: hit rate with %s down %.2f%% vs %.2f%% before (target within %.0f point); read errors with it down %d (target 0); misses of keys that should be there: %d before, %d with it down",
		poolHomeZone, 100*down.hitRate(), 100*steady.hitRate(), 100*poolMaxHitDrop, down.getErrs.Load(), lost1-lost0, lost2-lost1)
	t.Logf("zones: %s back (restarted, empty), its servers up for the client %v after the ring had them; %d items there when the pass began (refilled by the traffic meanwhile): %s",
		poolHomeZone, toUp.Round(time.Millisecond), p0.items, returned)
	t.Logf("zones: %s hit rate: %.2f%% in steady state, %.2f%% during the first pass over the keys (%d keys), %.2f%% after it (target within %.0f point of steady state; memcached's get_hits/cmd_get there %.2f%%)",
		poolHomeZone, 100*homeRate, 100*served(pass, passGets), passGets, 100*homeAfter, 100*poolMaxHitDrop, 100*after.hitRate())
	t.Logf("zones: right after the pass, %s's memcached held %d of the %d keys that should be there; after the pass: %s", poolHomeZone, heldKeys, wantKeys, recovered)
	t.Logf("zones: read errors %d (target 0); write errors %d; misses of keys that should be there %d; stale reads %d (target 0) in %d requests",
		readErrs, tr.all.setErrs.Load()+tr.all.delErrs.Load(), lc.lost.Load(), tr.all.stale.Load(), tr.all.ops.Load())
	for _, s := range tr.errorSamples(3) {
		t.Logf("zones: error sample: %s", s)
	}
	logConsistency(t, "zones", tr)
	logStaleKeys(t, "zones", tr, lc)
	report(t, "### Pool: by zone, with miss failover; a whole zone SIGKILLed, then back empty\n\n"+
		"3 zones x %d pods; the client in %s. Hit rates are the application's; the zone's own is the share of the application's Gets that %s's memcached answered with a hit.\n\n"+
		"| hits served in zone, steady | hit rate, steady | hit rate, zone down | read errors | %s hit rate: steady / first pass / after it | stale reads | requests |\n|---|---|---|---|---|---|---|\n"+
		"| %.2f%% | %.2f%% | %.2f%% | %d | %.2f%% / %.2f%% / %.2f%% | %d | %d |\n\n",
		poolPerZone, poolHomeZone, poolHomeZone, poolHomeZone,
		100*homeShare, 100*steady.hitRate(), 100*down.hitRate(), readErrs, 100*homeRate, 100*served(pass, passGets), 100*homeAfter, tr.all.stale.Load(), tr.all.ops.Load())

	assert.GreaterOrEqual(t, homeShare, poolMinHomeShare, "Gets that hit served in the client's zone")
	assert.Zero(t, readErrs, "read errors: %v", tr.errorSamples(5))
	// Within 1 point, up to the sampling error of two hit rates measured
	// over a few thousand Gets each (3 standard deviations, about half a
	// point each): a cache-aside hit rate drifts by that much between two
	// windows of the same steady state.
	downSlack := hitRateSlack(steady.hitRate(), steady.gets.Load(), down.hitRate(), down.gets.Load())
	afterSlack := hitRateSlack(homeRate, steady.gets.Load(), homeAfter, recovered.gets.Load())
	t.Logf("zones: allowed drops %.2f and %.2f points (1 point and the sampling error)", 100*downSlack, 100*afterSlack)
	assert.InDelta(t, steady.hitRate(), down.hitRate(), downSlack, "hit rate with the client's zone down")
	assert.GreaterOrEqual(t, homeAfter, homeRate-afterSlack, "the returned zone's hit rate after one pass over the keys")
	assert.Zero(t, tr.all.stale.Load(), "stale reads: %v", tr.staleSamples())
}

// hitRateSlack is poolMaxHitDrop plus 3 standard deviations of the
// difference of two hit rates p1 and p2 measured over n1 and n2 Gets.
// A rate over 1 (a zone's count of hits includes the pool's repair and
// move reads there) is taken as 1: no variance, rather than NaN.
func hitRateSlack(p1 float64, n1 int64, p2 float64, n2 int64) float64 {
	p1, p2 = min(max(p1, 0), 1), min(max(p2, 0), 1)
	v := p1*(1-p1)/float64(max(n1, 1)) + p2*(1-p2)/float64(max(n2, 1))
	return poolMaxHitDrop + 3*math.Sqrt(v)
}
