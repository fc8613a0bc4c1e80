package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// Rolling-restart parameters.
const (
	rollPods     = 5
	rollKeys     = 2000                 // per client
	rollWorkers  = 4                    // per client
	rollInterval = 2 * time.Millisecond // per worker: 500 Gets/s
	rollSurge    = 2 * time.Second      // traffic with the surge pod before the old one goes
	rollPreStop  = 2 * time.Second
	rollSettle   = time.Second
)

// Scenario 3: a rolling restart of every memcached pod, done as Kubernetes
// does it (maxSurge 1, maxUnavailable 0), under continuous cache-aside
// traffic (Get, and Set after a miss) through two clients at once:
// memcache.NewFromSelector over this library, and a memcache.ServerList
// (modulo hashing, as the seed library did) fed the same ready pods in API
// order from the same EndpointSlices.
//
// Per step, for each client: the hit rate of the traffic during the step,
// and the share of its keys still found right after the old pod left the
// ring ("kept"; all keys are set at the start of the step), whose ideal is
// (N-1)/N; and the errors, split into routing errors (refused, reset or
// closed connections: a request to a stopped pod) and other errors.
func TestRollingRestart(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, rollPods, podOpts{})
	l := e.mustLib(serviceName + ":11211")
	l.waitServers(t, addrs(pods, 11211), 20*time.Second)

	var modulo memcache.ServerList
	feeder := e.feedModulo(&modulo, 11211)
	feeder.wait(t, addrs(pods, 11211), 20*time.Second)

	ours := &traffic{name: "ours", c: newClient(l), prefix: "ours"}
	mod := &traffic{name: "modulo", c: newClient(&modulo), prefix: "modulo"}
	clients := []*traffic{ours, mod}

	ctx, stop := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	for _, tr := range clients {
		tr.next()
		wg.Go(func() { tr.run(ctx) })
	}

	ideal := float64(rollPods-1) / rollPods
	t.Logf("N = %d pods, %d keys per client, %d Gets/s per client; ideal kept share (N-1)/N = %.2f",
		rollPods, rollKeys, rollWorkers*int(time.Second/rollInterval), ideal)
	t.Logf("%-5s %-13s | %-42s | %-42s", "step", "change", "ours:   gets  hit%  kept%  routing-err other", "modulo: gets  hit%  kept%  routing-err other")
	var steps [][2]*counters
	for i := range rollPods {
		for _, tr := range clients {
			tr.warm(t)
		}
		// A surge pod first ...
		oldPod := pods[0]
		newPod := e.runPods(rollPods+i, 1, podOpts{})[0]
		pods = append(pods[1:], newPod)
		want := append(addrs(pods, 11211), oldPod.Addr(11211))
		l.waitServers(t, want, 10*time.Second)
		feeder.wait(t, want, 10*time.Second)
		time.Sleep(rollSurge)
		// ... then the old pod terminates: not ready at once, so it leaves
		// the ring; memcached serves through the preStop delay, then stops;
		// the pod object goes.
		if err := oldPod.Delete(e.ctx); err != nil {
			t.Fatal(err)
		}
		want = addrs(pods, 11211)
		l.waitServers(t, want, 10*time.Second)
		feeder.wait(t, want, 10*time.Second)
		for _, tr := range clients {
			tr.sweep()
		}
		time.Sleep(rollPreStop)
		if err := oldPod.ForceDelete(e.ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(rollSettle)
		o, m := ours.next(), mod.next()
		steps = append(steps, [2]*counters{o, m})
		t.Logf("%-5d %-13s | %s | %s", i+1, oldPod.Name+" -> "+newPod.Name, o, m)
	}
	stop()
	wg.Wait()

	var totO, totM counters
	for _, s := range steps {
		totO.add(s[0])
		totM.add(s[1])
	}
	t.Logf("%-5s %-13s | %s | %s", "total", "", &totO, &totM)
	report(t, "### Rolling restart under traffic\n\n%d pods replaced one by one as a Deployment rollout does (surge pod ready, old pod terminating, preStop delay, memcached stopped, pod force-deleted), with cache-aside Get/Set traffic through our ServerList and, in the same run, through a memcache.ServerList fed the same pods in API order (modulo, as the seed library). Kept: the share of keys still found right after the old pod left (ideal (N-1)/N = %.2f).\n\n", rollPods, ideal)
	report(t, "| step | ours: gets | hit rate | kept | routing errors | other errors | modulo: gets | hit rate | kept | routing errors | other errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	row := func(name string, o, m *counters) {
		cells := func(c *counters) string {
			return fmt.Sprintf("%d | %.1f%% | %.1f%% | %d | %d", c.gets.Load(), 100*c.hitRate(), 100*c.keptShare(), c.routingErrs.Load(), c.otherErrs.Load())
		}
		report(t, "| %s | %s | %s |\n", name, cells(o), cells(m))
	}
	for i, s := range steps {
		row(strconv.Itoa(i+1), s[0], s[1])
	}
	row("**total**", &totO, &totM)
	report(t, "\n")
	t.Logf("modulo client: %d ServerList updates", feeder.updates.Load())
	for _, tr := range clients {
		for _, err := range tr.errorSamples() {
			t.Logf("%s: error sample: %v", tr.name, err)
		}
	}

	if n := totO.routingErrs.Load(); n != 0 {
		t.Errorf("ours: %d errors from routing to a stopped pod, want 0", n)
	}
	if n, gets := totO.otherErrs.Load(), totO.gets.Load(); n*1000 > gets {
		t.Errorf("ours: %d other errors in %d gets", n, gets)
	}
	for i, s := range steps {
		if kept := s[0].keptShare(); kept < ideal-0.1 {
			t.Errorf("step %d: ours kept %.3f of the keys, want close to the ideal %.2f", i+1, kept, ideal)
		}
	}
	if totO.keptShare() <= totM.keptShare() {
		t.Errorf("ours kept %.3f of the keys, not more than modulo's %.3f", totO.keptShare(), totM.keptShare())
	}
}

