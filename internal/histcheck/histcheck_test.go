package histcheck

import (
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The bounded run is what go test runs; make bench-e2e runs the long one:
//
//	go test ./internal/histcheck -run 'TestHistory' -v -histcheck.duration 60s
//
// A failure prints the seed; HISTCHECK_SEED or -histcheck.seed runs the
// same schedules again (the same steps and operation mix; the interleaving
// of the operations is the machine's).
var (
	seedFlag     = flag.Uint64("histcheck.seed", 0, "the run's seed (default $HISTCHECK_SEED, else random)")
	durationFlag = flag.Duration("histcheck.duration", 2500*time.Millisecond, "how long each schedule runs its rounds")
	workersFlag  = flag.Int("histcheck.workers", DefaultWorkload.Workers, "goroutines issuing operations")
)

func runSeed(t *testing.T) uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	if s := os.Getenv("HISTCHECK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HISTCHECK_SEED=%q: %v", s, err)
		}
		return n
	}
	return rand.Uint64() >> 1
}

func config(t *testing.T) Config {
	if testing.Short() {
		t.Skip("the history checker runs real memcached for a while; not in -short")
	}
	if _, err := MemcachedPath(); err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	w := DefaultWorkload
	w.Workers = *workersFlag
	cfg := Config{Seed: runSeed(t), Duration: *durationFlag, Workload: w, Params: DefaultParams}
	t.Logf("seed %d (rerun with HISTCHECK_SEED=%d)", cfg.Seed, cfg.Seed)
	return cfg
}

// runAll runs every schedule against targets of kind k, each a subtest,
// and logs a summary table; check judges each report.
func runAll(t *testing.T, k TargetKind, check func(t *testing.T, s Schedule, r *Report)) {
	cfg := config(t)
	var lines []string
	for _, s := range Schedules {
		t.Run(s.Name, func(t *testing.T) {
			r, err := Run(s, k, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + r.String())
			lines = append(lines, r.Summary())
			if r.Result.Unknown > 0 {
				t.Errorf("%d reads of values no operation wrote", r.Result.Unknown)
			}
			check(t, s, r)
		})
	}
	t.Log("seed " + strconv.FormatUint(cfg.Seed, 10) + "\n" + strings.Join(lines, "\n"))
}

// The Client must never serve a stale read, in any schedule, in any pool
// kind that a static list allows.
func TestHistoryClient(t *testing.T) {
	t.Parallel()
	runAll(t, ClientSharded, noStale)
}

func TestHistoryClientReplicated(t *testing.T) {
	t.Parallel()
	runAll(t, ClientReplicated, noStale)
}

func noStale(t *testing.T, _ Schedule, r *Report) {
	if n := len(r.Result.Stale); n > 0 {
		t.Errorf("%d stale reads by the Client (seed %d); first: %s", n, r.Seed, FormatStale(r.Result.Stale[0]))
	}
}

// The checker is sensitive: gomemcache's own client over the same
// ServerList, which neither fails over nor hands keys off, serves stale
// reads where a ring change brings a server back to keys written elsewhere
// meanwhile.
func TestHistoryControl(t *testing.T) {
	t.Parallel()
	runAll(t, Gomemcache, func(t *testing.T, s Schedule, r *Report) {
		if s.Control && len(r.Result.Stale) == 0 {
			t.Errorf("gomemcache served no stale read in %s, where it is expected to: the checker is blind", s.Name)
		}
	})
}
