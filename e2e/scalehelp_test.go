package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Helpers of the scale tests (TestRollingRestartAtScale, TestManyClients).

// runPodsAt starts the pods named prefix-start .. prefix-(start+n-1) with
// spec (Namespace, Name and Labels filled in), 16 at a time, and returns
// them in order. Unlike env.runPods it does not track them for the env's
// cleanup, which deletes pods one call each: callers of this delete their
// pods with deleteAllPods, in one call.
func (e *env) runPodsAt(prefix string, start, n int, spec cluster.PodSpec) []*cluster.Pod {
	e.t.Helper()
	pods := make([]*cluster.Pod, n)
	err := forEach(n, func(i int) (err error) {
		s := spec
		s.Namespace, s.Name, s.Labels = e.ns, fmt.Sprintf("%s-%d", prefix, start+i), map[string]string{"app": appLabel}
		pods[i], err = kubelet.RunPod(e.ctx, s)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return pods
}

// deleteAllPods deletes every pod of the env's namespace at once, in one
// call, as a kubelet would after their containers stopped. It is for pods
// without processes (runPodsAt with NoProcess).
//
// Deleting a thousand pods can outlast the API server's 60 s request timeout
// on a busy machine; the deletes done stay done, so it is asked again.
func (e *env) deleteAllPods() error {
	grace := int64(0)
	var err error
	for range 5 {
		err = e.client.CoreV1().Pods(e.ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &grace},
			metav1.ListOptions{LabelSelector: "app=" + appLabel})
		if err == nil || !apierrors.IsTimeout(err) && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "deadline exceeded") {
			return err
		}
	}
	return err
}

// forEach runs f(i) for i in [0, n), 16 at a time, and returns the errors.
func forEach(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// watchReady follows the example Service's EndpointSlices with client-go
// (a List, then a Watch, again on error) as an admin, and calls f with the
// ready endpoints, as ip:port sorted, after the list and after every event,
// until the test ends. It is the reference: how soon a client-go watch of
// the same slices saw each change.
func (e *env) watchReady(port int32, f func(at time.Time, servers []string)) {
	ctx := e.ctx
	api := e.client.DiscoveryV1().EndpointSlices(e.ns)
	opts := metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + serviceName}
	ready := func(m map[string]*discoveryv1.EndpointSlice) []string {
		var out []string
		for _, s := range m {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
					continue
				}
				for _, a := range ep.Addresses {
					out = append(out, fmt.Sprintf("%s:%d", a, port))
				}
			}
		}
		sort.Strings(out)
		return out
	}
	listWatch := func() error {
		list, err := api.List(ctx, opts)
		if err != nil {
			return err
		}
		byName := map[string]*discoveryv1.EndpointSlice{}
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		f(time.Now(), ready(byName))
		o := opts
		o.ResourceVersion = list.ResourceVersion
		w, err := api.Watch(ctx, o)
		if err != nil {
			return err
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			at := time.Now()
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
			f(at, ready(byName))
		}
		return nil
	}
	go func() {
		for ctx.Err() == nil {
			if err := listWatch(); err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// presence follows a sequence of server sets (from a ServerList's OnChange
// hook, or from watchReady) and records when each server first appeared
// and when it first left after that.
type presence struct {
	mu       sync.Mutex
	cur      map[string]bool
	appeared map[string]time.Time
	left     map[string]time.Time
	flaps    int // a server that came back after it left
	sets     int // sets observed
	min, max int // of the set sizes since resetSizes
}

func newPresence() *presence {
	return &presence{cur: map[string]bool{}, appeared: map[string]time.Time{}, left: map[string]time.Time{}, min: -1}
}

func (p *presence) observe(at time.Time, servers []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := make(map[string]bool, len(servers))
	for _, s := range servers {
		next[s] = true
		if p.cur[s] {
			continue
		}
		if _, ok := p.appeared[s]; !ok {
			p.appeared[s] = at
		} else if _, ok := p.left[s]; ok {
			p.flaps++
		}
	}
	for s := range p.cur {
		if _, ok := p.left[s]; !ok && !next[s] {
			p.left[s] = at
		}
	}
	p.cur = next
	p.sets++
	if p.min < 0 || len(next) < p.min {
		p.min = len(next)
	}
	p.max = max(p.max, len(next))
}

// observeAddrs is an OnChange hook.
func (p *presence) observeAddrs(servers []net.Addr) {
	at := time.Now()
	s := make([]string, len(servers))
	for i, a := range servers {
		s[i] = a.String()
	}
	p.observe(at, s)
}

// resetSizes starts the min and max set sizes over from the current set.
func (p *presence) resetSizes() {
	p.mu.Lock()
	p.min, p.max = len(p.cur), len(p.cur)
	p.mu.Unlock()
}

func (p *presence) sizes() (lo, hi, sets, flaps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.min, p.max, p.sets, p.flaps
}

// holds reports whether the current set is exactly want.
func (p *presence) holds(want map[string]bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.cur) != len(want) {
		return false
	}
	for s := range want {
		if !p.cur[s] {
			return false
		}
	}
	return true
}

// await waits until the set is exactly want, or fails with what differs
// at deadline.
func (p *presence) await(want map[string]bool, deadline time.Time) error {
	for !p.holds(want) {
		if time.Now().After(deadline) {
			p.mu.Lock()
			defer p.mu.Unlock()
			var missing, extra []string
			for s := range want {
				if !p.cur[s] {
					missing = append(missing, s)
				}
			}
			for s := range p.cur {
				if !want[s] {
					extra = append(extra, s)
				}
			}
			return fmt.Errorf("%d servers, want %d: %d missing (e.g. %v), %d extra (e.g. %v)",
				len(p.cur), len(want), len(missing), firstFew(missing), len(extra), firstFew(extra))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// since returns the time from t0 to when s appeared (or, if gone, left).
func (p *presence) since(s string, gone bool, t0 time.Time) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.appeared
	if gone {
		m = p.left
	}
	at, ok := m[s]
	return at.Sub(t0), ok
}

func firstFew(s []string) []string {
	slices.Sort(s)
	return s[:min(len(s), 3)]
}

func setOf(s []string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, x := range s {
		m[x] = true
	}
	return m
}

// logCounter is a slog.Handler for one or many ServerLists that prints
// nothing: it counts the records by level, message and error (with the
// numbers in the error masked), keeps an example of each, and counts the
// "servers changed" records (one per ring update).
type logCounter struct {
	mu         sync.Mutex
	counts     map[string]int
	examples   map[string]string
	suppressed int // what the library's rate limit held back, as it reported
	changes    int
}

func newLogCounter() *logCounter {
	return &logCounter{counts: map[string]int{}, examples: map[string]string{}}
}

var digitsRE = regexp.MustCompile(`[0-9]+`)

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	var errText string
	suppressed := 0
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "error":
			errText = a.Value.String()
		case "suppressed":
			suppressed = int(a.Value.Int64())
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.suppressed += suppressed
	if r.Message == "servers changed" {
		h.changes++
		return nil
	}
	key := r.Level.String() + " " + r.Message
	if errText != "" {
		key += ": " + digitsRE.ReplaceAllString(errText, "N")
	}
	if h.counts[key] == 0 {
		h.examples[key] = errText
	}
	h.counts[key]++
	return nil
}

// The records' service and namespace attributes are dropped: a test's
// ServerLists all have the same.
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }

func (h *logCounter) updates() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changes
}

