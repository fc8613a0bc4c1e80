package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Discovery by DNS against CoreDNS's kubernetes plugin (coredns_test.go),
// which serves the control plane's Services as a cluster's DNS does: the
// Clients and ServerLists here have no API access at all, only the
// addresses dnssrv+_memcache._tcp.<service>.<ns>.svc.cluster.local (SRV)
// and dns+<service>.<ns>.svc.cluster.local:11211 (A).

// TestDNSScale: Clients of both address forms follow a scale-up from 2 to 4
// pods and a scale-down to 2, and serve requests on every server after each.
func TestDNSScale(t *testing.T) {
	e := newEnv(t)
	dns := startCoreDNS(t)
	pods := e.runPods(0, 2, podOpts{})
	// The two share the servers with rings of different identities (SRV:
	// the targets' hostnames; A: the IPs), so each moves its own keys only.
	clients := map[string]*dnsClient{
		"SRV": e.newDNSClient(srvAddress(e.ns), dns.Addr, selector.WithMoves(selector.Moves{Prefix: "scale-SRV-"})),
		"A":   e.newDNSClient(aAddress(e.ns), dns.Addr, selector.WithMoves(selector.Moves{Prefix: "scale-A-"})),
	}
	// follow waits until every client has want, and uses each on 200 keys.
	follow := func(change string, want []*cluster.Pod, since time.Time) {
		t.Helper()
		for _, name := range []string{"SRV", "A"} {
			c := clients[name]
			d, err := c.awaitRouting(addrs(want, 11211), since, dnsWait)
			require.NoError(t, err, "%s client, %s", name, change)
			for i := range 200 {
				key := fmt.Sprintf("scale-%s-%d", name, i)
				require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v")}), "%s client, %s", name, change)
				_, err := c.Get(key)
				require.NoError(t, err, "%s client, %s: Get %s", name, change, key)
			}
			t.Logf("%s: the %s client has the %d servers %v, within %v", change, name, len(want), addrs(want, 11211), d.Round(time.Millisecond))
		}
	}
	follow("start", pods, time.Now())

	up := time.Now()
	pods = append(pods, e.runPods(2, 2, podOpts{})...)
	follow("scale-up to 4", pods, up)

	down := time.Now()
	gone := pods[2:]
	pods = pods[:2]
	for _, p := range gone {
		require.NoError(t, p.Delete(e.ctx)) // Terminating: not ready, so out of DNS
	}
	follow("scale-down to 2", pods, down)
	for _, p := range gone {
		require.NoError(t, p.ForceDelete(e.ctx))
	}
}