// counters of one client in one step.
type counters struct {
	gets, hits, routingErrs, otherErrs atomic.Int64
	swept, kept                        atomic.Int64 // keys read by sweep, and found
}

func (c *counters) add(o *counters) {
	c.gets.Add(o.gets.Load())
	c.hits.Add(o.hits.Load())
	c.routingErrs.Add(o.routingErrs.Load())
	c.otherErrs.Add(o.otherErrs.Load())
	c.swept.Add(o.swept.Load())
	c.kept.Add(o.kept.Load())
}

func (c *counters) keptShare() float64 {
	if c.swept.Load() == 0 {
		return 0
	}
	return float64(c.kept.Load()) / float64(c.swept.Load())
}

func (c *counters) hitRate() float64 {
	if c.gets.Load() == 0 {
		return 0
	}
	return float64(c.hits.Load()) / float64(c.gets.Load())
}

func (c *counters) String() string {
	return fmt.Sprintf("%12d %5.1f%% %5.1f%% %12d %5d", c.gets.Load(), 100*c.hitRate(), 100*c.keptShare(), c.routingErrs.Load(), c.otherErrs.Load())
}

// traffic is cache-aside load through one client over rollKeys keys.
type traffic struct {
	name   string
	c      *memcache.Client
	prefix string
	cur    atomic.Pointer[counters]

	mu      sync.Mutex
	samples []error
}

func (tr *traffic) key(i int) string { return fmt.Sprintf("%s-%d", tr.prefix, i) }

// next starts a new step and returns the counters of the one that ended.
func (tr *traffic) next() *counters { return tr.cur.Swap(&counters{}) }

// warm sets every key.
func (tr *traffic) warm(t *testing.T) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < rollKeys; i += 8 {
				if err := tr.c.Set(&memcache.Item{Key: tr.key(i), Value: []byte("value")}); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%s: warm: %v", tr.name, err)
	}
}

// sweep reads every key (GetMulti, no Set) and counts the ones found.
func (tr *traffic) sweep() {
	c := tr.cur.Load()
	const batch = 100
	for i := 0; i < rollKeys; i += batch {
		keys := make([]string, 0, batch)
		for j := i; j < min(i+batch, rollKeys); j++ {
			keys = append(keys, tr.key(j))
		}
		found, err := tr.c.GetMulti(keys)
		if err != nil {
			tr.count(c, err)
		}
		c.swept.Add(int64(len(keys)))
		c.kept.Add(int64(len(found)))
	}
}

