package histcheck

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Workload is the operation mix: many goroutines over a small hot key
// space, so that each key is written often and read between its writes.
type Workload struct {
	Workers     int
	Keys        int // hot register keys: Set, Delete, Get, GetMulti
	CounterKeys int // counter keys: Increment, and Set to a new lineage
	// ColdKeys are written every few seconds each, so that some are not
	// written while the handoff window is open after they move, but are
	// written after it (issue 17, item 6: a move back after the window).
	ColdKeys int
	// LoadKeys are the loaded keys (see loads.go), in the schedules with
	// loads: few, so that reads join loads and writes overlap them.
	LoadKeys int
}

// DefaultWorkload is the mix of the bounded run.
var DefaultWorkload = Workload{Workers: 8, Keys: 200, CounterKeys: 40, ColdKeys: 300, LoadKeys: 20}

// loadShare is the percentage of operations on the loaded keys, in the
// schedules with loads.
const loadShare = 40

// driver is the state the workers share with the fault schedule.
type driver struct {
	t       Target
	newer   Target // a client that joined the workload, for its Sets and Deletes (see Env.Join); swapped with the workers paused
	rec     *Recorder
	w       Workload
	writeID atomic.Uint64          // unique write ids: values and counter lineages (see newDriver)
	nonce   string                 // in every value, so that a value from another run is never taken for this one's
	phase   atomic.Pointer[string] // the schedule's phase
	gate    sync.RWMutex           // the schedule's Pause takes it to quiesce the workers
	done    atomic.Bool
	absExp  atomic.Bool // half the Sets of register keys have an absolute expiration (see absExp)
	stats   []*opStats  // one per worker, and the schedule's
	// db is the loads' database, in the schedules with loads, else nil.
	db *database
	// loaderOf returns a target's Loader, or nil for one without (see
	// loader); nil for none at all.
	loaderOf func(Target) Loader
	// reserved is a loaded key the schedule alone uses for a while (see
	// meetCAS), or nil.
	reserved atomic.Pointer[string]
	// abandoned, if set, says that a write's error is its caller's
	// deadline (see Event.Abandoned).
	abandoned func(error) bool
}

// opStats counts one goroutine's operations and errors.
type opStats struct {
	ops    map[string]int            // by method
	errors map[string]map[string]int // by phase, then kind
}

func newOpStats() *opStats {
	return &opStats{ops: map[string]int{}, errors: map[string]map[string]int{}}
}

func (s *opStats) count(op, phase string, err error) {
	s.ops[op]++
	if k := errKind(err); k != "" {
		if s.errors[phase] == nil {
			s.errors[phase] = map[string]int{}
		}
		s.errors[phase][op+": "+k]++
	}
}

// newDriver returns a driver whose write ids start at random, so that the
// counters of two runs (which hold no nonce: they are numbers) do not meet.
func newDriver(t Target, rec *Recorder, w Workload) *driver {
	d := &driver{t: t, rec: rec, w: w, nonce: strconv.FormatUint(rand.Uint64()%(1<<32), 36)}
	d.writeID.Store(1 + rand.Uint64()%(1<<30))
	return d
}

// value returns a new unique value for a register key.
func (d *driver) value() string {
	return "v" + strconv.FormatUint(d.writeID.Add(1), 10) + "." + d.nonce
}

// keyPrefix starts every key the workload writes: the Client's keys, which
// a schedule names in Moves.Prefix where another application shares the
// servers (see sharedServers).
const keyPrefix = "h:"

func regKey(i int) string     { return keyPrefix + "k" + strconv.Itoa(i) }
func coldKey(i int) string    { return keyPrefix + "q" + strconv.Itoa(i) }
func counterKey(i int) string { return keyPrefix + "c" + strconv.Itoa(i) }
func stillKey(i int) string   { return keyPrefix + "s" + strconv.Itoa(i) }

func isCounter(key string) bool { return strings.HasPrefix(key, keyPrefix+"c") }

// absExp is an absolute expiration 60 days ahead: more than memcached's 30
// days, so a copy that sent the seconds left instead would set a time in
// 1970, and the copy would expire at once (issue 26, item 6).
func absExp() int32 { return int32(time.Now().Add(60 * 24 * time.Hour).Unix()) }

// writer is the client of the Sets and Deletes: one that joined the
// workload, else the target.
func (d *driver) writer() Target {
	if d.newer != nil {
		return d.newer
	}
	return d.t
}

// worker runs operations until the driver is done.
func (d *driver) worker(seed uint64, log *Log, st *opStats) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	for !d.done.Load() {
		d.gate.RLock()
		d.op(rng, log, st)
		d.gate.RUnlock()
	}
}