// TestDNSStatefulSetRestart: a rolling restart of a StatefulSet of 3 pods,
// highest ordinal first as the StatefulSet controller does it; each pod
// returns under its name at a new IP. By SRV, a pod is its hostname, so no
// key changes pod: every key of a pod that did not restart is still found
// through the Client, and the SRV ServerList maps every key as the watch
// does. A ServerList of the A records, where a pod is its IP, shows what
// moves without names.
func TestDNSStatefulSetRestart(t *testing.T) {
	const keys = 2000
	e := newEnv(t)
	dns := startCoreDNS(t)
	pods := e.runPods(0, 3, podOpts{statefulSet: true})
	c := e.newDNSClient(srvAddress(e.ns), dns.Addr)
	srv := e.newDNSLib(srvAddress(e.ns), dns.Addr)
	byA := e.newDNSLib(aAddress(e.ns), dns.Addr)
	watch := e.mustLib(serviceName + ":11211")
	waitAll := func(want []*cluster.Pod) {
		t.Helper()
		c.waitRouting(t, addrs(want, 11211), dnsWait)
		for _, l := range []*lib{srv, byA, watch} {
			l.waitServers(t, addrs(want, 11211), dnsWait)
		}
	}
	waitAll(pods)
	e.checkHostnames(t, 3)
	sameAsWatch := func() int {
		differ := 0
		for i := range keys {
			key := fmt.Sprintf("sts-%d", i)
			if pick(t, srv, key) != pick(t, watch, key) {
				differ++
			}
		}
		return differ
	}
	require.Zero(t, sameAsWatch(), "keys the SRV ServerList maps to another server than the watch")

	var moved, aMoved, kept, lost, onRestarted int
	for _, i := range []int{2, 1, 0} {
		nameOf := map[string]string{}
		for _, p := range pods {
			nameOf[p.Addr(11211)] = p.Name
		}
		before, beforeA := map[string]string{}, map[string]string{}
		for k := range keys {
			key := fmt.Sprintf("sts-%d", k)
			require.NoError(t, c.Set(&memcache.Item{Key: key, Value: []byte("v")}))
			before[key] = nameOf[pick(t, srv, key)]
			beforeA[key] = pick(t, byA, key)
		}

		old := pods[i]
		require.NoError(t, old.Terminate(e.ctx, 200*time.Millisecond))
		waitAll(append(pods[:i:i], pods[i+1:]...))
		restarted, err := e.runPod(old.Name, podOpts{statefulSet: true})
		require.NoError(t, err)
		require.NotEqual(t, old.IP, restarted.IP, "the restarted pod got the same IP; the test needs a new one")
		pods[i] = restarted
		waitAll(pods)
		nameOf[restarted.Addr(11211)] = restarted.Name

		var sMoved, sAMoved, sKept, sLost, sRestarted int
		for key, was := range before {
			now := nameOf[pick(t, srv, key)]
			if now != was {
				sMoved++
			}
			if beforeA[key] != old.Addr(11211) && pick(t, byA, key) != beforeA[key] {
				sAMoved++
			}
			_, err := c.Get(key)
			switch {
			case err == nil:
				sKept++
			case errors.Is(err, memcache.ErrCacheMiss) && was == old.Name:
				sRestarted++ // gone with the old process
			case errors.Is(err, memcache.ErrCacheMiss):
				sLost++
			default:
				t.Fatalf("Get %s: %v", key, err)
			}
		}
		t.Logf("%s restarted (%s -> %s): of %d keys, SRV: %d changed pod (want 0), %d found, %d lost from pods that did not restart (want 0), %d missed on the restarted pod; A records: %d keys of pods that did not restart moved",
			old.Name, old.IP, restarted.IP, keys, sMoved, sKept, sLost, sRestarted, sAMoved)
		moved, aMoved, kept, lost, onRestarted = moved+sMoved, aMoved+sAMoved, kept+sKept, lost+sLost, onRestarted+sRestarted
	}
	differ := sameAsWatch()
	t.Logf("rolling restart by DNS (SRV), %d keys x 3 steps: %d changed pod, %d found after their pod's neighbour restarted, %d lost, %d were on the restarting pod; %d keys map otherwise than the watch; by A records %d keys of pods that did not restart moved",
		keys, moved, kept, lost, onRestarted, differ, aMoved)
	assert.Zero(t, moved, "keys that changed pod by SRV")
	assert.Zero(t, lost, "keys lost from pods that did not restart")
	assert.Zero(t, differ, "keys the SRV ServerList maps to another server than the watch")
	assert.Positive(t, aMoved, "no key moved by A records: the restarts did not change the ring as they should")
}

