package discovery

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The timing and backoff are client-go's reflector's.
func TestDefaultTiming(t *testing.T) {
	tm := defaultTiming()
	seen := map[time.Duration]bool{}
	for range 100 {
		d := tm.WatchTimeout()
		require.GreaterOrEqual(t, d, 5*time.Minute, "watch timeout, want [5m, 10m)")
		require.Less(t, d, 10*time.Minute, "watch timeout, want [5m, 10m)")
		seen[d] = true
	}
	assert.GreaterOrEqual(t, len(seen), 50, "distinct watch timeouts in 100, want them random")
	assert.Equal(t, 800*time.Millisecond, tm.BackoffBase, "backoff base, want client-go's")
	assert.Equal(t, 30*time.Second, tm.BackoffCap, "backoff cap, want client-go's")
	assert.Equal(t, 2*time.Minute, tm.BackoffReset, "backoff reset, want client-go's")
	assert.Equal(t, time.Second, tm.ShortWatch, "short watch, want client-go's")
	assert.Equal(t, time.Minute, tm.MaxRetryAfter, "max Retry-After")
}

func TestBackoff(t *testing.T) {
	b := backoff{Timing: defaultTiming()}
	want := 800 * time.Millisecond
	for i := range 10 {
		d := b.next()
		require.GreaterOrEqual(t, d, want, "backoff %d, want [%v, %v)", i, want, 2*want)
		require.Less(t, d, 2*want, "backoff %d, want [%v, %v)", i, want, 2*want)
		want = min(2*want, 30*time.Second)
	}
	b.last = time.Now().Add(-3 * time.Minute) // no failure for longer than backoffReset
	assert.Less(t, b.next(), 1600*time.Millisecond, "backoff after a quiet spell, want it to start over")
}

// An event that changes no member (a slice's new resource version alone)
// is not a change, and costs no recompute.
func TestNoOpEvent(t *testing.T) {
	w := newWatcher(nil, watchConfig{target: target{service: "memcache", namespace: "default", port: 11211}})
	w.slices = map[string][]endpoint{}
	s := v4("memcache-a", ep("10.0.0.1"), ep("10.0.0.2"))
	mk := func(typ string, rv int) event {
		s.Metadata.ResourceVersion = strconv.Itoa(rv)
		b, err := json.Marshal(s)
		require.NoError(t, err)
		return event{Type: typ, Object: b}
	}
	for _, tc := range []struct {
		name    string
		ev      event
		changed bool
	}{
		{"added", mk("ADDED", 1), true},
		{"modified, same members", mk("MODIFIED", 2), false},
		{"added again, same members", mk("ADDED", 3), false},
		{"deleted", mk("DELETED", 4), true},
		{"deleted again", mk("DELETED", 5), false},
	} {
		changed, err := w.apply(tc.ev, request{})
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.changed, changed, tc.name)
		require.Equal(t, tc.ev.Type == "DELETED", len(w.slices) == 0, tc.name)
	}
	require.Equal(t, "5", w.rv)
}