func (d *driver) op(rng *rand.Rand, log *Log, st *opStats) {
	phase := *d.phase.Load()
	reg := regKey(rng.IntN(d.w.Keys))
	ctr := counterKey(rng.IntN(d.w.CounterKeys))
	if d.db != nil && rng.IntN(100) < loadShare {
		d.loadOp(rng, log, st, phase)
		return
	}
	start := log.Now()
	ev := func(k Kind, op, key string, counter bool) Event {
		return Event{Kind: k, Op: op, Key: key, Counter: counter, Start: start, Phase: phase}
	}
	// The mix: 35% Get, 9% GetMulti, 18% Set, 5% Delete of the hot keys; 5%
	// Get and 3% Set of the cold ones; 14% Increment, 3% Set, 2% Delete
	// and 6% Get of the counters.
	r := rng.IntN(100)
	if r < 8 {
		reg = coldKey(rng.IntN(d.w.ColdKeys))
		if r < 5 {
			r = 8 // a Get
		} else {
			r = 52 // a Set
		}
	}
	switch {
	case r < 43:
		e := ev(Read, "get", reg, false)
		it, err := d.t.Get(reg)
		e.End = log.Now()
		read(&e, it, err)
		log.Add(e)
		st.count("get", phase, ignoreMiss(err))
	case r < 52:
		keys := make([]string, 2+rng.IntN(6))
		for i := range keys {
			if rng.IntN(4) == 0 {
				keys[i] = counterKey(rng.IntN(d.w.CounterKeys))
			} else {
				keys[i] = regKey(rng.IntN(d.w.Keys))
			}
		}
		items, err := d.t.GetMulti(keys)
		end := log.Now()
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				continue
			}
			seen[k] = true
			e := ev(Read, "getmulti", k, isCounter(k))
			e.End = end
			if it := items[k]; it != nil {
				e.Found, e.Value = true, string(it.Value)
			}
			e.Err = errKind(err)
			log.Add(e)
		}
		st.count("getmulti", phase, err)
	case r < 70:
		v := d.value()
		e := ev(Write, "set", reg, false)
		e.Value = v
		it := &memcache.Item{Key: reg, Value: []byte(v)}
		if d.absExp.Load() && rng.IntN(2) == 0 {
			it.Expiration = absExp()
		}
		err := d.writer().Set(it)
		d.ack(log, &e, err, st)
	case r < 75:
		e := ev(Delete, "delete", reg, false)
		err := d.writer().Delete(reg)
		d.ack(log, &e, ignoreMiss(err), st)
	case r < 89:
		e := ev(Incr, "incr", ctr, true)
		n, err := d.t.Increment(ctr, 1)
		e.End = log.Now()
		e.OK = err == nil || errors.Is(err, memcache.ErrCacheMiss)
		e.Found = err == nil
		if err == nil {
			e.Value = strconv.FormatUint(n, 10)
		}
		e.Err = errKind(ignoreMiss(err))
		log.Add(e)
		st.count("incr", phase, ignoreMiss(err))
		if errors.Is(err, memcache.ErrCacheMiss) {
			d.setCounter(log, ctr, phase, st) // as an application would: start it
		}
	case r < 92:
		d.setCounter(log, ctr, phase, st)
	case r < 94:
		e := ev(Delete, "delete", ctr, true)
		err := d.writer().Delete(ctr)
		d.ack(log, &e, ignoreMiss(err), st)
	default:
		e := ev(Read, "get", ctr, true)
		it, err := d.t.Get(ctr)
		e.End = log.Now()
		read(&e, it, err)
		log.Add(e)
		st.count("get", phase, ignoreMiss(err))
	}
}

// setCounter starts a new lineage of a counter (see the package doc).
func (d *driver) setCounter(log *Log, key, phase string, st *opStats) {
	v := strconv.FormatUint(d.writeID.Add(1)<<counterBits, 10)
	e := Event{Kind: Write, Op: "set", Key: key, Counter: true, Value: v, Start: log.Now(), Phase: phase}
	err := d.writer().Set(&memcache.Item{Key: key, Value: []byte(v)})
	d.ack(log, &e, err, st)
}

// ack records a write that err acknowledged, or did not.
func (d *driver) ack(log *Log, e *Event, err error, st *opStats) {
	e.End = log.Now()
	e.OK = err == nil
	e.Err = errKind(err)
	e.Abandoned = err != nil && e.Kind == Write && d.abandoned != nil && d.abandoned(err)
	log.Add(*e)
	st.count(e.Op, e.Phase, err)
}

// read fills in what a Get found.
func read(e *Event, it *memcache.Item, err error) {
	if err == nil && it != nil {
		e.Found, e.Value = true, string(it.Value)
	}
	e.Err = errKind(ignoreMiss(err))
}

func ignoreMiss(err error) error {
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil
	}
	return err
}

// fill writes every cold key and counter once before the run, so that
// every server holds values from the start: a cold key that moves, and is
// written only after the handoff window, then leaves an older value where
// it was.
func (d *driver) fill(rec *Recorder) {
	var keys []string // the hot keys are written soon enough
	for i := range d.w.ColdKeys {
		keys = append(keys, coldKey(i))
	}
	var wg sync.WaitGroup
	const fillers = 16
	for f := range fillers {
		log, st := rec.Log(), newOpStats()
		d.stats = append(d.stats, st)
		wg.Go(func() {
			for i := f; i < len(keys); i += fillers {
				v := d.value()
				e := Event{Kind: Write, Op: "set", Key: keys[i], Value: v, Start: log.Now(), Phase: "fill"}
				d.ack(log, &e, d.t.Set(&memcache.Item{Key: keys[i], Value: []byte(v)}), st)
			}
			for i := f; i < d.w.CounterKeys; i += fillers {
				d.setCounter(log, counterKey(i), "fill", st)
			}
			for i := f; d.db != nil && i < d.w.LoadKeys; i += fillers {
				d.dbWrite(d.t, log, st, loadKey(i), "fill", "set")
			}
		})
	}
	wg.Wait()
}
