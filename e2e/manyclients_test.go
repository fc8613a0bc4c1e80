package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

const (
	manyClients   = 200
	manyPort      = 6447 // the test's own API server
	manyLBPort    = 6448 // the load balancer in front of it
	manyBucket    = 100 * time.Millisecond
	manyChangeGap = 250 * time.Millisecond // see TestConvergence
)

// The audit policy of the test's API server: one event per request on
// EndpointSlices (when the response is complete, and when a watch's starts).
const manyAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources:
  - group: discovery.k8s.io
    resources: ["endpointslices"]
- level: None
`

// Scenario 12: 200 ServerLists in this one process, each with its own
// client and connection, on one Service, against an API server of the
// test's own (on the shared etcd, with an audit log of the EndpointSlice
// requests) behind a TCP load balancer (cluster.LB: TLS passes through);
// the controller manager and the fake kubelet use the primary.
//
// (a) A change (a pod not ready, ready again, a new pod ready, a graceful
// delete) reaches all 200: the time from the API write to each ServerList's
// OnChange hook, over all clients and changes, and, as a reference, to an
// admin client-go watch of the same slices on the primary.
//
// (b) The API server is killed and started again, twice. From its audit
// log, the LISTs the clients make while they reconnect, per second and per
// 100 ms. First the load balancer forwards as soon as the port is open, as
// if the clients dialled a single API server: a starting kube-apiserver
// binds its port seconds before it serves, so connections made meanwhile
// wait in its accept queue and are served together; that burst is
// reported, not asserted on. Then it forwards only once /readyz passes,
// as an HA control plane's load balancer does: the clients' own backoff
// is all that spreads their relists, and they must not arrive as one
// synchronized storm.
//
// (c) Nothing is lost: changes made while it was down reach all 200 after
// each restart, and a change after them too (the watches are back). Then
// all 200 are closed, and their goroutines must be gone.
func TestManyClients(t *testing.T) {
	// Each ServerList holds one HTTP/2 connection, and the load balancer
	// two sockets for it; a reconnect may overlap the old one's close.
	raiseFileLimit(t, 4*manyClients+1024)
	e := newEnv(t)
	pods := e.runPods(0, 4, podOpts{noProcess: true})

	// In the work dir, which a failed run keeps.
	policy, auditLog := filepath.Join(workDir, "kube-apiserver-many-audit-policy.yaml"), filepath.Join(workDir, "kube-apiserver-many-audit.log")
	if err := os.WriteFile(policy, []byte(manyAuditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	as, err := cp.StartAPIServer(e.ctx, "kube-apiserver-many", manyPort,
		"--audit-policy-file="+policy, "--audit-log-path="+auditLog, "--audit-log-mode=blocking")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { as.Proc.Stop(10 * time.Second) })
	lb, err := cluster.NewLB(as, manyLBPort, cluster.CheckTCP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Close) // after the ServerLists' Close
	t.Logf("started %s (audit log of EndpointSlice requests: %s) in %v, and a load balancer in front of it at %s",
		as.Name, auditLog, time.Since(start).Round(time.Millisecond), lb.URL)

	admin := &keyHistory{}
	e.watchReady(11211, func(at time.Time, s []string) { admin.add(at, strings.Join(s, ",")) })

	// The clients.
	goroutines := runtime.NumGoroutine()
	logs := newLogCounter()
	clients := make([]*keyHistory, manyClients)
	lists := make([]*selector.ServerList, manyClients)
	start = time.Now()
	err = forEach(manyClients, func(i int) error {
		h := &keyHistory{}
		clients[i] = h
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		ss, err := selector.NewServerList(ctx, serviceName+":11211",
			selector.WithAPIServer(lb.URL), selector.WithCAFile(as.CAFile), selector.WithTokenFile(e.tokenFile),
			selector.WithSlog(slog.New(logs)), selector.WithOnChange(h.addAddrs))
		lists[i] = ss
		return err
	})
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		_ = forEach(manyClients, func(i int) error {
			if lists[i] != nil {
				lists[i].Close()
			}
			return nil
		})
	}
	t.Cleanup(closeAll)
	if err != nil {
		t.Fatal(err)
	}
	key := func(pods []*cluster.Pod) string { return strings.Join(sorted(addrs(pods, 11211)), ",") }
	if _, err := awaitAll(clients, key(pods), start, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ServerLists started in %v, each with its own connection", manyClients, time.Since(start).Round(time.Millisecond))

	// (a) Changes reach every client.
	byKind := map[string][]time.Duration{}
	var all, slice, libOnly, spread []time.Duration
	change := func(kind string, want []*cluster.Pod, write func() error) {
		t.Helper()
		t0 := time.Now()
		if err := write(); err != nil {
			t.Fatal(err)
		}
		k := key(want)
		ds, err := awaitAll(clients, k, t0, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		da, err := awaitAll([]*keyHistory{admin}, k, t0, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: admin watch: %v", kind, err)
		}
		byKind[kind] = append(byKind[kind], ds...)
		all = append(all, ds...)
		slice = append(slice, da[0])
		for _, d := range ds {
			libOnly = append(libOnly, max(d-da[0], 0))
		}
		spread = append(spread, slices.Max(ds)-slices.Min(ds))
		time.Sleep(manyChangeGap)
	}
	pods, next := e.changeRounds(t, 3, pods, change)
	t.Logf("(a) a change reaches all %d ServerLists; from the API write, over %d changes x %d clients:", manyClients, len(spread), manyClients)
	for _, kind := range changeKinds {
		t.Logf("  %-16s %s", kind, summarize(byKind[kind]))
	}
	t.Logf("  %-16s %s", "all", summarize(all))
	t.Logf("  %-16s %s", "slice", summarize(slice))
	t.Logf("  %-16s %s", "ours - slice", summarize(libOnly))
	t.Logf("  %-16s %s", "first to last", summarize(spread))

	// (b) The API server restarts; the clients reconnect. While it is
	// down, through the primary: one pod turns not ready (or ready again)
	// and a new pod starts.
	type restart struct {
		check      cluster.HealthCheck
		h          *reconnects
		back       []time.Duration // from the kill to each client having the changes
		want       []*cluster.Pod  // the ready pods after it
		down, read time.Duration   // from the kill to the start, from the start to /readyz
	}
	restartOnce := func(check cluster.HealthCheck, flip *cluster.Pod, ready bool, want []*cluster.Pod) restart {
		t.Helper()
		lb.SetCheck(check)
		time.Sleep(200 * time.Millisecond) // a few probes
		statsBefore := make([]selector.Stats, manyClients)
		for i, ss := range lists {
			statsBefore[i] = ss.Stats()
		}
		killAt := time.Now()
		as.Kill()
		if err := flip.SetReady(e.ctx, ready); err != nil {
			t.Fatal(err)
		}
		newPod, err := e.runPod(fmt.Sprintf("mc-%d", next), podOpts{noProcess: true})
		if err != nil {
			t.Fatal(err)
		}
		next++
		want = append(want, newPod)
		if _, err := awaitAll([]*keyHistory{admin}, key(want), killAt, 10*time.Second); err != nil {
			t.Fatalf("admin watch: %v", err)
		}
		for _, c := range clients {
			if c.latest() == key(want) {
				t.Fatal("a client has the changes made while its API server was down")
			}
		}
		startAt := time.Now()
		if err := as.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		r := restart{check: check, want: want, down: startAt.Sub(killAt), read: time.Since(startAt)}
		r.back, err = awaitAll(clients, key(want), killAt, 90*time.Second)
		if err != nil {
			t.Fatalf("(c) after the restart (load balancer health check %s): %v", check, err)
		}

		// The relists, from the audit log: the successful ones must add
		// up to what the clients' Stats count.
		relists, rewatches := 0, 0
		for i, ss := range lists {
			s := ss.Stats()
			relists += s.Relists - statsBefore[i].Relists
			rewatches += s.WatchRestarts - statsBefore[i].WatchRestarts
		}
		var reqs []auditRequest
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			reqs, err = readAudit(auditLog, e.ns, killAt)
			if err != nil {
				t.Fatal(err)
			}
			ok := 0
			for _, r := range reqs {
				if r.verb == "list" && r.code == 200 {
					ok++
				}
			}
			if ok >= relists {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("the audit log has %d successful LISTs since the kill, the clients' Stats count %d relists", ok, relists)
			}
		}
		r.h = histogram(reqs, lb.Accepted(), killAt)
		r.h.relists, r.h.rewatches = relists, rewatches
		t.Logf("(b) load balancer health check %s: killed %s; started it again %v later (the changes made while it was down in the EndpointSlices); ready %v after its start",
			check, as.Name, r.down.Round(time.Millisecond), r.read.Round(time.Millisecond))
		r.h.log(t, manyClients, startAt.Sub(killAt), startAt.Sub(killAt)+r.read)
		t.Logf("(c) the changes made while it was down reached all %d ServerLists; from the kill: %s", manyClients, summarize(r.back))
		return r
	}
	tcp := restartOnce(cluster.CheckTCP, pods[0], false, slices.Clone(pods[1:]))
	pods = append(pods, tcp.want[len(tcp.want)-1]) // its new pod
	ready := restartOnce(cluster.CheckReady, pods[0], true, slices.Clone(pods))
	pods = ready.want

	// (c) A change after the restarts: the watches are back.
	t0 := time.Now()
	if err := pods[1].SetReady(e.ctx, false); err != nil {
		t.Fatal(err)
	}
	rest := slices.DeleteFunc(slices.Clone(pods), func(p *cluster.Pod) bool { return p == pods[1] })
	after, err := awaitAll(clients, key(rest), t0, 10*time.Second)
	if err != nil {
		t.Fatalf("(c) a change after the restarts: %v", err)
	}
	t.Logf("(c) a change after the restarts reached all %d: %s", manyClients, summarize(after))
	logs.logSummary(t, fmt.Sprintf("the %d ServerLists", manyClients))

	report(t, "### Many clients on one API server\n\n%d ServerLists in one process, each with its own connection, on one Service. "+
		"(a) From an API write to each ServerList's OnChange hook, over %d changes x %d clients; \"EndpointSlice alone\" is a client-go watch of the slices (on the primary API server), \"first to last\" the spread over the clients of one change.\n\n"+
		"| change | n | p50 | p90 | p99 | max |\n|---|---|---|---|---|---|\n", manyClients, len(spread), manyClients)
	for _, kind := range changeKinds {
		reportRow(t, kind, byKind[kind])
	}
	reportRow(t, "**all**", all)
	reportRow(t, "EndpointSlice alone", slice)
	reportRow(t, "library alone", libOnly)
	reportRow(t, "first to last", spread)
	reportRow(t, "(c) changes made while the API server was down (port-open LB), from the kill", tcp.back)
	reportRow(t, "(c) changes made while the API server was down (readyz LB), from the kill", ready.back)
	reportRow(t, "(c) a change after the restarts", after)
	for _, r := range []restart{tcp, ready} {
		report(t, "\n(b) The API server killed, started again %d ms later and ready %.1f s after its start, behind a load balancer whose health check is %s. Requests on the Service's EndpointSlices from its audit log, and connections through the load balancer, per second from the kill:\n\n",
			r.down.Milliseconds(), r.read.Seconds(), r.check)
		r.h.report(t)
	}

	// (b) No synchronized storm, when the clients' backoff is what
	// spreads them.
	if h := ready.h; h.maxBucket > manyClients/2 {
		t.Errorf("readyz load balancer: %d LISTs in one 100ms bucket: more than half the %d clients relisted at once", h.maxBucket, manyClients)
	} else if h.buckets < 5 {
		t.Errorf("readyz load balancer: the LISTs came in %d distinct 100ms buckets, want them spread over at least 5", h.buckets)
	}
	for _, r := range []restart{tcp, ready} {
		if n := r.h.lists[200] + r.h.failed(); n > 3*manyClients {
			t.Errorf("%s load balancer: %d LISTs by %d clients after one restart: a relist loop?", r.check, n, manyClients)
		}
	}

	closeAll()
	var n int
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= goroutines+20 {
			break
		}
	}
	t.Logf("closed all %d ServerLists: %d goroutines, %d before they started", manyClients, n, goroutines)
	if n > goroutines+20 {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines 10s after closing the %d ServerLists, %d before they started:\n%s", n, manyClients, goroutines, b.String()[:min(b.Len(), 4000)])
	}
}

// keyHistory records the server sets a ServerList's OnChange hook (or an
// admin watch) saw, each as its sorted addresses joined with commas.
type keyHistory struct {
	mu   sync.Mutex
	hist []keyAt
}

type keyAt struct {
	at  time.Time
	key string
}

func (h *keyHistory) add(at time.Time, key string) {
	h.mu.Lock()
	h.hist = append(h.hist, keyAt{at, key})
	h.mu.Unlock()
}

func (h *keyHistory) addAddrs(servers []net.Addr) {
	at := time.Now()
	s := make([]string, len(servers))
	for i, a := range servers {
		s[i] = a.String()
	}
	sort.Strings(s)
	h.add(at, strings.Join(s, ","))
}

func (h *keyHistory) latest() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.hist) == 0 {
		return ""
	}
	return h.hist[len(h.hist)-1].key
}

// since returns the time from t0 to when the current set, key, began.
func (h *keyHistory) since(key string, t0 time.Time) (time.Duration, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := len(h.hist) - 1
	if i < 0 || h.hist[i].key != key {
		return 0, fmt.Errorf("the set is not %s", key)
	}
	for i > 0 && h.hist[i-1].key == key {
		i--
	}
	if h.hist[i].at.Before(t0) {
		return 0, fmt.Errorf("the set was %s before the write", key)
	}
	return h.hist[i].at.Sub(t0), nil
}

// awaitAll waits until every history's set is key and returns, for each,
// the time from t0 to when it became key.
func awaitAll(hs []*keyHistory, key string, t0 time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := t0.Add(timeout)
	for {
		behind := 0
		for _, h := range hs {
			if h.latest() != key {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d do not have %s after %v", behind, len(hs), key, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ds := make([]time.Duration, len(hs))
	for i, h := range hs {
		d, err := h.since(key, t0)
		if err != nil {
			return nil, err
		}
		ds[i] = d
	}
	return ds, nil
}

// auditRequest is one request in the audit log.
type auditRequest struct {
	verb string
	at   time.Time // requestReceivedTimestamp
	code int
}

// readAudit returns the EndpointSlice requests in namespace ns received at
// or after since, one per request, in order of arrival.
func readAudit(path, ns string, since time.Time) ([]auditRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type event struct {
		AuditID   string    `json:"auditID"`
		Stage     string    `json:"stage"`
		Verb      string    `json:"verb"`
		Received  time.Time `json:"requestReceivedTimestamp"`
		ObjectRef struct {
			Namespace string `json:"namespace"`
		} `json:"objectRef"`
		ResponseStatus struct {
			Code int `json:"code"`
		} `json:"responseStatus"`
	}
	byID := map[string]*auditRequest{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line cut short by the kill
		}
		if ev.ObjectRef.Namespace != ns || ev.Received.Before(since) {
			continue
		}
		r, ok := byID[ev.AuditID]
		if !ok {
			r = &auditRequest{verb: ev.Verb, at: ev.Received}
			byID[ev.AuditID] = r
			order = append(order, ev.AuditID)
		}
		if ev.ResponseStatus.Code != 0 {
			r.code = ev.ResponseStatus.Code
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]auditRequest, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out, nil
}

// reconnects is a histogram of the requests after an API server restart.
type reconnects struct {
	seconds   []reconnectSecond
	buckets   int // distinct 100ms buckets with a LIST
	maxBucket int // LISTs in the busiest 100ms bucket
	maxAt     time.Duration
	lists     map[int]int // by status code
	watches   map[int]int
	conns     int // accepted by the load balancer

	relists, rewatches int // from the clients' Stats
}

type reconnectSecond struct {
	lists, listsOK, watches, conns int
	codes                          map[int]int // of the LISTs that failed
	max100ms                       int
}

// histogram counts reqs and the load balancer's accepted connections per
// second and per 100ms bucket from zero.
func histogram(reqs []auditRequest, accepted []time.Time, zero time.Time) *reconnects {
	h := &reconnects{lists: map[int]int{}, watches: map[int]int{}}
	second := func(at time.Time) *reconnectSecond {
		s := int(max(at.Sub(zero), 0) / time.Second)
		for len(h.seconds) <= s {
			h.seconds = append(h.seconds, reconnectSecond{codes: map[int]int{}})
		}
		return &h.seconds[s]
	}
	for _, at := range accepted {
		if !at.Before(zero) {
			second(at).conns++
			h.conns++
		}
	}
	per100 := map[int]int{}
	for _, r := range reqs {
		sec := second(r.at)
		if r.verb != "list" {
			sec.watches++
			h.watches[r.code]++
			continue
		}
		h.lists[r.code]++
		sec.lists++
		if r.code == 200 {
			sec.listsOK++
		} else {
			sec.codes[r.code]++
		}
		b := int(max(r.at.Sub(zero), 0) / manyBucket)
		per100[b]++
		if per100[b] > h.maxBucket {
			h.maxBucket, h.maxAt = per100[b], time.Duration(b)*manyBucket
		}
		sec.max100ms = max(sec.max100ms, per100[b])
	}
	h.buckets = len(per100)
	return h
}

// failed counts the LISTs that did not succeed.
func (h *reconnects) failed() int {
	n := 0
	for code, c := range h.lists {
		if code != 200 {
			n += c
		}
	}
	return n
}

func codes(m map[int]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d x %d", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// log logs the histogram; started and ready are the API server's start and
// readiness, from the kill.
func (h *reconnects) log(t *testing.T, clients int, started, ready time.Duration) {
	t.Helper()
	t.Logf("  EndpointSlice requests from the audit log: LISTs %s; WATCHes %s; the clients' Stats: %d relists, %d watch restarts; %d connections through the load balancer",
		codes(h.lists), codes(h.watches), h.relists, h.rewatches, h.conns)
	t.Logf("  %-6s %6s %6s %-16s %8s %14s %6s   (seconds from the kill; started at %.1f, ready at %.1f)", "second", "LISTs", "OK", "failed", "WATCHes", "max per 100ms", "conns", started.Seconds(), ready.Seconds())
	for i, s := range h.seconds {
		if s.lists == 0 && s.watches == 0 && s.conns == 0 {
			continue
		}
		t.Logf("  %-6d %6d %6d %-16s %8d %14d %6d", i, s.lists, s.listsOK, codes(s.codes), s.watches, s.max100ms, s.conns)
	}
	t.Logf("  the LISTs of %d clients came in %d distinct 100ms buckets; the busiest had %d (%.0f%% of the clients), %v after the kill",
		clients, h.buckets, h.maxBucket, 100*float64(h.maxBucket)/float64(clients), h.maxAt)
}

func (h *reconnects) report(t *testing.T) {
	t.Helper()
	report(t, "| second | LISTs | OK | failed | WATCHes | max LISTs per 100 ms | connections |\n|---|---|---|---|---|---|---|\n")
	for i, s := range h.seconds {
		if s.lists == 0 && s.watches == 0 && s.conns == 0 {
			continue
		}
		report(t, "| %d | %d | %d | %s | %d | %d | %d |\n", i, s.lists, s.listsOK, codes(s.codes), s.watches, s.max100ms, s.conns)
	}
	report(t, "\nThe LISTs came in %d distinct 100 ms buckets; the busiest had %d, of %d clients (%d relists and %d watch restarts by their Stats).\n\n",
		h.buckets, h.maxBucket, manyClients, h.relists, h.rewatches)
}
