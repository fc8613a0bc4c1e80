package selector

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// moveBatch moves keys, listed at p, as moveKey moves each, with each step
// pipelined over the batch (see meta.Pipeline): a round trip a step for
// the batch, not one a step for each key (BenchmarkMoves). The steps are
// copyTo's, in an order that needs one read of p, not two:
//
//  1. reserve each key at its owner (a placeholder, see wire.Reserve);
//  2. read p's value, flags, remaining expiration and CAS, and, at the
//     owners, the keys' tombstones (see tombstone.go);
//  3. fill each placeholder by its CAS with p's value, unless p has none a
//     read would serve, a tombstone is there, or a write or delete of
//     this client's overtook the copy (see copies): then it is removed;
//  4. delete at p each key copied, or present at its owner already, if
//     p's value is still the one read (md with its CAS).
//
// p is read after the reservation, so a delete before it is seen there; a
// delete or write after it replaces or removes the placeholder, and the
// fill fails. A key that needs more than this (its owner speaks the
// classic protocol, p is not the first place a read looks for it, p must
// forget it, the owner holds an older value of it, or whose losses are not
// known) is moved by moveKey.
func (c *Client) moveBatch(ctx context.Context, mc *moveConns, p *server, keys []string) (_ []moveResult, owners []*server, bytes int64) {
	rt := c.rt.Load()
	now := time.Now()
	b := &moveBatchState{p: p, mc: mc, ms: make([]batchMove, len(keys)), byOwner: map[*server][]int{}}
	var buf [4]*server
	for i, k := range keys {
		m := &b.ms[i]
		m.key, m.h = k, c.hash(k)
		s := movableTo(rt, m.h)
		if s == nil || s == p || s.proto.Load() != protoMeta || p.proto.Load() != protoMeta || firstSource(rt, m.h, s, now, buf[:0]) != p {
			m.single = true
			continue
		}
		if logged := c.inval.lookup(p, k); logged {
			m.single = true
			continue
		}
		m.s = s
		b.byOwner[s] = append(b.byOwner[s], i)
	}
	for s, idx := range b.byOwner {
		if !c.lossesKnown(ctx, s) {
			for _, i := range idx {
				b.ms[i].single = true
			}
			delete(b.byOwner, s)
			continue
		}
		for _, i := range idx {
			b.ms[i].st = c.copies.begin(b.ms[i].key)
		}
	}
	c.runBatch(b)
	for i := range b.ms {
		if m := &b.ms[i]; m.st != nil {
			c.copies.done(m.key, m.st)
			m.st = nil
		}
	}
	res := make([]moveResult, len(keys))
	for i := range b.ms {
		m := &b.ms[i]
		if m.single {
			res[i] = c.moveKey(ctx, p, m.key)
			continue
		}
		res[i] = m.res
	}
	c.mover.add(func(st *MoveStats) { st.Moved += b.moved; st.Left += b.left; st.Bytes += b.bytes })
	for s := range b.byOwner {
		owners = append(owners, s)
	}
	return res, owners, b.bytes
}

// moveBatchState is a batch of moveBatch: its keys by owner, and totals.
type moveBatchState struct {
	p       *server
	mc      *moveConns
	ms      []batchMove
	byOwner map[*server][]int // indexes into ms, of the keys moved here
	mu      sync.Mutex        // guards moved, left, and ms from the steps at the owners
	moved   int
	left    int
	bytes   int64 // of the values copied
}

// batchMove is one key of a batch, and where its move stands.
type batchMove struct {
	key     string
	h       uint64
	s       *server // its owner
	st      *copyState
	stub    uint64         // the placeholder's CAS at s, once reserved
	src     *memcache.Item // p's value, once read
	tomb    tombState      // the key's tombstone at s
	undo    bool           // the placeholder is to be removed
	drop    bool           // s holds the key now: p's value is deleted (step 4)
	decided bool           // res is final
	res     moveResult
	single  bool // moved by moveKey
}

// tombState is what a batch found of a key's tombstone at its owner.
type tombState uint8

const (
	tombNone    tombState = iota // none: no delete to keep
	tombFound                    // a delete by a client that did not see the change
	tombUnknown                  // the owner did not answer
)

// firstSource returns the server a read of a key of hash h, owned by s,
// looks at first for its handoff (see handoffFrom), or nil.
func firstSource(rt *routing, h uint64, s *server, now time.Time, buf []*server) *server {
	for _, q := range rt.previous(h, s, now, buf) {
		if q.readable() {
			return q
		}
	}
	return nil
}

// decide ends m's move with r, counting it (under b.mu).
func (b *moveBatchState) decide(m *batchMove, r moveResult, moved bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.decided {
		return
	}
	m.decided, m.res = true, r
	switch {
	case moved:
		b.moved++
	case r != moveDone:
		b.left++
	}
}

