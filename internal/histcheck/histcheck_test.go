package histcheck

import (
	"flag"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The bounded run is what go test runs; make bench-e2e runs the long one:
//
//	go test ./internal/histcheck -run TestHistory -v -histcheck.duration 60s
//
// A failure prints the seed; HISTCHECK_SEED or -histcheck.seed runs the
// same schedules again (the same steps and operation mix; the interleaving
// of the operations is the machine's).
var (
	seedFlag     = flag.Uint64("histcheck.seed", 0, "the run's seed (default $HISTCHECK_SEED, else random)")
	durationFlag = flag.Duration("histcheck.duration", 1500*time.Millisecond, "how long each schedule runs its rounds")
	workersFlag  = flag.Int("histcheck.workers", DefaultWorkload.Workers, "goroutines issuing operations, per target")
	targetsFlag  = flag.String("histcheck.targets", "client,client-replicated,gomemcache",
		"the targets, run side by side on each schedule: client, client-replicated, client-byzone-static, gomemcache")
	logFlag = flag.Bool("histcheck.log", false, "the Clients' log, at debug level, on stderr")
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

// TestHistory runs every schedule, each a subtest, against each target
// at once (the same steps, from the same seed), and checks the histories:
// the Client must serve no stale read in any schedule, with any pool kind
// that a static list allows; gomemcache's client, the control, must serve
// stale reads where a schedule is expected to show them (the checker is
// sensitive). Each target is a subtest of its schedule:
// TestHistory/move-back/client.
func TestHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("the history checker runs real memcached for a while; not in -short")
	}
	bin, err := MemcachedPath()
	if err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if v, err := exec.Command(bin, "-V").Output(); err == nil { // for the report (see benchreport)
		t.Logf("server: %s", strings.TrimSpace(string(v)))
	}
	w := DefaultWorkload
	w.Workers = *workersFlag
	cfg := Config{Seed: runSeed(t), Duration: *durationFlag, Workload: w, Params: DefaultParams}
	if *logFlag {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var kinds []TargetKind
	for k := range strings.SplitSeq(*targetsFlag, ",") {
		kinds = append(kinds, TargetKind(k))
	}
	t.Logf("seed %d (rerun with HISTCHECK_SEED=%d)", cfg.Seed, cfg.Seed)

	var summary []string
	for _, s := range Schedules {
		t.Run(s.Name, func(t *testing.T) {
			reports := make([]*Report, len(kinds))
			errs := make([]error, len(kinds))
			var wg sync.WaitGroup
			for i, k := range kinds {
				wg.Go(func() { reports[i], errs[i] = Run(s, k, cfg) })
			}
			wg.Wait()
			for i, k := range kinds {
				t.Run(string(k), func(t *testing.T) {
					r := reports[i]
					if errs[i] != nil {
						t.Fatal(errs[i])
					}
					t.Log("\n" + r.String())
					line := r.Summary()
					if s.Known != "" {
						line += " known-gap" // internal/benchreport reports it apart
					}
					summary = append(summary, line)
					judge(t, s, r)
				})
			}
		})
	}
	t.Logf("seed %d\n%s", cfg.Seed, strings.Join(summary, "\n"))
}

// judge fails the Client on any stale read, and the control where it
// served none but was expected to.
func judge(t *testing.T, s Schedule, r *Report) {
	if r.Result.Unknown > 0 {
		t.Errorf("%d reads of values no operation wrote", r.Result.Unknown)
	}
	n := len(r.Result.Stale)
	switch {
	case r.Target != Gomemcache && n > 0 && s.Known != "":
		t.Logf("%d stale reads by the Client, where it cannot know better: %s", n, s.Known)
	case r.Target != Gomemcache && n > 0:
		t.Errorf("%d stale reads by the Client (schedule seed %d); first:\n%s", n, r.Seed, FormatStale(r.Result.Stale[0]))
	case r.Target == Gomemcache && s.Control && n == 0:
		t.Errorf("gomemcache served no stale read in %s, where it is expected to: the checker is blind", s.Name)
	}
	for _, c := range r.Counts {
		if c.Failed() {
			t.Errorf("kept %v", c)
		}
	}
	if s.Loads && (r.Ops["getorload"]+r.Ops["cache-aside"] == 0 || r.Loads == 0) {
		t.Errorf("the loads did nothing: %d reads through the cache, %d database reads", r.Ops["getorload"]+r.Ops["cache-aside"], r.Loads)
	}
	if s.Params != nil {
		var p Params
		s.Params(&p)
		if p.Deadline > 0 && r.Stalls == 0 {
			t.Errorf("no write was stalled: the schedule did nothing")
		}
	}
	judgeKillErrors(t, r)
}

// judgeKillErrors fails the Client on any error that reached the
// application after a kill but for the unavoidable ones (see unavoidable),
// which it logs: the bar is 0, as e2e's TestClientKill has it. The control
// fails requests to a dead server by design.
func judgeKillErrors(t *testing.T, r *Report) {
	if r.KillErrors == nil || r.Target == Gomemcache {
		return
	}
	if n := sum(r.KillErrors) - sum(r.AvoidableKillErrors()); n > 0 {
		t.Logf("%d errors after the kills that no client can spare (an Increment on a broken connection, a timeout)", n)
	}
	if a := r.AvoidableKillErrors(); len(a) > 0 {
		t.Errorf("%d errors reached the application after the kills (phases %v), by method and kind: %v", sum(a), r.KillPhases, a)
	}
}