// TestDNSClientKill: memcached of one of 3 pods dies (SIGKILL) under
// traffic through a Client discovering by SRV; the pod stays Ready for
// killNotReady, then turns NotReady, then returns. DNS learns each change
// only at its next poll; the Client's failover covers the time between:
// the application sees no error and no stale read (TestClientKill's
// scenario, by DNS).
func TestDNSClientKill(t *testing.T) {
	e := newEnv(t)
	dns := startCoreDNS(t)
	pods := e.runPods(0, cPods, podOpts{})
	cl := e.newDNSClient(srvAddress(e.ns), dns.Addr)
	cl.waitRouting(t, addrs(pods, 11211), dnsWait)
	tr := newVTraffic("client", cl.Client, cKeys, cWorkers, cInterval)
	warmAll(t, tr)
	stop := runAll(e.ctx, tr)
	defer stop()
	time.Sleep(killBefore)

	victim, others := pods[0], pods[1:]
	addr := victim.Addr(11211)
	killed := time.Now()
	victim.Crash()
	toDown, err := waitState(cl.Client, addr, "out", killed, killNotReady)
	require.NoError(t, err, "the Client did not take the killed server out")
	time.Sleep(time.Until(killed.Add(killNotReady)))

	notReady := time.Now()
	require.NoError(t, victim.SetReady(e.ctx, false))
	toDNS := cl.wait(t, addrs(others, 11211), dnsWait)
	time.Sleep(killAfter)

	restarted := time.Now()
	require.NoError(t, victim.RestartProcesses(e.ctx))
	require.NoError(t, victim.SetReady(e.ctx, true))
	backDNS := cl.wait(t, addrs(pods, 11211), dnsWait)
	toUp, err := waitState(cl.Client, addr, "up", restarted, dnsWait)
	require.NoError(t, err, "the restarted server did not come back for the Client")
	time.Sleep(killAfter)
	stop()
	tr.sweep()
	end := time.Now()

	during, _ := tr.errorsBetween(killed, notReady)
	after, _ := tr.errorsBetween(notReady, end)
	t.Logf("kill by DNS: server out in Stats %v after the SIGKILL; DNS dropped it %v after NotReady, and had it back %v after the restart; up %v after the restart",
		toDown.Round(time.Millisecond), toDNS.Round(time.Millisecond), backDNS.Round(time.Millisecond), toUp.Round(time.Millisecond))
	t.Logf("kill by DNS: errors seen by the application: SIGKILL to NotReady (%v): %s; after: %s; all: %s", killNotReady, fmtErrs(during), fmtErrs(after), &tr.all)
	for _, s := range tr.errorSamples(3) {
		t.Logf("kill by DNS: error sample: %s", s)
	}
	logConsistency(t, "kill by DNS", tr)
	assert.Zero(t, tr.all.errs(), "errors seen by the application: %v", tr.errorSamples(5))
	assert.Zero(t, tr.all.stale.Load(), "stale reads: %v", tr.staleSamples())
}

// TestDNSServiceDeleted: the Service goes. CoreDNS answers NXDOMAIN; the
// Client keeps its servers until DNS.Confirmations (3) answers in a row say
// so, then has none: requests fail with ErrNoServers, and the ServerList's
// Stats say why and what to check. The Service recreated, they return.
func TestDNSServiceDeleted(t *testing.T) {
	e := newEnv(t)
	dns := startCoreDNS(t)
	pods := e.runPods(0, 2, podOpts{})
	c := e.newDNSClient(srvAddress(e.ns), dns.Addr)
	l := e.newDNSLib(srvAddress(e.ns), dns.Addr)
	c.waitRouting(t, addrs(pods, 11211), dnsWait)
	l.waitServers(t, addrs(pods, 11211), dnsWait)
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))

	deleted := time.Now()
	require.NoError(t, e.client.CoreV1().Services(e.ns).Delete(e.ctx, serviceName, metav1.DeleteOptions{}))
	empty := c.waitRouting(t, nil, dnsWait)
	l.waitServers(t, nil, dnsWait)
	_, err := c.Get("k")
	require.ErrorIs(t, err, selector.ErrNoServers)
	st := l.Stats()
	require.Error(t, st.LastError, "Stats().LastError after NXDOMAIN")
	t.Logf("Service deleted: the Client had no server %v later; Get: %v; the ServerList's Stats().LastError: %v",
		empty.Round(time.Millisecond), err, st.LastError)
	assert.Contains(t, st.LastError.Error(), "does not exist")
	assert.Contains(t, st.LastError.Error(), "clusterIP: None")
	// The servers stayed through the first empty answers: the library said
	// it kept them before it said it emptied them.
	logs := strings.Join(c.log.messages(), "\n")
	keep, drop := strings.Index(logs, "keeping the servers"), strings.Index(logs, "emptying the servers")
	assert.True(t, keep >= 0 && drop > keep, "the Client's log should say it kept the servers, then emptied them:\n%s", logs)

	svc := e.m.Service.DeepCopy()
	svc.Namespace = e.ns
	_, err = e.client.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)
	d := c.waitRouting(t, addrs(pods, 11211), dnsWait)
	require.NoError(t, c.Set(&memcache.Item{Key: "k", Value: []byte("v")}))
	t.Logf("Service recreated: the Client had its %d servers again %v later (%v after the delete)", len(pods), d.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond))
}