// runBatch runs the four steps of moveBatch over b's keys.
func (c *Client) runBatch(b *moveBatchState) {
	if len(b.byOwner) == 0 {
		return
	}
	p := b.p
	atOwners := func(f func(s *server, idx []int)) {
		var wg sync.WaitGroup
		for s, idx := range b.byOwner {
			wg.Go(func() { f(s, idx) })
		}
		wg.Wait()
	}
	// 1. Reserve. Each step runs on the Client's context, within the
	// timeout: a batch that a change of servers stopped halfway would
	// leave placeholders, or keys at two servers (see copyTo).
	atOwners(func(s *server, idx []int) { c.reserveBatch(b, s, idx) })

	// 2. Read p, and the tombstones at the owners.
	var wg sync.WaitGroup
	wg.Go(func() { c.readSources(b) })
	atOwners(func(s *server, idx []int) { c.checkTombs(b, s, idx) })
	wg.Wait()

	// 3. Fill or undo.
	atOwners(func(s *server, idx []int) { c.fillBatch(b, s, idx) })

	// 4. Delete at p what its owner holds now, unless it changed since.
	var reqs []meta.Request
	for i := range b.ms {
		if m := &b.ms[i]; m.src != nil && m.drop {
			reqs = append(reqs, meta.Request{Kind: meta.KindDelete, Key: m.key, Delete: meta.DeleteOptions{CompareCAS: m.src.CasID}})
		}
	}
	if len(reqs) > 0 {
		b.mc.pipeline(c.ctx, p, reqs) // a key left at p is its owner's already: deleted at the next round
	}
}

// moveConns are the connections that the moves from one source use: of
// their own, so that no request of the application's waits behind a batch
// on a connection of the server's pool. Each is dialed at the first batch
// to its server, again after it failed, and closed when the source's
// moves end.
type moveConns struct {
	mu sync.Mutex
	m  map[*server]*meta.Conn
}

// pipeline sends reqs to s at once (see meta.Pipeline) on the moves' own
// connection to s.
func (mc *moveConns) pipeline(ctx context.Context, s *server, reqs []meta.Request) error {
	conn, err := mc.conn(ctx, s)
	if err != nil {
		return err
	}
	return conn.Pipeline(ctx, reqs)
}

func (mc *moveConns) conn(ctx context.Context, s *server) (*meta.Conn, error) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if c := mc.m[s]; c != nil && c.Err() == nil {
		return c, nil
	}
	dctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	nc, err := s.dial(dctx)
	if err != nil {
		return nil, &dialError{err}
	}
	if mc.m == nil {
		mc.m = map[*server]*meta.Conn{}
	}
	if old := mc.m[s]; old != nil {
		old.Close()
	}
	c := meta.NewConn(nc, meta.Options{Timeout: s.timeout, MaxValueSize: s.meta.p.MaxValueSize()})
	mc.m[s] = c
	return c, nil
}

// close closes the connections; it is idempotent.
func (mc *moveConns) close() {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	for s, c := range mc.m {
		c.Close()
		delete(mc.m, s)
	}
}

// reserveBatch reserves the keys idx of b at s (step 1).
func (c *Client) reserveBatch(b *moveBatchState, s *server, idx []int) {
	o := getItem
	o.Vivify, o.VivifyTTL = true, c.reserveTTL()
	reqs := make([]meta.Request, len(idx))
	var err error
	for j, i := range idx {
		reqs[j] = meta.Request{Kind: meta.KindGet, Key: b.ms[i].key, Get: o}
		if err == nil { // a placeholder is a write: not below a floor taken after it
			err = c.awaitGain(c.ctx, s, b.ms[i].h)
		}
	}
	if err == nil {
		err = b.mc.pipeline(c.ctx, s, reqs)
	}
	if err != nil {
		for _, i := range idx {
			c.reportHandoff(b.p, s, handoffMove, handoffFailed)
			b.decide(&b.ms[i], moveFailed, false)
		}
		return
	}
	mw := s.meta
	for j, i := range idx {
		m, r := &b.ms[i], &reqs[j]
		switch {
		case r.Err != nil:
			c.reportHandoff(b.p, s, handoffMove, handoffFailed)
			b.decide(m, moveFailed, false)
		case r.Item.Won() && !r.Item.Stale():
			m.stub = r.Item.CAS
		case mw.missed(c.ctx, m.key, r.Item): // another copy's placeholder
			b.decide(m, moveHeld, false)
		case !c.servable(c.ctx, s, m.key, m.h, r.Item.CAS):
			// An old value of s's, from before it gained the key's slot,
			// which servable deleted: moveKey reserves again.
			b.mu.Lock()
			m.single = true
			b.mu.Unlock()
		default:
			// s's value is newer than p's: a write's, or a copy's filled
			// already; p's is deleted, unless s missed a write of the key
			// and its value waits to be deleted (see copyTo).
			logged := c.inval.lookup(s, m.key)
			m.drop = !logged
			c.reportHandoff(b.p, s, handoffMove, handoffPresent)
			b.decide(m, moveDone, true)
		}
	}
}

