package selector

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"
)

// This file is the ServerList's log. The library logs leveled records with
// attributes (service, namespace, servers, added, removed, error) to a
// slog.Handler; a Logger, the interface of github.com/castai/k8s-memcache-selector
// that this package keeps, gets them through an adapter as one formatted
// line each. Errors are rate limited by message.

// Logger receives the ServerList's logs as formatted lines: errors and
// warnings through Errorf, the rest through Infof. A Logger that also has
// Warnf(format string, args ...any) gets warnings there. slog users get
// structured records with WithSlog.
type Logger interface {
	Errorf(format string, args ...any)
	Infof(format string, args ...any)
}

// The attribute keys of the ServerList's records.
const (
	keyService   = "service"
	keyNamespace = "namespace"
	keyServers   = "servers"
	keyAdded     = "added"
	keyRemoved   = "removed"
	keyError     = "error"
	keyRetryIn   = "retry_in"
)

// errorPeriod is how often the same error is logged, at most.
const errorPeriod = time.Minute

// newLog returns the log of a ServerList for t: every record carries the
// service and namespace, and goes to h, with errors rate limited.
func newLog(h slog.Handler, t target) *slog.Logger {
	return slog.New(newLimitHandler(h, errorPeriod)).With(keyService, t.service, keyNamespace, t.namespace)
}

// loggerHandler is a slog.Handler that formats each record as a line for a
// Logger: "selector: <message>: key=value ...".
type loggerHandler struct {
	l     Logger
	attrs []slog.Attr
}

func (h loggerHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h loggerHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("selector: ")
	b.WriteString(r.Message)
	sep := ": "
	write := func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true
		}
		fmt.Fprintf(&b, "%s%s=%v", sep, a.Key, a.Value.Resolve())
		sep = " "
		return true
	}
	for _, a := range h.attrs {
		write(a)
	}
	r.Attrs(write)
	line := b.String()
	switch w, ok := h.l.(interface{ Warnf(string, ...any) }); {
	case r.Level >= slog.LevelError:
		h.l.Errorf("%s", line)
	case r.Level >= slog.LevelWarn && ok:
		w.Warnf("%s", line)
	case r.Level >= slog.LevelWarn:
		h.l.Errorf("%s", line)
	default:
		h.l.Infof("%s", line)
	}
	return nil
}

func (h loggerHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return loggerHandler{l: h.l, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
}

// WithGroup is not needed by the ServerList's records, which use no groups.
func (h loggerHandler) WithGroup(string) slog.Handler { return h }

// limitHandler passes on at most one error record per message and error text
// per period, so an API server outage logs once a minute instead of once a
// retry, while a different error (a 403 after a 500) is logged at once. The
// first record after a quiet period says how many were held back. It also
// runs the next handler as a callback (see inCallback).
type limitHandler struct {
	next   slog.Handler
	period time.Duration
	state  *limitState // shared by the handlers WithAttrs returns
}

func newLimitHandler(next slog.Handler, period time.Duration) *limitHandler {
	return &limitHandler{next: next, period: period, state: &limitState{last: map[string]time.Time{}, held: map[string]int{}}}
}

type limitState struct {
	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func (h *limitHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		key := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == keyError {
				key += "\x00" + a.Value.String()
			}
			return true
		})
		s := h.state
		s.mu.Lock()
		now := time.Now()
		if now.Sub(s.last[key]) < h.period {
			s.held[key]++
			s.mu.Unlock()
			return nil
		}
		n := s.held[key]
		delete(s.held, key)
		for k, t := range s.last { // forget errors that stopped, so the map stays small
			if now.Sub(t) >= h.period && s.held[k] == 0 {
				delete(s.last, k)
			}
		}
		s.last[key] = now
		s.mu.Unlock()
		if n > 0 {
			r = r.Clone()
			r.AddAttrs(slog.Int("suppressed", n))
		}
	}
	var err error
	runCallback(func() { err = h.next.Handle(ctx, r) })
	return err
}

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{next: h.next.WithAttrs(as), period: h.period, state: h.state}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{next: h.next.WithGroup(name), period: h.period, state: h.state}
}

// runCallback runs f, a call into the user's code (a log handler or the
// WithOnChange function), so that Close can tell from the stack that it was
// called from one and must not wait for the goroutine it runs on.
//
//go:noinline
func runCallback(f func()) { f() }

var runCallbackName = runtime.FuncForPC(reflect.ValueOf(runCallback).Pointer()).Name()

// inCallback reports whether the calling goroutine is inside runCallback.
func inCallback() bool {
	pcs := make([]uintptr, 512)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if f.Function == runCallbackName {
			return true
		}
		if !more {
			return false
		}
	}
}
