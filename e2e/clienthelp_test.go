package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Helpers of the Client scenarios (client_test.go): versioned cache-aside
// traffic that checks every read, the two clients compared, the Client's
// server states, and the sockets this process holds to memcached.

// cache is what the scenarios use of a memcached client: both
// *memcache.Client (today's path) and *selector.Client have it.
type cache interface {
	Get(key string) (*memcache.Item, error)
	Set(item *memcache.Item) error
	Delete(key string) error
	GetMulti(keys []string) (map[string]*memcache.Item, error)
}

// Settings of both clients in every Client scenario, so that the two are
// compared under the same timeouts.
const (
	cTimeout    = 500 * time.Millisecond // gomemcache's default
	cMaxIdle    = 4
	cTimeouts   = 3 // consecutive timeouts until the Client takes a server out
	cProbeFirst = 200 * time.Millisecond
	cProbeMost  = time.Second
	cMaxDown    = 0.5
)

// cFailover is the Client's failover in every Client scenario.
var cFailover = selector.Failover{Timeouts: cTimeouts, ProbeFirst: cProbeFirst, ProbeMax: cProbeMost, MaxOut: cMaxDown}

// newSelClient returns a Client over l's ServerList, with the scenarios'
// settings; it closes before l does.
func (e *env) newSelClient(l *lib, opts ...selector.Option) *selector.Client {
	e.t.Helper()
	all := append([]selector.Option{
		selector.WithLogger(l.log),
		selector.WithTimeout(cTimeout),
		selector.WithMaxIdleConns(cMaxIdle),
		selector.WithFailover(cFailover),
	}, opts...)
	c, err := selector.NewClientFromList(l.ServerList, all...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// todayClient is today's path: gomemcache over l's ServerList, with the
// same timeout as the Client.
func todayClient(l *lib, maxIdle int) *memcache.Client {
	c := memcache.NewFromSelector(l)
	c.Timeout = cTimeout
	c.MaxIdleConns = maxIdle
	return c
}

// stateOf returns addr's state in c.Stats(), or "" if c does not know it.
func stateOf(c *selector.Client, addr string) string {
	for _, s := range c.Stats().Servers {
		if s.Addr == addr {
			return string(s.State)
		}
	}
	return ""
}

// waitState waits until addr is in state want for c, and returns the time
// from since to when the poll saw it (a few ms late at most).
func waitState(c *selector.Client, addr, want string, since time.Time, timeout time.Duration) (time.Duration, error) {
	for end := time.Now().Add(timeout); ; time.Sleep(time.Millisecond) {
		if got := stateOf(c, addr); got == want {
			return time.Since(since), nil
		} else if time.Now().After(end) {
			return 0, fmt.Errorf("server %s is %q after %v, want %q", addr, got, timeout, want)
		}
	}
}

// waitStates waits, for every client at once, until addr is in state want,
// and returns the times from since to when each was seen so.
func waitStates(cs []*selector.Client, addr, want string, since time.Time, timeout time.Duration) ([]time.Duration, error) {
	ds := make([]time.Duration, len(cs))
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { ds[i], errs[i] = waitState(c, addr, want, since, timeout) })
	}
	wg.Wait()
	return ds, errors.Join(errs...)
}

// Versioned cache-aside traffic: the mix of operations, and its bounds.
const (
	vDeleteShare    = 0.05 // Delete: the application invalidates a key
	vOverwriteShare = 0.10 // Set of a new version: the source of truth changed
	vWarmWorkers    = 8
	vSweepBatch     = 100
	maxErrEvents    = 100000
	maxStaleSamples = 5
)

// What a key's last write left, as far as the application knows.
const (
	keyUnknown int32 = iota // never written, or the last write failed (it may or may not have landed)
	keyPresent              // a Set succeeded
	keyAbsent               // a Delete succeeded
)

// vkey is one key of a vtraffic. Every write gives it a new version, and
// the value is "key:version", so that a read says which write it sees.
type vkey struct {
	mu     sync.Mutex   // serializes the key's writes, so that versions reach the cache in order
	next   atomic.Int64 // the last version given out (changed under mu)
	lastOK atomic.Int64 // the version of the last write (Set or Delete) that succeeded
	state  atomic.Int32 // keyUnknown, keyPresent or keyAbsent
	writes atomic.Int64 // writes started, so that a sweep can tell a key that changed under it
	done   atomic.Int64 // writes ended: fewer than writes while one is in flight
}

