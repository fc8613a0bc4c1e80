package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/demo"
)

var demoApp = flag.String("e2e.demo-app", ".bin/demo-app", "the examples/demo binary (run.sh builds it)")

// `make demo`, end to end in its short mode (2,000 keys, shorter waits, the
// same steps), on the suite's control plane: the example manifests applied
// in a namespace of its own, examples/demo run as their ServiceAccount. The
// test checks the summary the program writes with -summary-json.
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

	r := s.Roll
	if r.Steps != 6 || r.ServersAfter != 6 || r.Requests < 1000 {
		t.Errorf("rolling restart: %d steps, %d servers after, %d requests; want 6, 6 and traffic", r.Steps, r.ServersAfter, r.Requests)
	}
	if r.RoutingErrors != 0 {
		t.Errorf("rolling restart: %d routing errors (requests to a stopped pod), want 0", r.RoutingErrors)
	}
	if other := r.Errors - r.RoutingErrors; other*1000 > r.Requests {
		t.Errorf("rolling restart: %d other errors in %d requests", other, r.Requests)
	}

	k := s.Kill
	if k.Killed.Errors == 0 {
		t.Errorf("kill: no errors between the SIGKILL and NotReady; want some (was memcached killed?)")
	}
	if k.NotReady.Errors != 0 || k.Restarted.Errors != 0 {
		t.Errorf("kill: %d errors after the pod turned NotReady, %d after it came back; want 0 and 0", k.NotReady.Errors, k.Restarted.Errors)
	}
	if k.ServersAfter != 6 || k.Restarted.Requests == 0 {
		t.Errorf("kill: %d servers after the restart, %d requests; want 6 and traffic", k.ServersAfter, k.Restarted.Requests)
	}
}

// demoSummary is the part of examples/demo's -summary-json the test reads.
type demoSummary struct {
	ServersDiscovered int     `json:"servers_discovered"`
	ServersAfterScale int     `json:"servers_after_scale"`
	RingHitRate       float64 `json:"ring_hit_rate"`
	ModuloHitRate     float64 `json:"modulo_hit_rate"`
	Roll              struct {
		Steps        int `json:"steps"`
		ServersAfter int `json:"servers_after"`
		demoCounts
	} `json:"roll"`
	Kill struct {
		Killed       demoCounts `json:"killed"`
		NotReady     demoCounts `json:"not_ready"`
		Restarted    demoCounts `json:"restarted"`
		ServersAfter int        `json:"servers_after"`
	} `json:"kill"`
}

type demoCounts struct {
	Requests      int64 `json:"requests"`
	Errors        int64 `json:"errors"`
	RoutingErrors int64 `json:"routing_errors"`
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
