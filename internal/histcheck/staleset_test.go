package histcheck

import (
	"os"
	"testing"
)

// TestStaleSet runs the stale-set schedule (see RunStaleSet) with
// GetOrLoad and with plain cache-aside, side by side: GetOrLoad must leave
// no key stale in the cache. Plain cache-aside's count is the control,
// logged: it depends on how the race falls on the machine.
func TestStaleSet(t *testing.T) {
	if testing.Short() {
		t.Skip("the stale-set schedule runs real memcached for a while; not in -short")
	}
	if _, err := MemcachedPath(); err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	cfg := DefaultStaleSet
	if *durationFlag > cfg.Duration {
		cfg.Duration = *durationFlag
	}
	modes := []StaleSetMode{StaleSetLeases, StaleSetPlain}
	reps := make([]*StaleSetReport, len(modes))
	errs := make([]error, len(modes))
	done := make(chan int)
	for i, m := range modes {
		go func() { reps[i], errs[i] = RunStaleSet(m, cfg); done <- i }()
	}
	for range modes {
		<-done
	}
	for i, m := range modes {
		if errs[i] != nil {
			t.Fatalf("%s: %v", m, errs[i])
		}
		t.Log(reps[i])
	}
	if reps[0].Stale != 0 {
		t.Errorf("GetOrLoad left %d of %d keys stale in the cache (plain cache-aside: %d)", reps[0].Stale, reps[0].Keys, reps[1].Stale)
	}
	if reps[0].Updates == 0 || reps[0].Loads == 0 {
		t.Errorf("the run did nothing: %v", reps[0])
	}
}
