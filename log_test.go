package selector

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu    sync.Mutex
	attrs []slog.Attr
	recs  []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.AddAttrs(h.attrs...)
	h.recs = append(h.recs, r)
	return nil
}
func (h *records) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordsWith{h, as}
}
func (h *records) WithGroup(string) slog.Handler { return h }

type recordsWith struct {
	*records
	as []slog.Attr
}

func (h *recordsWith) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(h.as...)
	return h.records.Handle(ctx, r)
}

// lines returns each record as its message and its attributes' keys and
// values.
func (h *records) lines() []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range h.recs {
		m := map[string]any{"msg": r.Message, "level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
		out = append(out, m)
	}
	return out
}

// Errors are rate limited by message and error text: a different error is
// logged at once, a repeat only after the period, saying how many were held.
func TestLimitHandler(t *testing.T) {
	rec := &records{}
	l := slog.New(newLimitHandler(rec, 50*time.Millisecond))
	e500, e403 := errors.New("500 Internal Server Error"), errors.New("403 Forbidden")
	for range 5 {
		l.Error("discovery failed", keyError, e500.Error(), keyRetryIn, "1s")
	}
	l.Error("discovery failed", keyError, e403.Error())
	l.Info("servers changed", keyServers, 3)
	l.Info("servers changed", keyServers, 3)
	time.Sleep(60 * time.Millisecond)
	l.Error("discovery failed", keyError, e500.Error())

	var got []string
	for _, m := range rec.lines() {
		s := m["msg"].(string)
		if e, ok := m[keyError]; ok {
			s += " " + e.(string)
		}
		if n, ok := m["suppressed"]; ok {
			s += " suppressed=" + slog.AnyValue(n).String()
		}
		got = append(got, s)
	}
	assert.Equal(t, []string{
		"discovery failed 500 Internal Server Error",
		"discovery failed 403 Forbidden",
		"servers changed",
		"servers changed",
		"discovery failed 500 Internal Server Error suppressed=4",
	}, got)
}

// slog users get records with attributes, not formatted strings.
func TestLogAttributes(t *testing.T) {
	rec := &records{}
	l := newLog(rec, target{service: "memcache", namespace: "cache"})
	l.Info("servers changed", keyServers, 2, keyAdded, []string{"10.0.0.1:11211"}, keyRemoved, []string(nil))
	lines := rec.lines()
	require.Len(t, lines, 1)
	assert.Equal(t, map[string]any{
		"msg": "servers changed", "level": "INFO", keyService: "memcache", keyNamespace: "cache",
		keyServers: int64(2), keyAdded: []string{"10.0.0.1:11211"}, keyRemoved: []string(nil),
	}, lines[0])
}

type warnLogger struct {
	recLogger
	warnings []string
}

func (l *warnLogger) Warnf(format string, args ...any) {
	l.warnings = append(l.warnings, format)
	l.recLogger.Infof(format, args...)
}

// A Logger gets one line a record, by level: warnings go to Warnf where the
// Logger has it, else to Errorf.
func TestLoggerHandler(t *testing.T) {
	tgt := target{service: "memcache", namespace: "default"}
	for _, tc := range []struct {
		name  string
		log   func(*slog.Logger)
		lines []string
	}{
		{"info with attributes", func(l *slog.Logger) { l.Info("servers changed", keyServers, 1, keyAdded, []string{"a:1"}) },
			[]string{"INFO selector: servers changed: service=memcache namespace=default servers=1 added=[a:1]"}},
		{"error", func(l *slog.Logger) { l.Error("discovery failed", keyError, "boom") },
			[]string{"ERROR selector: discovery failed: service=memcache namespace=default error=boom"}},
		{"warning without Warnf", func(l *slog.Logger) { l.Warn("no EndpointSlices") },
			[]string{"ERROR selector: no EndpointSlices: service=memcache namespace=default"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recLogger{t: t}
			tc.log(newLog(loggerHandler{l: rec}, tgt))
			assert.Equal(t, tc.lines, rec.lines)
		})
	}
	w := &warnLogger{recLogger: recLogger{t: t}}
	newLog(loggerHandler{l: w}, tgt).Warn("no EndpointSlices")
	assert.Len(t, w.warnings, 1)
	assert.True(t, slices.ContainsFunc(w.lines, func(s string) bool {
		return s == "INFO selector: no EndpointSlices: service=memcache namespace=default"
	}))
}
