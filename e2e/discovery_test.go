package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Scenario 1: three pods; the ring holds exactly their IPs, and every key
// set through memcache.NewFromSelector is stored on the pod PickServer
// names, and only there.
func TestDiscovery(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{})
	want := addrs(pods, 11211)
	e.waitSlices(want, 11211, 30*time.Second)

	start := time.Now()
	l := e.mustLib(serviceName + ":11211")
	t.Logf("NewServerList returned after %v with %v", time.Since(start).Round(time.Millisecond), l.servers())
	if got := l.servers(); !slices.Equal(got, sorted(want)) {
		t.Fatalf("after the initial sync the ring holds %v, want the ready pods %v", got, sorted(want))
	}

	c := newClient(l)
	direct := map[string]*memcache.Client{}
	for _, p := range pods {
		direct[p.Addr(11211)] = memcache.New(p.Addr(11211))
	}
	const keys = 300
	perPod := map[string]int{}
	for i := range keys {
		key := fmt.Sprintf("discovery-%d", i)
		if err := c.Set(&memcache.Item{Key: key, Value: []byte(key)}); err != nil {
			t.Fatalf("Set %s: %v", key, err)
		}
		picked, err := l.PickServer(key)
		if err != nil {
			t.Fatal(err)
		}
		perPod[picked.String()]++
		for addr, dc := range direct {
			it, err := dc.Get(key)
			switch {
			case addr == picked.String() && err != nil:
				t.Errorf("key %s: PickServer says %s, but that server answers %v", key, addr, err)
			case addr == picked.String() && string(it.Value) != key:
				t.Errorf("key %s on %s has value %q", key, addr, it.Value)
			case addr != picked.String() && !errors.Is(err, memcache.ErrCacheMiss):
				t.Errorf("key %s: PickServer says %s, but %s has it too (err %v)", key, picked, addr, err)
			}
		}
	}
	t.Logf("%d keys, each found on exactly the pod PickServer names; keys per pod: %v", keys, perPod)
	for addr, n := range perPod {
		if n < keys/3/2 {
			t.Errorf("pod %s got only %d of %d keys", addr, n, keys)
		}
	}
}

// Scenario 2: scale 3 -> 6 -> 2; pods that turn not ready leave the ring
// and come back when ready; with no ready pod PickServer says ErrNoServers.
func TestScaleAndReadiness(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 3, podOpts{})
	l := e.mustLib(serviceName + ":11211")
	c := newClient(l)
	step := func(name string, want []*cluster.Pod) {
		t.Helper()
		d := l.waitServers(t, addrs(want, 11211), 20*time.Second)
		t.Logf("%-40s ring has %d servers after %v", name, len(want), d.Round(time.Millisecond))
		if len(want) > 0 {
			checkTraffic(t, c, name, 100)
		}
	}
	step("initial 3 pods", pods)

	pods = append(pods, e.runPods(3, 3, podOpts{})...)
	step("scale up to 6", pods)

	// Scale down to 2 as a Deployment does: graceful delete; the pods turn
	// Terminating and must leave the ring before their processes stop.
	gone, pods := pods[2:], pods[:2]
	for _, p := range gone {
		if err := p.Delete(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	step("scale down to 2 (pods terminating)", pods)
	for _, p := range gone {
		if err := p.ForceDelete(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	l.holdsFor(t, addrs(pods, 11211), 500*time.Millisecond)

	if err := pods[1].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	step("pod 1 Ready=False", pods[:1])
	if err := pods[1].SetReady(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	step("pod 1 Ready=True again", pods)

	for _, p := range pods {
		if err := p.SetReady(e.ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	step("every pod Ready=False", nil)
	if _, err := l.PickServer("k"); !errors.Is(err, memcache.ErrNoServers) {
		t.Fatalf("PickServer with no ready pod: %v, want ErrNoServers", err)
	}
	if err := c.Set(&memcache.Item{Key: "k", Value: []byte("v")}); !errors.Is(err, memcache.ErrNoServers) {
		t.Fatalf("Set with no ready pod: %v, want ErrNoServers", err)
	}
	for _, p := range pods {
		if err := p.SetReady(e.ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	step("every pod Ready=True again", pods)

	pods = append(pods, e.runPods(6, 2, podOpts{})...)
	step("scale up to 4", pods)
}

// checkTraffic sets and gets n keys through c and fails t on any error.
func checkTraffic(t *testing.T, c *memcache.Client, prefix string, n int) {
	t.Helper()
	for i := range n {
		key := fmt.Sprintf("%x-%d", prefix, i)
		if err := c.Set(&memcache.Item{Key: key, Value: []byte("v")}); err != nil {
			t.Fatalf("%s: Set: %v", prefix, err)
		}
		if _, err := c.Get(key); err != nil {
			t.Fatalf("%s: Get: %v", prefix, err)
		}
	}
}

// waitSlices waits until the EndpointSlices of the example Service list
// exactly want (ip:port of the ready endpoints), as seen by an admin client.
func (e *env) waitSlices(want []string, port int32, timeout time.Duration) {
	e.t.Helper()
	want = sorted(want)
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	var got []string
	for ctx.Err() == nil {
		got, _ = e.readySliceAddrs(serviceName, port)
		if slices.Equal(got, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("EndpointSlices of %s: got %v, want %v", serviceName, got, want)
}

// readySliceAddrs lists the ready endpoints of svc's slices, as ip:port,
// sorted.
func (e *env) readySliceAddrs(svc string, port int32) ([]string, error) {
	list, err := e.client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				out = append(out, fmt.Sprintf("%s:%d", a, port))
			}
		}
	}
	return sorted(out), nil
}
