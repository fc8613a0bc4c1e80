package discovery

// Benchmarks for make bench: PickServer against gomemcache's ServerList in
// the same run, and ring rebuilds. internal/benchreport turns their output
// into the tables of BENCHMARKS.md.

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkNoOpEvent is a watch event that changes no member (a slice's new
// resource version alone) in a Service of 100 or 5000 slices: it costs the
// decoding of that one slice, whatever the number of slices.
func BenchmarkNoOpEvent(b *testing.B) {
	for _, n := range []int{100, 5000} {
		b.Run(fmt.Sprintf("slices=%d", n), func(b *testing.B) {
			w := newWatcher(nil, watchConfig{target: target{service: "memcache", namespace: "default", port: 11211},
				publish: func([]Member, []string, time.Duration) error { return nil }})
			w.slices = map[string][]endpoint{}
			var ev event
			for i := range n {
				var eps []fakeEndpoint
				for j := range 10 {
					eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", i>>8, i&255, j+1)))
				}
				raw, err := json.Marshal(v4(fmt.Sprint("memcache-", i), eps...))
				require.NoError(b, err)
				ev = event{Type: "ADDED", Object: raw}
				_, err = w.apply(ev, request{})
				require.NoError(b, err)
			}
			w.recompute()
			ev.Type = "MODIFIED"
			b.ReportAllocs()
			for b.Loop() {
				if changed, err := w.apply(ev, request{}); changed || err != nil {
					b.Fatal("a no-op event changed the state", err)
				}
			}
		})
	}
}