// run sends Gets (and a Set after each miss) from rollWorkers goroutines
// until ctx is done.
func (tr *traffic) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range rollWorkers {
		wg.Go(func() {
			tick := time.NewTicker(rollInterval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				tr.once(tr.key(rand.IntN(rollKeys)))
			}
		})
	}
	wg.Wait()
}

func (tr *traffic) once(key string) {
	c := tr.cur.Load()
	c.gets.Add(1)
	_, err := tr.c.Get(key)
	if err == nil {
		c.hits.Add(1)
		return
	}
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = tr.c.Set(&memcache.Item{Key: key, Value: []byte("value")})
		if err == nil {
			return
		}
	}
	tr.count(c, err)
}

// count records an error of a request of step c.
func (tr *traffic) count(c *counters, err error) {
	if isRoutingError(err) {
		c.routingErrs.Add(1)
	} else {
		c.otherErrs.Add(1)
	}
	tr.mu.Lock()
	if len(tr.samples) < 5 {
		tr.samples = append(tr.samples, err)
	}
	tr.mu.Unlock()
}

func (tr *traffic) errorSamples() []error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.samples)
}

// isRoutingError reports whether err is what a client gets from a server
// that has stopped: refused, reset or closed connections.
func isRoutingError(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}

// moduloFeeder keeps a memcache.ServerList equal to the ready endpoints of
// the example Service in API order (slices by name, endpoints in slice
// order), from a List+Watch of its EndpointSlices.
type moduloFeeder struct {
	sl      *memcache.ServerList
	port    int32
	updates atomic.Int64

	mu      sync.Mutex
	current []string
	at      time.Time // when current was set
}

func (e *env) feedModulo(sl *memcache.ServerList, port int32) *moduloFeeder {
	f := &moduloFeeder{sl: sl, port: port}
	ctx := e.ctx
	go func() {
		for ctx.Err() == nil {
			if err := f.listWatch(ctx, e); err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	return f
}

func (f *moduloFeeder) listWatch(ctx context.Context, e *env) error {
	opts := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + serviceName}
	api := e.client.DiscoveryV1().EndpointSlices(e.ns)
	list, err := api.List(ctx, opts)
	if err != nil {
		return err
	}
	byName := map[string]*discoveryv1.EndpointSlice{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	f.set(byName)
	opts.ResourceVersion = list.ResourceVersion
	w, err := api.Watch(ctx, opts)
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		s, ok := ev.Object.(*discoveryv1.EndpointSlice)
		if !ok {
			return fmt.Errorf("watch: %v", ev.Object)
		}
		switch ev.Type {
		case watch.Added, watch.Modified:
			byName[s.Name] = s
		case watch.Deleted:
			delete(byName, s.Name)
		}
		f.set(byName)
	}
	return nil
}

func (f *moduloFeeder) set(m map[string]*discoveryv1.EndpointSlice) {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var servers []string
	for _, n := range names {
		for _, ep := range m[n].Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				servers = append(servers, fmt.Sprintf("%s:%d", a, f.port))
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.Equal(servers, f.current) {
		return
	}
	if err := f.sl.SetServers(servers...); err == nil {
		f.current = servers
		f.at = time.Now()
		f.updates.Add(1)
	}
}

// wait waits until the modulo list holds exactly want (in any order).
func (f *moduloFeeder) wait(t *testing.T, want []string, timeout time.Duration) {
	t.Helper()
	if _, err := f.await(want, time.Now(), timeout); err != nil {
		t.Fatal(err)
	}
}

// await waits until the list holds exactly want and returns the time since
// start.
func (f *moduloFeeder) await(want []string, start time.Time, timeout time.Duration) (time.Duration, error) {
	want = sorted(want)
	var got []string
	for end := start.Add(timeout); time.Now().Before(end); time.Sleep(time.Millisecond) {
		f.mu.Lock()
		got = sorted(f.current)
		at := f.at
		f.mu.Unlock()
		if slices.Equal(got, want) {
			return max(at.Sub(start), 0), nil
		}
	}
	return 0, fmt.Errorf("EndpointSlice watch: got %v, want %v", got, want)
}