// readSources reads, at p, the keys reserved at their owners, and those
// whose owner has them already (step 2).
func (c *Client) readSources(b *moveBatchState) {
	var reqs []meta.Request
	var which []*batchMove
	for i := range b.ms {
		m := &b.ms[i]
		if m.stub != 0 || m.drop {
			reqs = append(reqs, meta.Request{Kind: meta.KindGet, Key: m.key, Get: copyItem})
			which = append(which, m)
		}
	}
	if len(reqs) == 0 {
		return
	}
	p := b.p
	if err := b.mc.pipeline(c.ctx, p, reqs); err != nil {
		if f := failureOf(err); f != healthy {
			c.sourceFailed(p, f, err)
		}
		for _, m := range which {
			m.undo = true
			b.decide(m, moveFailed, false)
		}
		return
	}
	if p.timeouts.Load() != 0 { // a server that left counts its failures in a row (see goneFailed)
		p.timeouts.Store(0)
	}
	for j, m := range which {
		r := &reqs[j]
		switch {
		case r.Err != nil && !errors.Is(r.Err, meta.ErrMiss), r.Err == nil && !c.lossesKnown(c.ctx, p):
			// Or whether p's value predates a loss is not known yet (see
			// Client.lossesKnown): left for a later round.
			m.undo = true
			b.decide(m, moveFailed, false)
		case r.Err != nil, p.meta.missed(c.ctx, m.key, r.Item), !c.servable(c.ctx, p, m.key, m.h, r.Item.CAS):
			// p holds no value a read would serve: nothing to move.
			m.undo = true
			b.decide(m, moveDone, false)
		default:
			m.src = gmItem(m.key, r.Item)
		}
	}
}

// checkTombs reads the tombstones of the keys idx of b reserved at s
// (step 2).
func (c *Client) checkTombs(b *moveBatchState, s *server, idx []int) {
	var reqs []meta.Request
	var which []*batchMove
	for _, i := range idx {
		if m := &b.ms[i]; m.stub != 0 {
			reqs = append(reqs, meta.Request{Kind: meta.KindGet, Key: tombKey(m.key)})
			which = append(which, m)
		}
	}
	if len(reqs) == 0 {
		return
	}
	err := b.mc.pipeline(c.ctx, s, reqs)
	for j, m := range which {
		switch r := &reqs[j]; {
		case err != nil || r.Err != nil && !errors.Is(r.Err, meta.ErrMiss):
			m.tomb = tombUnknown // the copy cannot tell: p keeps the key
		case r.Err == nil:
			m.tomb = tombFound
		}
	}
}

// fillBatch fills, at s, the placeholders of the keys idx of b with p's
// values, or removes them (step 3).
func (c *Client) fillBatch(b *moveBatchState, s *server, idx []int) {
	var reqs []meta.Request
	var fills, undos []*batchMove
	for _, i := range idx {
		m := &b.ms[i]
		if m.stub == 0 {
			continue
		}
		switch {
		case m.undo || m.src == nil:
		case m.tomb == tombUnknown:
			c.reportHandoff(b.p, s, handoffMove, handoffUndone)
			b.decide(m, moveFailed, false)
		case m.tomb == tombFound:
			// Deleted by a client that did not see the change: p's value
			// is older than the delete.
			c.reportHandoff(b.p, s, handoffMove, handoffUndone)
			m.drop = true
			b.decide(m, moveDone, true)
		case c.copies.check(m.st):
			c.reportHandoff(b.p, s, handoffMove, handoffUndone)
			b.decide(m, moveFailed, false)
		default:
			cp := c.copyOf(s, m.src)
			reqs = append(reqs, meta.Request{Kind: meta.KindSet, Key: m.key, Value: cp.Value,
				Set: meta.SetOptions{TTL: cp.Expiration, ClientFlags: cp.Flags, CompareCAS: m.stub}})
			fills = append(fills, m)
			continue
		}
		undos = append(undos, m)
	}
	for _, m := range undos {
		reqs = append(reqs, meta.Request{Kind: meta.KindDelete, Key: m.key, Delete: meta.DeleteOptions{CompareCAS: m.stub}})
	}
	if len(reqs) == 0 {
		return
	}
	err := b.mc.pipeline(c.ctx, s, reqs)
	for j, m := range fills {
		if err != nil || reqs[j].Err != nil {
			// A write or delete got there first, and is newer; or s
			// failed, and the placeholder expires by itself.
			c.reportHandoff(b.p, s, handoffMove, handoffUndone)
			b.decide(m, moveFailed, false)
			continue
		}
		c.reportHandoff(b.p, s, handoffMove, handoffCopied)
		m.drop = true
		b.decide(m, moveDone, true)
		b.mu.Lock()
		b.bytes += int64(len(reqs[j].Value))
		b.mu.Unlock()
	}
}