// vcounters are one phase's figures of a vtraffic.
type vcounters struct {
	ops, gets, hits                     atomic.Int64
	getErrs, setErrs, delErrs, timeouts atomic.Int64
	stale                               atomic.Int64 // reads older than the last successful write before they started
	swept, expected, kept               atomic.Int64 // sweeps: keys read, keys that should be there, and found of those
}

func (c *vcounters) add(o *vcounters) {
	for _, p := range [][2]*atomic.Int64{
		{&c.ops, &o.ops}, {&c.gets, &o.gets}, {&c.hits, &o.hits},
		{&c.getErrs, &o.getErrs}, {&c.setErrs, &o.setErrs}, {&c.delErrs, &o.delErrs}, {&c.timeouts, &o.timeouts},
		{&c.stale, &o.stale}, {&c.swept, &o.swept}, {&c.expected, &o.expected}, {&c.kept, &o.kept},
	} {
		p[0].Add(p[1].Load())
	}
}

func (c *vcounters) errs() int64 { return c.getErrs.Load() + c.setErrs.Load() + c.delErrs.Load() }

func (c *vcounters) hitRate() float64 {
	if c.gets.Load() == 0 {
		return 0
	}
	return float64(c.hits.Load()) / float64(c.gets.Load())
}

// keptShare is the share of the keys a sweep should have found that it did.
func (c *vcounters) keptShare() float64 {
	if c.expected.Load() == 0 {
		return 0
	}
	return float64(c.kept.Load()) / float64(c.expected.Load())
}

func (c *vcounters) String() string {
	return fmt.Sprintf("%d requests, %d gets, hit rate %.1f%%, errors get/set/delete %d/%d/%d (%d timeouts), stale reads %d",
		c.ops.Load(), c.gets.Load(), 100*c.hitRate(), c.getErrs.Load(), c.setErrs.Load(), c.delErrs.Load(), c.timeouts.Load(), c.stale.Load())
}

// errEvent is an error the application saw: when its request started.
type errEvent struct {
	at      time.Time
	op      string
	timeout bool
	err     error
}

// vtraffic is cache-aside traffic through one client over its own keys
// (Get; Set of a new version after a miss; some overwrites and Deletes),
// which checks every value it reads: a read must never return a version
// older than the last write or delete of the key that succeeded before the
// read started. Several workers may work on one key; its writes are
// serialized, its reads are not.
type vtraffic struct {
	name     string
	c        cache
	keys     []vkey
	workers  int
	interval time.Duration // between a worker's operations, at most

	cur atomic.Pointer[vcounters]
	all vcounters // every phase

	mu     sync.Mutex
	events []errEvent
	stale  []string // samples
}

func newVTraffic(name string, c cache, keys, workers int, interval time.Duration) *vtraffic {
	tr := &vtraffic{name: name, c: c, keys: make([]vkey, keys), workers: workers, interval: interval}
	tr.cur.Store(&vcounters{})
	return tr
}

func (tr *vtraffic) key(i int) string { return tr.name + "-" + strconv.Itoa(i) }

func (tr *vtraffic) value(i int, v int64) []byte {
	return []byte(tr.key(i) + ":" + strconv.FormatInt(v, 10))
}

// phase starts a new phase and returns the counters of the one that ended.
func (tr *vtraffic) phase() *vcounters { return tr.cur.Swap(&vcounters{}) }

// count applies f to the current phase's counters and to the totals.
func (tr *vtraffic) count(f func(*vcounters)) {
	f(tr.cur.Load())
	f(&tr.all)
}

// run sends operations from tr.workers goroutines until ctx is done.
func (tr *vtraffic) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range tr.workers {
		wg.Go(func() {
			tick := time.NewTicker(tr.interval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				i := rand.IntN(len(tr.keys))
				switch r := rand.Float64(); {
				case r < vDeleteShare:
					tr.del(i)
				case r < vDeleteShare+vOverwriteShare:
					tr.set(i)
				default:
					tr.get(i)
				}
			}
		})
	}
	wg.Wait()
}

