package e2e

import (
	"net"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 5: 320 pods, so the Service has several EndpointSlices (100
// endpoints each at most); the ring holds all of them once; deleting 50 at
// once leaves exactly the other 270, without duplicates or stale members.
func TestManyPods(t *testing.T) {
	const total, deleted = 320, 50
	e := newEnv(t)
	l := e.mustLib(serviceName + ":11211")

	start := time.Now()
	pods := e.runPods(0, deleted, podOpts{noProcess: true, labels: map[string]string{"batch": "doomed"}})
	pods = append(pods, e.runPods(deleted, total-deleted, podOpts{noProcess: true})...)
	created := time.Since(start)
	d := l.waitServers(t, addrs(pods, 11211), 2*time.Minute)
	t.Logf("%d pods created and reported ready in %v; the ring held all %d %v later",
		total, created.Round(time.Millisecond), total, d.Round(time.Millisecond))

	list, err := e.client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + serviceName,
	})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, s := range list.Items {
		sizes = append(sizes, len(s.Endpoints))
	}
	t.Logf("%d EndpointSlices with %v endpoints", len(list.Items), sizes)
	if len(list.Items) < 4 {
		t.Errorf("%d EndpointSlices for %d pods, want at least 4", len(list.Items), total)
	}
	checkUnique(t, l)

	// Delete 50 at once, as a node drain or scale-down would: one
	// DeleteCollection, immediate (the fake kubelet is gone).
	start = time.Now()
	grace := int64(0)
	if err := e.client.CoreV1().Pods(e.ns).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace},
		metav1.ListOptions{LabelSelector: "batch=doomed"}); err != nil {
		t.Fatal(err)
	}
	rest := pods[deleted:]
	d, err = l.awaitServers(addrs(rest, 11211), start, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted %d pods in one call; the ring held exactly the other %d after %v", deleted, len(rest), d.Round(time.Millisecond))
	checkUnique(t, l)
	l.holdsFor(t, addrs(rest, 11211), 2*time.Second)
	if err := checkPickServer(l, rest); err != nil {
		t.Fatal(err)
	}
}

// checkUnique fails t if the ring lists a server twice.
func checkUnique(t *testing.T, l *lib) {
	t.Helper()
	s := l.servers()
	if c := slices.Compact(slices.Clone(s)); len(c) != len(s) {
		t.Fatalf("ring has duplicates: %d servers, %d distinct", len(s), len(c))
	}
	seen := 0
	if err := l.Each(func(net.Addr) error { seen++; return nil }); err != nil {
		t.Fatal(err)
	}
	if seen != len(s) {
		t.Fatalf("Each visits %d servers, Servers has %d", seen, len(s))
	}
}
