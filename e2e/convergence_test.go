package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Scenario 4: the time from an API write (a pod status patch, a pod
// delete) to PickServer using the result, over more than 50 changes:
// readiness flips, graceful deletes and new pods. Changes come 250ms apart:
// the EndpointSlice controller delays a change that follows its own last
// write too closely by a second ("informer cache is out of date", then a
// 1s retry backoff), which would measure the controller, not the library.
// An admin watch of the same slices shows how much of each delay is the
// controller's: "slice" is the write to the changed EndpointSlice reaching
// that watch, "ours - slice" the library's own share.
func TestConvergence(t *testing.T) {
	const rounds = 15 // 4 measured changes per round
	e := newEnv(t)
	pods := e.runPods(0, 4, podOpts{noProcess: true})
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), 20*time.Second)
	admin := e.feedModulo(new(memcache.ServerList), 11211)
	admin.wait(t, addrs(pods, 11211), 20*time.Second)

	byKind := map[string][]time.Duration{}
	var all, slice, libOnly []time.Duration
	// change does one API write and measures until the ring holds want.
	change := func(kind string, want []*cluster.Pod, write func() error) {
		t.Helper()
		start := time.Now()
		if err := write(); err != nil {
			t.Fatal(err)
		}
		d, err := l.awaitServers(addrs(want, 11211), start, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if err := checkPickServer(l, want); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		ds, err := admin.await(addrs(want, 11211), start, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: admin watch: %v", kind, err)
		}
		byKind[kind] = append(byKind[kind], d)
		all = append(all, d)
		slice = append(slice, ds)
		libOnly = append(libOnly, max(d-ds, 0))
		time.Sleep(250 * time.Millisecond)
	}

	e.changeRounds(t, rounds, pods, change)

	t.Logf("convergence from API write to PickServer, %d changes:", len(all))
	for _, kind := range changeKinds {
		t.Logf("  %-16s %s", kind, summarize(byKind[kind]))
	}
	t.Logf("  %-16s %s", "all", summarize(all))
	t.Logf("  %-16s %s", "slice", summarize(slice))
	t.Logf("  %-16s %s", "ours - slice", summarize(libOnly))
	report(t, "### Convergence: from an API write to PickServer\n\n%d changes to pod status or deletion, one every 250 ms or more. \"Library\" is the part after the EndpointSlice change reached a client-go watch of the same slices.\n\n| change | n | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n", len(all))
	for _, r := range []struct {
		name string
		ds   []time.Duration
	}{
		{"Ready=False", byKind["Ready=False"]}, {"Ready=True", byKind["Ready=True"]},
		{"new pod Ready", byKind["new pod Ready"]}, {"graceful delete", byKind["graceful delete"]},
		{"**all**", all}, {"EndpointSlice alone", slice}, {"library alone", libOnly},
	} {
		ms := func(p int) string { return fmt.Sprintf("%.1f ms", float64(percentile(r.ds, p))/1e6) }
		report(t, "| %s | %d | %s | %s | %s | %s |\n", r.name, len(r.ds), ms(50), ms(90), ms(99), ms(100))
	}
	report(t, "\n")
	if len(all) < 50 {
		t.Fatalf("only %d changes measured, want at least 50", len(all))
	}
	// The bound is on the library's part: the EndpointSlice controller's
	// alone took 3 s at p99 on a machine loaded by other work (CI, while
	// the library's part stayed at 150 ms).
	if p99 := percentile(libOnly, 99); p99 >= time.Second {
		t.Errorf("the library's part: p99 %v, want under 1s (the whole %v, the EndpointSlice's %v)", p99, percentile(all, 99), percentile(slice, 99))
	} else if p99 := percentile(all, 99); p99 >= 100*time.Millisecond {
		t.Logf("p99 %v is above the 100ms target", p99)
	}
}

// checkPickServer checks that PickServer spreads keys over exactly want
// (100 keys per server on average: every server gets some).
func checkPickServer(l *lib, want []*cluster.Pod) error {
	seen := map[string]bool{}
	for i := range 100 * max(len(want), 20) {
		a, err := l.PickServer(fmt.Sprintf("key-%d", i))
		if err != nil {
			return err
		}
		seen[a.String()] = true
	}
	for _, p := range want {
		if !seen[p.Addr(11211)] {
			return fmt.Errorf("PickServer never picks %s", p.Addr(11211))
		}
		delete(seen, p.Addr(11211))
	}
	if len(seen) > 0 {
		return fmt.Errorf("PickServer picks servers that are not ready: %v", seen)
	}
	return nil
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100 // nearest rank
	return s[max(i-1, 0)]
}

func summarize(ds []time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "n=%-3d p50=%-8v p90=%-8v p99=%-8v max=%v", len(ds),
		percentile(ds, 50).Round(100*time.Microsecond), percentile(ds, 90).Round(100*time.Microsecond),
		percentile(ds, 99).Round(100*time.Microsecond), percentile(ds, 100).Round(100*time.Microsecond))
	return b.String()
}

// changeKinds are the changes changeRounds makes, in their order.
var changeKinds = []string{"Ready=False", "Ready=True", "new pod Ready", "graceful delete"}

// changeRounds makes rounds of four API writes through change, which makes
// one write and waits until the clients hold want. In each round a pod turns
// not ready and ready again; a new pod becomes ready (its status patch is
// the write that counts); the old pod is deleted gracefully, then for good,
// as the kubelet would. change is to wait 250 ms after each write (see
// TestConvergence). It returns the pods after the rounds, and the number
// the next new pod takes, after pods named mc-0 up.
func (e *env) changeRounds(t *testing.T, rounds int, pods []*cluster.Pod, change func(kind string, want []*cluster.Pod, write func() error)) ([]*cluster.Pod, int) {
	t.Helper()
	next := len(pods)
	for r := range rounds {
		p := pods[r%len(pods)]
		rest := slices.DeleteFunc(slices.Clone(pods), func(q *cluster.Pod) bool { return q == p })
		change(changeKinds[0], rest, func() error { return p.SetReady(e.ctx, false) })
		change(changeKinds[1], pods, func() error { return p.SetReady(e.ctx, true) })
		newPod, err := e.runPod(fmt.Sprintf("mc-%d", next), podOpts{noProcess: true, notReady: true})
		if err != nil {
			t.Fatal(err)
		}
		next++
		time.Sleep(250 * time.Millisecond) // Running, not ready yet
		change(changeKinds[2], append(slices.Clone(pods), newPod), func() error { return newPod.SetReady(e.ctx, true) })
		pods = append(rest, newPod)
		change(changeKinds[3], pods, func() error { return p.Delete(e.ctx) })
		if err := p.ForceDelete(e.ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return pods, next
}
