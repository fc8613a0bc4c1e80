package histcheck

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// The loads (issue 27, items 2 and 7) are an application's cache-aside
// over a database, in a key space of their own: writers update a key's row
// and then Set the key, invalidate it (Invalidate) or Delete it;
// readers call GetOrLoad, whose load function reads the row. gomemcache's
// client, which has no GetOrLoad, does plain cache-aside instead (Get, and
// on a miss load the row and Set it), and its writers Delete rather than
// invalidate: the control, whose loads set old rows after newer writes.
//
// How the history records them, so that Check's rule holds for loads as it
// does for plain writes:
//
//   - A writer's database update and its write of the cache are one Write
//     event of the new value (op db+set, db+invalidate or db+delete): from
//     before the update to the cache's answer, acknowledged if the cache
//     acknowledged. A row is only ever read after its update began, and
//     once the event ended every read must find the value or a newer one
//     (a miss aside): the cache no longer holds the value before (Set
//     replaced it, the invalidation or Delete took it out) and any later
//     load reads the row. So a loaded value is the Write that updated the
//     row it was read from.
//   - A GetOrLoad, or the control's cache-aside, is a Read of what it
//     returned, from the cache or loaded: a load that began after the read
//     began reads a row at least as new as any write acknowledged before,
//     and a load it joined (one in flight, in the same Client) that read
//     its row before such a write is stale (item 2).
//   - The cache's set of a loaded value is no event: it copies a row,
//     which writes nothing new (as a handoff's copy writes nothing new).
//     Where it lands after a newer write (a stale set: item 7, or the
//     control's race), a later read of it is stale by the rule.
//   - A FlushAll empties the cache, not the database, so Check does not
//     take it for a write of a loaded key (Event.DB).
//
// GetOrLoad is called without LoadOptions.Stale, which serves a value
// Invalidate marked stale (a read the rule rightly calls stale).

// loadTimeout bounds every call of the loads: a GetOrLoad that waits for a
// lease whose holder's server stopped waits LoadOptions.Wait (1 s), then
// loads.
const loadTimeout = 3 * time.Second

// maxQuery is the longest a load takes after it read its row: loads
// overlap the writes of their keys, and the calls that come meanwhile join
// them.
const maxQuery = 2 * time.Millisecond

func loadKey(i int) string { return keyPrefix + "d" + strconv.Itoa(i) }

// database is the authority of the loaded keys: a row per key.
type database struct {
	mu    sync.Mutex
	rows  map[string]string
	holds map[string]*hold // the next load of the key waits (see holdNext)
	loads atomic.Int64
}

func newDatabase() *database {
	return &database{rows: map[string]string{}, holds: map[string]*hold{}}
}

// errNoRow is a load of a key never written: the fill writes every one.
var errNoRow = errors.New("histcheck: no row for the key")

func (db *database) update(key, v string) {
	db.mu.Lock()
	db.rows[key] = v
	db.mu.Unlock()
}

