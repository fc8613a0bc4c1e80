package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// leaseRow is one row that the selector package's TestLeaseMeasure writes
// with -lease.json.
type leaseRow struct {
	Scenario string  `json:"scenario"`
	Mode     string  `json:"mode"`
	Loads    float64 `json:"loads"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	Reads    int     `json:"reads"`
	Errors   int     `json:"errors"`
}

// leasesSection writes the GetOrLoad section from TestLeaseMeasure's JSON
// file at path.
func leasesSection(w *bytes.Buffer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rows []leaseRow
	if err := json.Unmarshal(b, &rows); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("%s: no rows of TestLeaseMeasure", path)
	}
	fmt.Fprintf(w, "## Cache-aside with leases (GetOrLoad)\n\n")
	fmt.Fprintf(w, "From the selector package's TestLeaseMeasure (-lease.measure): 20 Clients of 50 goroutines each read through the cache, with a database query of 2 ms; GetOrLoad against plain cache-aside through the same Client (Get, load on a miss, Set; Delete on an update). hot-key-invalidated: one key, updated and invalidated 10 times 100 ms apart, loads per invalidation (goal 1). server-restarted: 3 servers of 30 hot keys, one restarted empty, loads per key of that server in the 1.5 s after.\n\n")
	fmt.Fprintf(w, "| scenario | mode | database loads | readers' p50 | readers' p99 | reads | errors |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %.1f | %.2f ms | %.2f ms | %d | %d |\n", r.Scenario, r.Mode, r.Loads, r.P50us/1000, r.P99us/1000, r.Reads, r.Errors)
	}
	fmt.Fprintln(w)
	return nil
}
