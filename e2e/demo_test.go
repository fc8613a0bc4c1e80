package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/demo"
)

var demoApp = flag.String("e2e.demo-app", ".bin/demo-app", "the examples/demo binary (run.sh builds it)")

// `make demo`, end to end in its short mode (2,000 keys, shorter waits, the
// same steps), on the suite's control plane: the example manifests applied
// in a namespace of its own, examples/demo run as their ServiceAccount. The
// test checks the summary the program writes with -summary-json, for both
// paths of its traffic (memcache.NewFromSelector and selector.Client), and
// that its output shows them: the rows of the rolling restart and the kill,
// and the summary's line on the Client; and the step in which a whole zone
// is lost (checkDemoZone).
func TestDemo(t *testing.T) {
	dumpLogsOnFailure(t)
	app, err := filepath.Abs(*demoApp)
	if err == nil {
		_, err = os.Stat(app)
	}
	if err != nil {
		t.Fatalf("examples/demo: %v (e2e/run.sh builds it into e2e/.bin/demo-app)", err)
	}
	dir := t.TempDir()
	var out lockedBuffer
	err = demo.Run(t.Context(), demo.Config{
		Client:      cp.Client,
		Kubelet:     kubelet,
		APIServer:   cp.APIServer,
		Namespace:   fmt.Sprintf("e2e-%d-demo", nsSeq.Add(1)),
		Manifests:   *manifestsDir,
		App:         app,
		Dir:         dir,
		LogFile:     filepath.Join(dir, "library.log"),
		Short:       true,
		SummaryJSON: filepath.Join(dir, "summary.json"),
		Out:         &out,
	})
	t.Logf("the demo's output:\n%s", out.String())
	if err != nil {
		t.Logf("the library's log:\n%s", cluster.Tail(filepath.Join(dir, "library.log"), 40))
		t.Fatal(err)
	}

	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s demoSummary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary.json: %v\n%s", err, b)
	}

	if s.ServersDiscovered != 5 || s.ServersAfterScale != 6 {
		t.Errorf("servers: %d discovered, %d after the scale-up; want 5 and 6", s.ServersDiscovered, s.ServersAfterScale)
	}
	// 5 -> 6 keeps 5/6 of the keys on a ring; modulo keeps about 1/6.
	if s.RingHitRate < 0.75 || s.RingHitRate > 0.92 {
		t.Errorf("hit rate after the scale-up: %.3f, want about 5/6 (0.75-0.92)", s.RingHitRate)
	}
	if s.RingHitRate <= s.ModuloHitRate {
		t.Errorf("hit rate after the scale-up: ring %.3f, not above modulo's %.3f", s.RingHitRate, s.ModuloHitRate)
	}

	// The rolling restart, on both paths: no request to a stopped pod.
	r := s.Roll
	if r.Steps != 6 || r.ServersAfter != 6 || r.Selector.During.Requests < 1000 || r.Client.During.Requests < 1000 {
		t.Errorf("rolling restart: %d steps, %d servers after, %d and %d requests; want 6, 6 and traffic on both paths",
			r.Steps, r.ServersAfter, r.Selector.During.Requests, r.Client.During.Requests)
	}
	for _, p := range []struct {
		name string
		c    demoCounts
	}{{"selector only", r.Selector.During}, {"selector.Client", r.Client.During}} {
		if p.c.RoutingErrors != 0 {
			t.Errorf("rolling restart, %s: %d routing errors (requests to a stopped pod), want 0", p.name, p.c.RoutingErrors)
		}
		if other := p.c.Errors - p.c.RoutingErrors; other*1000 > p.c.Requests {
			t.Errorf("rolling restart, %s: %d other errors in %d requests", p.name, other, p.c.Requests)
		}
	}
	// Both start warm; the Client's handoff keeps its hit rate within a few
	// points of that while keys move, which selector only does not. (In
	// short mode a key is read about once a second, so most keys of a pod
	// leaving are read, and handed off, during its 2s preStop sleep; a
	// slower machine reads fewer, hence 5 points, not 1.)
	if r.Selector.Before.Requests == 0 || r.Client.Before.Requests == 0 {
		t.Errorf("rolling restart: %d and %d requests before the first step; want traffic on both paths",
			r.Selector.Before.Requests, r.Client.Before.Requests)
	}
	if r.Client.Before.HitRate < 0.95 {
		t.Errorf("rolling restart, selector.Client: hit rate %.3f before the roll, want a warm cache (0.95 or more)", r.Client.Before.HitRate)
	}
	if drop := r.Client.Before.HitRate - r.Client.During.HitRate; drop > 0.05 {
		t.Errorf("rolling restart, selector.Client: hit rate %.3f before the roll, %.3f during; want a drop of 5 points at most",
			r.Client.Before.HitRate, r.Client.During.HitRate)
	}
	// The keys nobody read during the roll: the Client moved them, its
	// own and selector only's, which sit on the same pods.
	if r.ColdKeys == 0 || float64(r.Client.ColdFound) < 0.999*float64(r.ColdKeys) || float64(r.Selector.ColdFound) < 0.999*float64(r.ColdKeys) {
		t.Errorf("rolling restart: of %d keys not read during it, %d found after it through selector.Client, %d through selector only; want 99.9%% at least of each (the Client moves them)",
			r.ColdKeys, r.Client.ColdFound, r.Selector.ColdFound)
	}
	if r.Client.During.HitRate <= r.Selector.During.HitRate {
		t.Errorf("rolling restart: hit rate %.3f with selector.Client, not above selector only's %.3f",
			r.Client.During.HitRate, r.Selector.During.HitRate)
	}

	// The kill: selector only fails for the dead pod's keys until it turns
	// NotReady; the Client fails over at once and never fails.
	k := s.Kill
	ks, kc := k.Selector, k.Client
	if ks.Killed.Errors == 0 {
		t.Errorf("kill, selector only: no errors between the SIGKILL and NotReady; want some (was memcached killed?)")
	}
	if ks.NotReady.Errors != 0 || ks.Restarted.Errors != 0 {
		t.Errorf("kill, selector only: %d errors after the pod turned NotReady, %d after it came back; want 0 and 0", ks.NotReady.Errors, ks.Restarted.Errors)
	}
	if kc.Killed.Errors != 0 || kc.NotReady.Errors != 0 || kc.Restarted.Errors != 0 {
		t.Errorf("kill, selector.Client: %d errors until NotReady, %d until back, %d after; want none (failover)",
			kc.Killed.Errors, kc.NotReady.Errors, kc.Restarted.Errors)
	}
	if kc.Killed.Requests == 0 {
		t.Errorf("kill, selector.Client: no requests between the SIGKILL and NotReady; want traffic")
	}
	if k.ServersAfter != 6 || ks.Restarted.Requests == 0 || kc.Restarted.Requests == 0 {
		t.Errorf("kill: %d servers after the restart, %d and %d requests; want 6 and traffic on both paths",
			k.ServersAfter, ks.Restarted.Requests, kc.Restarted.Requests)
	}

	checkDemoZone(t, s)
	checkDemoOutput(t, out.String(), s)
	checkDemoZoneOutput(t, out.String(), s)
}

