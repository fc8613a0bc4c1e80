package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// otherService is the second Service of TestPoolAcrossServices: a copy of
// the example's headless Service selecting pods labelled app=memcache-b.
const otherService = "memcache-b"

// runServicePods runs n pods labelled app=label, named prefix-i, in
// parallel.
func (e *env) runServicePods(n int, label, prefix string) []*cluster.Pod {
	e.t.Helper()
	pods := make([]*cluster.Pod, n)
	err := forEach(n, func(i int) error {
		p, err := kubelet.RunPod(e.ctx, cluster.PodSpec{Namespace: e.ns, Name: fmt.Sprintf("%s-%d", prefix, i), Labels: map[string]string{"app": label}})
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.pods = append(e.pods, p) // for the env's cleanup
		e.mu.Unlock()
		pods[i] = p
		return nil
	})
	require.NoError(e.t, err)
	return pods
}

// TestPoolAcrossServices: a pool over two Services (selector.AcrossServices),
// each of 3 pods, such as one Service per zone. In steady state the
// client's Gets go to its own Service. Then every memcached of that Service
// dies (SIGKILL) and its pods turn NotReady: the application must see no
// read or write error, find every key written before in the other
// Service, and never read a stale value.
func TestPoolAcrossServices(t *testing.T) {
	e := newEnv(t)
	svc := e.m.Service.DeepCopy()
	svc.ObjectMeta = metav1.ObjectMeta{Name: otherService, Namespace: e.ns, Labels: map[string]string{"app": otherService}}
	svc.Spec.Selector = map[string]string{"app": otherService}
	_, err := e.client.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)
	own := e.runServicePods(3, appLabel, "mc-own")
	other := e.runServicePods(3, otherService, "mc-other")
	la, lb := e.mustLib(serviceName+":11211"), e.mustLib(otherService+":11211")
	la.waitServers(t, addrs(own, 11211), cRingWait)
	lb.waitServers(t, addrs(other, 11211), cRingWait)

	c := e.defaultConfig()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	cl, err := selector.NewClient(ctx, serviceName+":11211",
		selector.WithAPIServer(c.url), selector.WithCAFile(c.caFile), selector.WithTokenFile(c.tokenFile),
		selector.WithLogger(la.log), selector.WithTimeout(cTimeout), selector.WithMaxIdleConns(cMaxIdle),
		selector.WithFailover(cFailover),
		selector.WithPool(selector.AcrossServices(otherService+":11211")))
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	all := slices.Concat(own, other)
	for _, p := range all {
		require.Eventually(t, func() bool { return stateOf(cl, p.Addr(11211)) == "up" }, cRingWait, 10*time.Millisecond, "Stats of %s", p.Name)
	}

	tr := newVTraffic("services", cl, cKeys, cWorkers, cInterval)
	warmAll(t, tr)
	stop := runAll(e.ctx, tr)
	defer stop()
	s0 := getStats(t, all)
	time.Sleep(poolSteady)
	steady := tr.phase()
	s1 := getStats(t, all)
	ownGets := total(s1[:len(own)]).sub(total(s0[:len(own)])).gets
	allGets := total(s1).sub(total(s0)).gets
	ownShare := float64(ownGets) / float64(max(allGets, 1))

	killed := time.Now()
	for _, p := range own {
		p.Crash()
	}
	tr.sweep() // while the killed pods are still Ready: every key from the other Service
	time.Sleep(time.Until(killed.Add(killNotReady)))
	crashed := tr.phase()
	for _, p := range own {
		require.NoError(t, p.SetReady(e.ctx, false))
	}
	toRing := la.waitServers(t, nil, cRingWait)
	time.Sleep(poolAfter)
	stop()
	tr.sweep()
	after := tr.phase()

	t.Logf("services: steady state: %s; %.1f%% of memcached's Gets in the client's own Service", steady, 100*ownShare)
	t.Logf("services: SIGKILL of all 3 pods of %s, NotReady %v later; its ring emptied %v after NotReady; then: %s; after: %s",
		serviceName, killNotReady, toRing.Round(time.Millisecond), crashed, after)
	readErrs, writeErrs, kept := checkNoLoss(t, "services", tr, crashed, after)
	report(t, "### Pool: across two Services, the client's own lost whole\n\n"+
		"2 Services of 3 pods (selector.AcrossServices); the memcached of every pod of the client's own Service killed, the pods NotReady %v later.\n\n"+
		"| Gets in the own Service (steady) | read errors | keys written before, found | write errors | stale reads | requests |\n|---|---|---|---|---|---|\n"+
		"| %.1f%% | %d | %d of %d (%.2f%%) | %d | %d | %d |\n\n",
		killNotReady, 100*ownShare, readErrs, kept.kept.Load(), kept.expected.Load(), 100*kept.keptShare(), writeErrs, tr.all.stale.Load(), tr.all.ops.Load())

	assert.GreaterOrEqual(t, ownShare, poolMinHomeShare, "Gets left the client's own Service in steady state")
}