// get reads key i and, on a miss, fills it as cache-aside does.
func (tr *vtraffic) get(i int) {
	floor := tr.keys[i].lastOK.Load()
	start := time.Now()
	it, err := tr.c.Get(tr.key(i))
	tr.count(func(c *vcounters) { c.ops.Add(1); c.gets.Add(1) })
	switch {
	case err == nil:
		tr.count(func(c *vcounters) { c.hits.Add(1) })
		tr.check(i, floor, it.Value)
	case errors.Is(err, memcache.ErrCacheMiss):
		tr.set(i)
	default:
		tr.failed(start, "get", err)
	}
}

// set writes a new version of key i.
func (tr *vtraffic) set(i int) error {
	k := &tr.keys[i]
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes.Add(1)
	defer k.done.Add(1)
	v := k.next.Add(1)
	start := time.Now()
	err := tr.c.Set(&memcache.Item{Key: tr.key(i), Value: tr.value(i, v)})
	tr.count(func(c *vcounters) { c.ops.Add(1) })
	if err != nil {
		k.state.Store(keyUnknown)
		tr.failed(start, "set", err)
		return err
	}
	k.lastOK.Store(v)
	k.state.Store(keyPresent)
	return nil
}

// del deletes key i; a miss is a success (the key is not there).
func (tr *vtraffic) del(i int) {
	k := &tr.keys[i]
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes.Add(1)
	defer k.done.Add(1)
	v := k.next.Add(1)
	start := time.Now()
	err := tr.c.Delete(tr.key(i))
	tr.count(func(c *vcounters) { c.ops.Add(1) })
	if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
		k.state.Store(keyUnknown)
		tr.failed(start, "delete", err)
		return
	}
	k.lastOK.Store(v)
	k.state.Store(keyAbsent)
}

// check counts a stale read of key i: a value of another key, of a version
// never written, or older than floor, the last successful write before the
// read started.
func (tr *vtraffic) check(i int, floor int64, val []byte) {
	s := string(val)
	key, vs, ok := strings.Cut(s, ":")
	v, err := strconv.ParseInt(vs, 10, 64)
	if ok && err == nil && key == tr.key(i) && v >= floor && v <= tr.keys[i].next.Load() {
		return
	}
	tr.count(func(c *vcounters) { c.stale.Add(1) })
	tr.mu.Lock()
	if len(tr.stale) < maxStaleSamples {
		tr.stale = append(tr.stale, fmt.Sprintf("%s read %q, last successful write before the read: version %d", tr.key(i), s, floor))
	}
	tr.mu.Unlock()
}

func (tr *vtraffic) failed(start time.Time, op string, err error) {
	to := isTimeout(err)
	tr.count(func(c *vcounters) {
		switch op {
		case "get", "getmulti":
			c.getErrs.Add(1)
		case "set":
			c.setErrs.Add(1)
		default:
			c.delErrs.Add(1)
		}
		if to {
			c.timeouts.Add(1)
		}
	})
	tr.mu.Lock()
	if len(tr.events) < maxErrEvents {
		tr.events = append(tr.events, errEvent{at: start, op: op, timeout: to, err: err})
	}
	tr.mu.Unlock()
}

// isTimeout reports whether err is a timeout: of a read or write, or of a
// connect.
func isTimeout(err error) bool {
	var cte *memcache.ConnectTimeoutError
	var ne net.Error
	return errors.As(err, &cte) || errors.As(err, &ne) && ne.Timeout()
}

// errorsBetween returns the errors of the requests that started in
// [from, to), by operation, and how many of them were timeouts.
func (tr *vtraffic) errorsBetween(from, to time.Time) (byOp map[string]int, timeouts int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	byOp = map[string]int{}
	for _, ev := range tr.events {
		if !ev.at.Before(from) && ev.at.Before(to) {
			byOp[ev.op]++
			if ev.timeout {
				timeouts++
			}
		}
	}
	return byOp, timeouts
}

// errorSamples returns the first n errors seen.
func (tr *vtraffic) errorSamples(n int) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, ev := range tr.events[:min(n, len(tr.events))] {
		out = append(out, fmt.Sprintf("%s at %s: %v", ev.op, ev.at.Format("15:04:05.000"), ev.err))
	}
	return out
}

func (tr *vtraffic) staleSamples() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.stale...)
}