// TestDNSConvergence: the time from an API write (a readiness flip, a new
// pod Ready, a graceful delete: TestConvergence's changes) to PickServer
// using the result, by DNS (SRV, polled every dnsInterval, from CoreDNS
// with TTL 0 and no cache) and by the watch, measured on the same changes
// from the same instant. Changes come 250 ms apart, as in TestConvergence,
// and a random part of the poll interval more.
func TestDNSConvergence(t *testing.T) {
	const rounds = 15 // 4 changes per round, as in TestConvergence
	e := newEnv(t)
	dns := startCoreDNS(t)
	pods := e.runPods(0, 4, podOpts{noProcess: true})
	watch := e.mustLib(serviceName + ":11211")
	byDNS := e.newDNSLib(srvAddress(e.ns), dns.Addr)
	watch.waitServers(t, addrs(pods, 11211), dnsWait)
	byDNS.waitServers(t, addrs(pods, 11211), dnsWait)

	var ws, ds []time.Duration
	watchByKind, dnsByKind := map[string][]time.Duration{}, map[string][]time.Duration{}
	change := func(kind string, want []*cluster.Pod, write func() error) {
		t.Helper()
		start := time.Now()
		require.NoError(t, write())
		var wg sync.WaitGroup
		var dw, dd time.Duration
		var errW, errD error
		wg.Go(func() { dw, errW = watch.awaitServers(addrs(want, 11211), start, dnsWait) })
		wg.Go(func() { dd, errD = byDNS.awaitServers(addrs(want, 11211), start, dnsWait) })
		wg.Wait()
		require.NoError(t, errW, "%s: the watch", kind)
		require.NoError(t, errD, "%s: DNS", kind)
		require.NoError(t, checkPickServer(watch, want), "%s: the watch", kind)
		require.NoError(t, checkPickServer(byDNS, want), "%s: DNS", kind)
		ws, ds = append(ws, dw), append(ds, dd)
		watchByKind[kind], dnsByKind[kind] = append(watchByKind[kind], dw), append(dnsByKind[kind], dd)
		// 250 ms as in TestConvergence, and a random part of an interval,
		// so that the changes do not keep one phase to the polls.
		time.Sleep(250*time.Millisecond + rand.N(dnsInterval))
	}
	e.changeRounds(t, rounds, pods, change)

	t.Logf("convergence from API write to PickServer, %d changes, DNS by SRV every %v (CoreDNS TTL 0, no cache):", len(ds), dnsInterval)
	for _, kind := range changeKinds {
		t.Logf("  watch %-16s %s", kind, summarize(watchByKind[kind]))
		t.Logf("  DNS   %-16s %s", kind, summarize(dnsByKind[kind]))
	}
	t.Logf("  watch %-16s %s", "all", summarize(ws))
	t.Logf("  DNS   %-16s %s", "all", summarize(ds))
	ms := func(ds []time.Duration, p int) string { return fmt.Sprintf("%.1f ms", float64(percentile(ds, p))/1e6) }
	report(t, "### Convergence by DNS, next to the watch\n\n%d changes to pod status or deletion (as above), each measured from the same API write to PickServer by a ServerList watching the EndpointSlices and by one polling CoreDNS's SRV records every %v (its kubernetes plugin, TTL 0, no cache). Each change comes 250 ms and a random part of the interval after the last.\n\n| change | n | watch p50 | watch p99 | DNS p50 | DNS p90 | DNS p99 | DNS max |\n|---|---|---|---|---|---|---|---|\n", len(ds), dnsInterval)
	row := func(name string, w, d []time.Duration) {
		report(t, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, len(d), ms(w, 50), ms(w, 99), ms(d, 50), ms(d, 90), ms(d, 99), ms(d, 100))
	}
	for _, kind := range changeKinds {
		row(kind, watchByKind[kind], dnsByKind[kind])
	}
	row("**all**", ws, ds)
	report(t, "\n")
}