// checkDemoOutput checks that the demo printed the rows of both paths in
// the rolling restart and the kill, with the numbers of its summary, and
// the summary's line on the Client.
func checkDemoOutput(t *testing.T, out string, s demoSummary) {
	t.Helper()
	// A row of a traffic table: label, time, servers, then errors and hit
	// rate for selector only and for the Client.
	rowOf := func(label string) []string {
		re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) +
			`.*?\s([\d.]+)s\s+\d+\s+([\d,]+)\s+([\d.]+)%\s+([\d,]+)\s+([\d.]+)%$`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("the demo's output has no row %q with errors and hit rate for both paths", label)
		}
		return m
	}
	errorsOf := func(m []string, i int) int64 {
		n, _ := strconv.ParseInt(strings.ReplaceAll(m[i], ",", ""), 10, 64)
		return n
	}
	if n := len(regexp.MustCompile(`(?m)^ +selector only +selector\.Client$`).FindAllString(out, -1)); n != 2 {
		t.Errorf("the demo's output names the paths (selector only, selector.Client) over %d tables, want 2", n)
	}
	if m := rowOf("before the roll"); m != nil {
		if got := m[5] + "%"; got != pct(s.Roll.Client.Before.HitRate) {
			t.Errorf("row %q: the Client's hit rate %s, the summary's %s", "before the roll", got, pct(s.Roll.Client.Before.HitRate))
		}
	}
	for i := 1; i <= s.Roll.Steps; i++ {
		rowOf(fmt.Sprintf("%d/%d ", i, s.Roll.Steps))
	}
	if m := rowOf("killed, still in the ring"); m != nil {
		if sel, cl := errorsOf(m, 2), errorsOf(m, 4); sel != s.Kill.Selector.Killed.Errors || cl != s.Kill.Client.Killed.Errors {
			t.Errorf("row %q: errors %d and %d, the summary's %d and %d", "killed, still in the ring",
				sel, cl, s.Kill.Selector.Killed.Errors, s.Kill.Client.Killed.Errors)
		}
	}
	rowOf("NotReady: out of the ring")
	rowOf("restarted: back in the ring")
	want := "  selector.Client    0 errors after the kill"
	if !strings.Contains(out, want) {
		t.Errorf("the demo's summary has no line %q...", want)
	}
	if want := "hit rate " + pct(s.Roll.Client.During.HitRate) + " during the roll (not " + pct(s.Roll.Selector.During.HitRate) + ")"; !strings.Contains(out, want) {
		t.Errorf("the demo's summary does not say %q", want)
	}
}

// pct formats a rate as the demo does.
func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// demoSummary is the part of examples/demo's -summary-json the test reads.
type demoSummary struct {
	Keys              int     `json:"keys"`
	ServersDiscovered int     `json:"servers_discovered"`
	ServersAfterScale int     `json:"servers_after_scale"`
	RingHitRate       float64 `json:"ring_hit_rate"`
	ModuloHitRate     float64 `json:"modulo_hit_rate"`
	Roll              struct {
		Steps        int            `json:"steps"`
		ServersAfter int            `json:"servers_after"`
		ColdKeys     int            `json:"cold_keys"`
		Selector     demoRollCounts `json:"selector"`
		Client       demoRollCounts `json:"client"`
	} `json:"roll"`
	Kill struct {
		ServersAfter int            `json:"servers_after"`
		Selector     demoKillCounts `json:"selector"`
		Client       demoKillCounts `json:"client"`
	} `json:"kill"`
	Zone demoZone `json:"zone"`
}

type demoRollCounts struct {
	Before    demoCounts `json:"before"`
	During    demoCounts `json:"during"`
	ColdFound int        `json:"cold_found"`
}

type demoKillCounts struct {
	Killed    demoCounts `json:"killed"`
	NotReady  demoCounts `json:"not_ready"`
	Restarted demoCounts `json:"restarted"`
}

type demoCounts struct {
	Requests      int64   `json:"requests"`
	Hits          int64   `json:"hits"`
	Errors        int64   `json:"errors"`
	RoutingErrors int64   `json:"routing_errors"`
	HitRate       float64 `json:"hit_rate"`
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
