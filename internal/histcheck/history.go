package histcheck

import (
	"sync"
	"time"
)

// Kind is what an Event did to its key.
type Kind uint8

const (
	Read   Kind = iota // Get, one key of a GetMulti, or what a GetOrLoad returned
	Write              // Set, or a database update with its Set, invalidation or Delete of the key (see loads.go)
	Delete             // Delete
	Incr               // Increment by 1
	Flush              // FlushAll: a delete of every key
)

func (k Kind) String() string {
	return [...]string{"read", "write", "delete", "incr", "flush"}[k]
}

// Event is one operation on one key, as the application saw it.
type Event struct {
	Kind    Kind
	Op      string // the method: get, getmulti, set, delete, incr, flush, getorload, cache-aside, db+set, db+invalidate, db+delete
	Key     string // "" for a Flush
	Counter bool   // Key is in the counter key space
	// DB says Key is in the loaded key space: its values are the
	// database's (see loads.go), which a FlushAll of the cache leaves as
	// they were.
	DB bool
	// Start and End are monotonic, from the start of the run.
	Start, End time.Duration
	// Value is what a Read found, what a Write wrote, or the number an
	// Incr returned, in decimal for counters.
	Value string
	// Found reports a Read's hit, or an Incr that found its key.
	Found bool
	// OK reports that a Write, Delete, Incr or Flush was acknowledged:
	// it returned no error (a Delete or Incr also ErrCacheMiss).
	OK bool
	// Abandoned says that a Write failed because its caller's deadline
	// passed, in a schedule of abandoned writes (Params.Deadline). The
	// Client promises that such a write, if it lands at all, lands before
	// the key's next write or delete by the same client begins (it pins
	// the key to the request's connection): Check takes its End as an
	// acknowledged write's, though it is never the newer write that makes
	// a read stale.
	Abandoned bool
	// Err is the error's kind (see errKind), "" for none.
	Err   string
	Phase string // the fault schedule's phase when the operation began
}

// Recorder collects the events of a run. Each worker has a Log of its
// own, so that recording takes no lock on the hot path.
type Recorder struct {
	base time.Time // holds a monotonic reading: durations from it are monotonic
	mu   sync.Mutex
	logs []*Log
}

// NewRecorder starts the run's clock.
func NewRecorder() *Recorder { return &Recorder{base: time.Now()} }

// Now returns the monotonic time since the run started.
func (r *Recorder) Now() time.Duration { return time.Since(r.base) }

// Log returns a new log for one goroutine.
func (r *Recorder) Log() *Log {
	l := &Log{r: r}
	r.mu.Lock()
	r.logs = append(r.logs, l)
	r.mu.Unlock()
	return l
}

// Events returns every log's events, once the goroutines writing them
// are done.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int
	for _, l := range r.logs {
		n += len(l.events)
	}
	all := make([]Event, 0, n)
	for _, l := range r.logs {
		all = append(all, l.events...)
	}
	return all
}

// Log is one goroutine's events; it is not safe for concurrent use.
type Log struct {
	r      *Recorder
	events []Event
}

// Add records e.
func (l *Log) Add(e Event) { l.events = append(l.events, e) }

// Now returns the run's monotonic time.
func (l *Log) Now() time.Duration { return l.r.Now() }
