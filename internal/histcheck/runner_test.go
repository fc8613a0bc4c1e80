package histcheck

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// Config is one run's settings.
type Config struct {
	Seed     uint64
	Duration time.Duration // how long a schedule runs its rounds
	Workload Workload
	Params   Params
	Log      *slog.Logger // the Client's log; nil discards it
}

// ScheduleSeed is the seed of one schedule and target from the run's:
// each subtest is reproducible alone, and the Client and the control get
// the same steps for the same schedule.
func ScheduleSeed(seed uint64, s Schedule) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, s.Name)
	return h.Sum64()
}

// Run runs schedule s against a target of kind k over fresh memcached
// processes, and checks the history.
func Run(s Schedule, k TargetKind, cfg Config) (*Report, error) {
	bin, err := MemcachedPath()
	if err != nil {
		return nil, err
	}
	if s.Params != nil {
		s.Params(&cfg.Params)
	}
	p := cfg.Params
	t0 := time.Now()
	servers := make([]*Memcached, p.Members+p.Spares)
	errs := make([]error, len(servers))
	var starting sync.WaitGroup
	for i := range servers { // at once: a start takes a while on a busy machine
		starting.Go(func() { servers[i], errs[i] = StartMemcached(bin) })
	}
	starting.Wait()
	defer func() {
		for _, m := range servers {
			if m != nil {
				m.Close()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	seed := ScheduleSeed(cfg.Seed, s)
	rec := NewRecorder()
	list := new(selector.ServerList)
	env := &Env{Rng: rand.New(rand.NewPCG(seed, 1)), Params: p, Servers: servers, list: list, log: rec.Log(), st: newOpStats(),
		control: k == Gomemcache, pool: k == ClientReplicated}
	if p.Deadline > 0 {
		for _, m := range servers {
			sp, err := newStallProxy(m.Addr)
			if err != nil {
				return nil, err
			}
			defer sp.Close()
			env.proxies = append(env.proxies, sp)
		}
	}
	members := make([]int, p.Members)
	for i := range members {
		members[i] = i
	}
	if err := env.SetMembers(members...); err != nil {
		return nil, err
	}
	t, closeTarget, err := newTarget(k, list, cfg, s.Moves)
	if err != nil {
		return nil, err
	}
	env.closeTarget = closeTarget
	env.newTarget = func() (Target, func(), error) { return newTarget(k, list, cfg, s.Moves) }
	closed := false
	defer func() {
		if !closed {
			env.closeTarget()
		}
		if env.closeNewer != nil { // a schedule that failed midway
			env.closeNewer()
		}
		if env.app != nil {
			env.app.Close()
		}
	}()

	d := newDriver(t, rec, cfg.Workload)
	d.loaderOf = loaderOf
	if p.Deadline > 0 {
		d.abandoned = abandonedBy(k)
	}
	if s.Loads {
		d.db = newDatabase()
	}
	env.d = d
	startTime := time.Since(t0)
	env.Phase("fill")
	t0 = time.Now()
	d.fill(rec)
	fillTime := time.Since(t0)
	env.Phase("steady")
	var wg sync.WaitGroup
	for i := range cfg.Workload.Workers {
		st := newOpStats()
		d.stats = append(d.stats, st)
		log := rec.Log()
		wg.Go(func() { d.worker(seed+uint64(i)+1, log, st) })
	}
	d.stats = append(d.stats, env.st)

	start := time.Now()
	env.end = start.Add(cfg.Duration)
	env.Sleep(300 * time.Millisecond) // a warm cache before the first fault
	var runErr error
	for ; env.Remaining() && runErr == nil; env.Round++ {
		runErr = s.Round(env)
	}
	env.Phase("final")
	env.Sleep(300 * time.Millisecond)
	d.done.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	for _, m := range servers {
		m.Cont() // a schedule that failed midway may leave one stopped
	}
	var moves string
	if c, ok := env.d.t.(*selector.Client); ok {
		moves = fmt.Sprintf("%+v", c.Stats().Moves)
	}
	t0 = time.Now()
	env.closeTarget()
	closed = true
	closeTime := time.Since(t0)
	if runErr != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, runErr)
	}
	events := rec.Events()
	r := newReport(s.Name, s.KillPhases, k, seed, elapsed, events, Check(events), d.stats, env.steps)
	r.Start, r.Fill, r.Close = startTime, fillTime, closeTime
	r.Counts, r.Moves, r.CASMet = env.counts, moves, env.met
	for _, sp := range env.proxies {
		r.Stalls += sp.held()
	}
	if d.db != nil {
		r.Loads = int(d.db.loads.Load())
	}
	return r, nil
}

// newTarget makes the client of kind k over list, with the run's
// settings and the schedule's moves, and returns how to close it.
func newTarget(k TargetKind, list *selector.ServerList, cfg Config, moves selector.Moves) (Target, func(), error) {
	p := cfg.Params
	if k == Gomemcache {
		mc := memcache.NewFromSelector(list)
		mc.Timeout = p.Timeout
		if p.Deadline > 0 {
			mc.Timeout = p.Deadline
		}
		mc.MaxIdleConns = cfg.Workload.Workers
		return mc, func() { mc.Close() }, nil
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []selector.Option{
		selector.WithSlog(log),
		selector.WithTimeout(p.Timeout),
		selector.WithMaxIdleConns(cfg.Workload.Workers),
		selector.WithFailover(selector.Failover{Timeouts: p.Timeouts, ProbeFirst: p.ProbeFirst, ProbeMax: p.ProbeMax, MaxOut: p.MaxDown}),
		selector.WithHandoff(selector.Handoff{Window: p.HandoffWindow, Expiration: p.HandoffTTL}),
	}
	if moves != (selector.Moves{}) {
		opts = append(opts, selector.WithMoves(moves))
	}
	switch k {
	case ClientSharded:
	case ClientReplicated:
		opts = append(opts, selector.WithPool(selector.Replicated()))
	case ClientZoned:
		opts = append(opts, selector.WithPool(selector.ByZone("a")))
	default:
		return nil, nil, fmt.Errorf("unknown target %q", k)
	}
	var rec *traceRecorder
	if *traceFlag != "" && p.Deadline == 0 {
		var err error
		if rec, err = newTraceRecorder(*traceFlag, string(k)); err != nil {
			return nil, nil, err
		}
		opts = append(opts, selector.WithMetrics(rec))
	}
	c, err := selector.NewClientFromList(list, opts...)
	if err != nil {
		return nil, nil, err
	}
	if rec != nil {
		return traced{c, rec}, func() { c.Close(); rec.close() }, nil
	}
	if p.Deadline > 0 {
		return deadlined{c, p.Deadline}, func() { c.Close() }, nil
	}
	return c, func() { c.Close() }, nil
}

// abandonedBy returns what says that a write of target k failed because
// its caller's deadline passed (Params.Deadline), for Event.Abandoned:
// the Client's context, or gomemcache's Timeout.
func abandonedBy(k TargetKind) func(error) bool {
	if k == Gomemcache {
		return func(err error) bool {
			var ne net.Error
			return errors.As(err, &ne) && ne.Timeout()
		}
	}
	return func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
}