// warm writes a new version of every key, and returns the failed writes.
func (tr *vtraffic) warm() int {
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range vWarmWorkers {
		wg.Go(func() {
			for i := w; i < len(tr.keys); i += vWarmWorkers {
				if tr.set(i) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(failed.Load())
}

// sweep reads every key with GetMulti (no fills), checks what it reads,
// and counts in the current phase the keys that should be there (their
// last write, not changed during the read, was a successful Set) and those
// of them found.
func (tr *vtraffic) sweep() {
	for from := 0; from < len(tr.keys); from += vSweepBatch {
		n := min(vSweepBatch, len(tr.keys)-from)
		names := make([]string, n)
		floors, states, writes := make([]int64, n), make([]int32, n), make([]int64, n)
		inFlight := make([]bool, n)
		for j := range n {
			k := &tr.keys[from+j]
			names[j] = tr.key(from + j)
			done := k.done.Load() // before writes: a write that ends in between counts as in flight
			writes[j], floors[j], states[j] = k.writes.Load(), k.lastOK.Load(), k.state.Load()
			inFlight[j] = writes[j] != done
		}
		start := time.Now()
		items, err := tr.c.GetMulti(names)
		tr.count(func(c *vcounters) { c.ops.Add(1); c.swept.Add(int64(n)) })
		if err != nil {
			tr.failed(start, "getmulti", err)
		}
		for j := range n {
			it := items[names[j]]
			if it != nil {
				tr.check(from+j, floors[j], it.Value)
			}
			// Absent by the application's own doing, or written during the
			// read (a Delete in flight when it began still shows the key
			// present, and may have removed it before the read).
			if states[j] != keyPresent || inFlight[j] || tr.keys[from+j].writes.Load() != writes[j] {
				continue
			}
			tr.count(func(c *vcounters) {
				c.expected.Add(1)
				if it != nil {
					c.kept.Add(1)
				}
			})
		}
	}
}

// runAll starts every traffic; the returned stop ends them and waits.
func runAll(ctx context.Context, trs ...*vtraffic) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, tr := range trs {
		wg.Go(func() { tr.run(ctx) })
	}
	return func() { cancel(); wg.Wait() }
}

// phaseAll ends the current phase of every traffic, and returns its
// counters in the same order.
func phaseAll(trs ...*vtraffic) []*vcounters {
	out := make([]*vcounters, len(trs))
	for i, tr := range trs {
		out[i] = tr.phase()
	}
	return out
}

// logConsistency logs, one line a traffic, the stale reads over all of
// its operations, with samples.
func logConsistency(t *testing.T, scenario string, trs ...*vtraffic) {
	t.Helper()
	for _, tr := range trs {
		t.Logf("%s: consistency: %-12s %d stale reads in %d requests (%d gets, %d keys swept)",
			scenario, tr.name+":", tr.all.stale.Load(), tr.all.ops.Load(), tr.all.gets.Load(), tr.all.swept.Load())
		for _, s := range tr.staleSamples() {
			t.Logf("%s: consistency: %s: stale read: %s", scenario, tr.name, s)
		}
	}
}

// dialRecorder wraps the clients' dialers and remembers which client made
// each connection, by its local address, so that the sockets found in /proc
// can be told apart.
type dialRecorder struct{ owner sync.Map } // local address -> client name

func (r *dialRecorder) dial(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			r.owner.Store(c.LocalAddr().String(), name)
		}
		return c, err
	}
}

// sockets counts this process's open TCP sockets to port (file descriptors
// of /proc/self/fd that /proc/net/tcp lists with that remote port, in any
// state: one in CLOSE_WAIT still holds its descriptor), by the client that
// dialed them ("" for others: earlier tests' clients).
func (r *dialRecorder) sockets(port int) (map[string]int, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || !inodes[fields[9]] {
			continue
		}
		local, lerr := parseProcAddr(fields[1])
		remote, rerr := parseProcAddr(fields[2])
		if lerr != nil || rerr != nil || remote.Port != port {
			continue
		}
		name, _ := r.owner.Load(local.String())
		s, _ := name.(string)
		out[s]++
	}
	return out, sc.Err()
}

// parseProcAddr parses an IPv4 address of /proc/net/tcp: the address as a
// host-order (little-endian) hex word, a colon, the port in hex.
func parseProcAddr(s string) (*net.TCPAddr, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("bad address %q", s)
	}
	ip, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, err
	}
	return &net.TCPAddr{IP: net.IPv4(byte(ip), byte(ip>>8), byte(ip>>16), byte(ip>>24)), Port: int(port)}, nil
}
