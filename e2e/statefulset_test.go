package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Scenario 6: StatefulSet pods (spec.hostname and spec.subdomain, so their
// endpoints carry a hostname). A pod that restarts with a new IP keeps its
// key range: every key maps to the same pod before and after, at its new IP.
func TestStatefulSetRestart(t *testing.T) {
	const keys = 3000
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{statefulSet: true})
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), 20*time.Second)
	e.checkHostnames(t, 3)

	c := newClient(l)
	before := map[string]string{}
	for i := range keys {
		key := fmt.Sprintf("sts-%d", i)
		if err := c.Set(&memcache.Item{Key: key, Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		before[key] = pick(t, l, key)
	}

	// The StatefulSet controller replaces mc-1: the old pod terminates and
	// goes, a new mc-1 starts on another node address.
	old := pods[1]
	if err := old.Terminate(e.ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	l.waitServers(t, addrs([]*cluster.Pod{pods[0], pods[2]}, 11211), 10*time.Second)
	restarted, err := e.runPod(old.Name, podOpts{statefulSet: true})
	if err != nil {
		t.Fatal(err)
	}
	if restarted.IP == old.IP {
		t.Fatalf("restarted pod got the same IP %s; the test needs a new one", old.IP)
	}
	pods[1] = restarted
	l.waitServers(t, addrs(pods, 11211), 10*time.Second)
	t.Logf("%s restarted: %s -> %s", old.Name, old.IP, restarted.IP)

	moved, hits, misses := 0, 0, 0
	for key, was := range before {
		want := was
		if was == old.Addr(11211) {
			want = restarted.Addr(11211)
		}
		now := pick(t, l, key)
		if now != want {
			moved++
			if moved <= 5 {
				t.Errorf("key %s moved from %s to %s, want %s", key, was, now, want)
			}
		}
		// Keys of the other pods are still cached; mc-1's are gone with
		// its old process.
		_, err := c.Get(key)
		switch {
		case err == nil:
			hits++
		case errors.Is(err, memcache.ErrCacheMiss):
			misses++
			if want != restarted.Addr(11211) {
				t.Errorf("key %s on %s, which did not restart, is lost", key, want)
			}
		default:
			t.Fatalf("Get %s: %v", key, err)
		}
	}
	t.Logf("%d keys: %d moved to another pod (want 0); %d still cached, %d were on the restarted pod", keys, moved, hits, misses)

	// For contrast: the same ring keyed by IP instead of pod identity.
	var byIP selector.ServerList
	if err := byIP.SetServers(append(addrs(pods[:1], 11211), old.Addr(11211), pods[2].Addr(11211))...); err != nil {
		t.Fatal(err)
	}
	ipBefore := map[string]string{}
	for key := range before {
		ipBefore[key] = pick(t, &byIP, key)
	}
	if err := byIP.SetServers(addrs(pods, 11211)...); err != nil {
		t.Fatal(err)
	}
	ipMoved := 0
	for key, was := range ipBefore {
		if was != old.Addr(11211) && pick(t, &byIP, key) != was {
			ipMoved++
		}
	}
	t.Logf("a ring keyed by IP would also have moved %d keys between pods that did not restart", ipMoved)
}

// pick returns the address PickServer names for key.
func pick(t *testing.T, ss memcache.ServerSelector, key string) string {
	t.Helper()
	a, err := ss.PickServer(key)
	if err != nil {
		t.Fatal(err)
	}
	return a.String()
}

// checkHostnames checks that the example Service's slices carry a hostname
// for n endpoints (what makes them StatefulSet endpoints).
func (e *env) checkHostnames(t *testing.T, n int) {
	t.Helper()
	list, err := e.client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + serviceName,
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ep.Hostname != nil {
				names = append(names, *ep.Hostname)
			}
		}
	}
	if len(names) != n {
		t.Fatalf("endpoints with a hostname: %v, want %d", names, n)
	}
	t.Logf("endpoint hostnames: %v", names)
}