// load is the loads' load function: it reads the row, and returns it a moment
// later (the query's time), or when the hold of the key is released.
func (db *database) load(ctx context.Context, key string) (*memcache.Item, error) {
	db.mu.Lock()
	v, ok := db.rows[key]
	h := db.holds[key]
	delete(db.holds, key)
	db.mu.Unlock()
	db.loads.Add(1)
	if !ok {
		return nil, errNoRow
	}
	var wait <-chan struct{}
	if h != nil {
		close(h.started)
		wait = h.release
	} else {
		query := make(chan struct{})
		time.AfterFunc(rand.N(maxQuery), func() { close(query) })
		wait = query
	}
	select {
	case <-wait:
		return &memcache.Item{Value: []byte(v)}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// hold is a load kept waiting after it read its row, for a schedule to
// change the ring or fail a server meanwhile.
type hold struct {
	started chan struct{} // closed when the load has read its row
	release chan struct{} // the schedule closes it to let the load return
}

// holdNext makes the next load of key wait until h.release is closed.
func (db *database) holdNext(key string) *hold {
	h := &hold{started: make(chan struct{}), release: make(chan struct{})}
	db.mu.Lock()
	db.holds[key] = h
	db.mu.Unlock()
	return h
}

// loadOp is a worker's operation on a loaded key: 55% a read through the
// cache (GetOrLoad, or the control's cache-aside), 15% a Get, and 30% a
// write: the row updated, then the key Set, invalidated or deleted.
func (d *driver) loadOp(rng *rand.Rand, log *Log, st *opStats, phase string) {
	key := loadKey(rng.IntN(d.w.LoadKeys))
	for r := d.reserved.Load(); r != nil && key == *r; key = loadKey(rng.IntN(d.w.LoadKeys)) {
	}
	switch r := rng.IntN(100); {
	case r < 55:
		d.readThrough(d.t, log, st, key, phase)
	case r < 70:
		e := Event{Kind: Read, Op: "get", Key: key, DB: true, Start: log.Now(), Phase: phase}
		it, err := d.t.Get(key)
		e.End = log.Now()
		read(&e, it, err)
		log.Add(e)
		st.count("get", phase, ignoreMiss(err))
	default:
		d.dbWrite(d.t, log, st, key, phase, [...]string{"set", "invalidate", "delete"}[r%3])
	}
}

// readThrough reads key through the cache as the application does, and
// records what it returned: GetOrLoad where t has it, else cache-aside.
func (d *driver) readThrough(t Target, log *Log, st *opStats, key, phase string) Event {
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	e := Event{Kind: Read, Op: "getorload", Key: key, DB: true, Start: log.Now(), Phase: phase}
	var it *memcache.Item
	var err error
	if l := d.loader(t); l != nil {
		it, err = l.GetOrLoad(ctx, key, d.db.load) // the defaults: no Stale
	} else {
		e.Op = "cache-aside"
		it, err = cacheAside(ctx, t, key, d.db.load)
	}
	e.End = log.Now()
	read(&e, it, err)
	log.Add(e)
	st.count(e.Op, phase, err)
	return e
}

// cacheAside is the control's read: Get, and on a miss the row loaded and
// Set, with no protection against a write of the key meanwhile. It returns
// the loaded value whether or not the Set took.
func cacheAside(ctx context.Context, t Target, key string, load func(context.Context, string) (*memcache.Item, error)) (*memcache.Item, error) {
	it, err := t.Get(key)
	if !errors.Is(err, memcache.ErrCacheMiss) {
		return it, err
	}
	if it, err = load(ctx, key); err != nil {
		return nil, err
	}
	it.Key = key
	return it, t.Set(it)
}

// dbWrite updates key's row to a new value, then writes the cache as how
// says: "set" the value, "invalidate" it (a Delete where t has no
// Invalidate), or "delete" it. It goes through t, the target: the
// Client's promise of GetOrLoad after a write is for its own writes, and a
// client that joined (Env.Join) is another.
func (d *driver) dbWrite(t Target, log *Log, st *opStats, key, phase, how string) Event {
	l := d.loader(t)
	if how == "invalidate" && l == nil {
		how = "delete"
	}
	v := d.value()
	e := Event{Kind: Write, Op: "db+" + how, Key: key, DB: true, Value: v, Start: log.Now(), Phase: phase}
	d.db.update(key, v)
	var err error
	switch how {
	case "set":
		err = t.Set(&memcache.Item{Key: key, Value: []byte(v)})
	case "invalidate":
		ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
		err = l.Invalidate(ctx, key)
		cancel()
	case "delete":
		err = t.Delete(key)
	}
	d.ack(log, &e, ignoreMiss(err), st)
	return e
}

// loader returns t's GetOrLoad and Invalidate, or nil where t has
// none (the control): through loaderOf, which the tests set to adapt the
// Client, so that this file names no type of the root package.
func (d *driver) loader(t Target) Loader {
	if d.loaderOf == nil {
		return nil
	}
	return d.loaderOf(t)
}