// logSummary logs what the ServerLists logged, besides server changes.
func (h *logCounter) logSummary(t *testing.T, who string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := make([]string, 0, len(h.counts))
	for k := range h.counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return h.counts[keys[i]] > h.counts[keys[j]] })
	if len(keys) == 0 {
		t.Logf("%s logged no errors or warnings", who)
		return
	}
	t.Logf("%s logged (besides %d server changes; %d more errors held back by its rate limit):", who, h.changes, h.suppressed)
	for _, k := range keys {
		t.Logf("  %5d x %s (e.g. %q)", h.counts[k], strings.SplitN(k, ": ", 2)[0], h.examples[k])
	}
}

// raiseFileLimit makes sure this process may open n files, raising the soft
// RLIMIT_NOFILE towards the hard limit if needed. (Go raises the soft limit
// to the hard one at startup on Linux, so this only fails where the hard
// limit is low.)
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < n && lim.Max > lim.Cur {
		lim.Cur = min(max(n, 4096), lim.Max)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("raise RLIMIT_NOFILE to %d: %v", lim.Cur, err)
		}
		t.Logf("raised RLIMIT_NOFILE to %d", lim.Cur)
	}
	if lim.Cur < n {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d); this test needs %d open files (ulimit -n)", lim.Cur, lim.Max, n)
	}
}

// ms formats d in milliseconds for the report.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// reportRow writes a report row: name, n, p50, p90, p99 and max of ds.
func reportRow(t *testing.T, name string, ds []time.Duration) {
	t.Helper()
	report(t, "| %s | %d | %s | %s | %s | %s |\n", name, len(ds),
		ms(percentile(ds, 50)), ms(percentile(ds, 90)), ms(percentile(ds, 99)), ms(percentile(ds, 100)))
}
