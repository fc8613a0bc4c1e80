package histcheck

import (
	"maps"
	"testing"
)

func TestKillErrors(t *testing.T) {
	s := Schedule{Name: "kill-fast", KillPhases: killPhases}
	stats := newOpStats()
	stats.errors = map[string]map[string]int{
		"killed":   {"incr: EOF": 2, "incr: connection reset": 1, "delete: EOF": 1},
		"recovery": {"getmulti: connection reset": 1, "incr: no servers": 3, "set: timeout": 2},
		"steady":   {"get: timeout": 5}, // not a kill's phase
	}
	r := newReport(s.Name, s.KillPhases, ClientSharded, 0, 0, nil, Result{}, []*opStats{stats}, nil)
	if got := sum(r.KillErrors); got != 10 {
		t.Errorf("%d errors in the kill's phases, want 10: %v", got, r.KillErrors)
	}
	// An Increment whose connection broke may have been applied, and a
	// timeout may be a live server's: no client sends them again. The rest
	// could have been spared.
	want := map[string]int{"delete: EOF": 1, "getmulti: connection reset": 1, "incr: no servers": 3}
	if got := r.AvoidableKillErrors(); !maps.Equal(got, want) {
		t.Errorf("avoidable %v, want %v", got, want)
	}
	if r := newReport("stop", nil, ClientSharded, 0, 0, nil, Result{}, []*opStats{stats}, nil); r.KillErrors != nil {
		t.Errorf("a schedule without kills has kill errors: %v", r.KillErrors)
	}
}
