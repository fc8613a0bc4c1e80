package histcheck

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// -histcheck.trace writes, for each Client a run builds, every operation
// with the servers it went to (the Client's Metrics steps: requests,
// retries, failovers, handoffs) to a file in the given directory, one line
// an operation, so that a stale read can be followed to the servers that
// served it and its writes: grep the file for the key.
var traceFlag = flag.String("histcheck.trace", "", "a directory to write each Client's operations and the servers they went to")

var traceSeq atomic.Int64

// traced is a Client whose gomemcache methods record what they did.
type traced struct {
	*selector.Client
	rec *traceRecorder
}

type traceRecorder struct {
	selector.NopMetrics
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

type traceKey struct{}

// opTrace is one operation's steps, as Step reports them.
type opTrace struct {
	mu    sync.Mutex
	steps []string
}

func newTraceRecorder(dir, name string) (*traceRecorder, error) {
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.trace", name, traceSeq.Add(1))))
	if err != nil {
		return nil, err
	}
	return &traceRecorder{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

func (r *traceRecorder) Step(ctx context.Context, e selector.StepEvent) {
	t, _ := ctx.Value(traceKey{}).(*opTrace)
	if t == nil {
		return
	}
	s := fmt.Sprintf("%s@%s", e.Kind, e.Addr)
	if e.From != "" {
		s += "<" + e.From
	}
	if e.Outcome != selector.OutcomeOK {
		s += ":" + string(e.Outcome)
	}
	t.mu.Lock()
	t.steps = append(t.steps, s)
	t.mu.Unlock()
}

// Handoff and ServerHealth are written as they come, with the time: a
// copy's key is not reported, but its servers and time are.
func (r *traceRecorder) Handoff(e selector.HandoffEvent) {
	r.line("handoff %s->%s %s %s", e.From, e.To, e.Cause, e.Result)
}

func (r *traceRecorder) ServerHealth(e selector.HealthEvent) {
	r.line("health %s %s %s", e.Addr, e.State, e.Reason)
}

func (r *traceRecorder) line(format string, args ...any) {
	now := time.Now().Format("15:04:05.000000")
	r.mu.Lock()
	fmt.Fprintf(r.w, "%s %s # "+format+"\n", append([]any{now, now}, args...)...)
	r.mu.Unlock()
}

func (r *traceRecorder) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w.Flush()
	r.f.Close()
}

// record writes one line: the operation's start and end (wall clock, to
// the microsecond), its name, key, value and error, and its steps.
func (r *traceRecorder) record(start time.Time, op, key, value string, err error, t *opTrace) {
	end := time.Now()
	t.mu.Lock()
	steps := t.steps
	t.mu.Unlock()
	r.mu.Lock()
	fmt.Fprintf(r.w, "%s %s %s %s=%q err=%v %v\n", start.Format("15:04:05.000000"), end.Format("15:04:05.000000"), op, key, value, err, steps)
	r.mu.Unlock()
}

func (c traced) begin() (context.Context, *opTrace, time.Time) {
	t := &opTrace{}
	return context.WithValue(context.Background(), traceKey{}, t), t, time.Now()
}

func (c traced) Get(key string) (*memcache.Item, error) {
	ctx, t, start := c.begin()
	it, err := c.Client.GetContext(ctx, key)
	v := ""
	if it != nil {
		v = string(it.Value)
	}
	c.rec.record(start, "get", key, v, err, t)
	return it, err
}

func (c traced) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	ctx, t, start := c.begin()
	m, err := c.Client.GetMultiContext(ctx, keys)
	for _, k := range keys {
		v := ""
		if it := m[k]; it != nil {
			v = string(it.Value)
		}
		c.rec.record(start, "getmulti", k, v, err, t)
	}
	return m, err
}

func (c traced) Set(item *memcache.Item) error {
	ctx, t, start := c.begin()
	err := c.Client.SetContext(ctx, item)
	c.rec.record(start, "set", item.Key, string(item.Value), err, t)
	return err
}

func (c traced) Delete(key string) error {
	ctx, t, start := c.begin()
	err := c.Client.DeleteContext(ctx, key)
	c.rec.record(start, "delete", key, "", err, t)
	return err
}

func (c traced) Increment(key string, delta uint64) (uint64, error) {
	ctx, t, start := c.begin()
	n, err := c.Client.IncrementContext(ctx, key, delta)
	c.rec.record(start, "incr", key, fmt.Sprint(n), err, t)
	return n, err
}
