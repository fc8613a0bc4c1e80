package meta

import (
	"context"
	"fmt"
	"time"
)

// Item is what mg returned. Each field is set only when the request asked
// for it (see GetOptions), which Has records.
type Item struct {
	Key         string // k
	Value       []byte // v; the caller owns it
	ClientFlags uint32 // f
	CAS         uint64 // c
	TTL         int64  // t: seconds remaining, -1 if it never expires
	Size        int64  // s
	Has         Returned
}

// Won reports the W flag: this caller won the right to recache the item
// (after a vivify on miss, or on a stale item).
func (it Item) Won() bool { return it.Has&RetWon != 0 }

// Stale reports the X flag: the item was invalidated (md with I).
func (it Item) Stale() bool { return it.Has&RetStale != 0 }

// AlreadyWon reports the Z flag: another caller already won the recache.
func (it Item) AlreadyWon() bool { return it.Has&RetAlreadyWon != 0 }

func itemOf(rep *Reply) Item {
	it := Item{
		ClientFlags: rep.ClientFlags,
		CAS:         rep.CAS,
		TTL:         rep.TTL,
		Size:        rep.Size,
		Has:         rep.Has &^ RetOpaque, // the Conn's, not the caller's
	}
	if rep.Status == StatusVA {
		it.Value = rep.Value[:len(rep.Value):len(rep.Value)]
	}
	if rep.Has&RetKey != 0 {
		it.Key = string(rep.Key)
	}
	return it
}

// Counter is what ma returned: the new value (when asked for with
// ArithOptions.Value), TTL and CAS (when asked for), as recorded in Has.
type Counter struct {
	Value uint64
	TTL   int64
	CAS   uint64
	Has   Returned
}

// statusErr maps the statuses that are answers, not successes, to their
// sentinels.
func statusErr(s Status) error {
	switch s {
	case StatusEN:
		return ErrMiss
	case StatusNF:
		return ErrNotFound
	case StatusNS:
		return ErrNotStored
	case StatusEX:
		return ErrExists
	}
	return nil
}

// Get sends mg for key with o's flags. A miss is ErrMiss. o.Quiet is
// refused with ErrQuiet (a quiet miss has no reply); o.Opaque is replaced
// by the Conn's own (see [Conn]), as in the other requests.
func (c *Conn) Get(ctx context.Context, key string, o GetOptions) (Item, error) {
	if err := CheckKey(key); err != nil {
		return Item{}, err
	}
	if o.Quiet {
		return Item{}, ErrQuiet
	}
	cl := getCall(opGet, key)
	cl.get = o
	if err := c.do(ctx, cl); err != nil {
		return Item{}, err
	}
	defer putCall(cl)
	if cl.err != nil {
		return Item{}, cl.err
	}
	if err := statusErr(cl.rep.Status); err != nil {
		return Item{}, err
	}
	it := itemOf(&cl.rep)
	if cl.rep.Status == StatusVA {
		cl.rep.Value = nil // it owns it now
	}
	return it, nil
}

// Set sends ms for key with value and o's flags. The result has the new
// CAS when o.ReturnCAS. NS is ErrNotStored (an add of a present key, a
// replace or append of an absent one), EX is ErrExists (CAS mismatch), NF
// is ErrNotFound (CAS given, no item).
func (c *Conn) Set(ctx context.Context, key string, value []byte, o SetOptions) (Item, error) {
	if err := CheckKey(key); err != nil {
		return Item{}, err
	}
	if o.Quiet {
		return Item{}, ErrQuiet
	}
	cl := getCall(opSet, key)
	cl.value, cl.set = value, o
	if err := c.do(ctx, cl); err != nil {
		return Item{}, err
	}
	defer putCall(cl)
	if cl.err != nil {
		return Item{}, cl.err
	}
	if err := statusErr(cl.rep.Status); err != nil {
		return Item{}, err
	}
	return Item{CAS: cl.rep.CAS, Has: cl.rep.Has &^ RetOpaque}, nil
}

// Delete sends md for key with o's flags. NF is ErrNotFound, EX (CAS
// mismatch) is ErrExists.
func (c *Conn) Delete(ctx context.Context, key string, o DeleteOptions) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if o.Quiet {
		return ErrQuiet
	}
	cl := getCall(opDelete, key)
	cl.del = o
	if err := c.do(ctx, cl); err != nil {
		return err
	}
	defer putCall(cl)
	if cl.err != nil {
		return cl.err
	}
	return statusErr(cl.rep.Status)
}

// Arith sends ma for key with o's flags. NF (a miss without Vivify) is
// ErrNotFound, NS ErrNotStored, EX ErrExists. A value that is not a
// decimal number is an error wrapping ErrProtocol.
func (c *Conn) Arith(ctx context.Context, key string, o ArithOptions) (Counter, error) {
	if err := CheckKey(key); err != nil {
		return Counter{}, err
	}
	if o.Quiet {
		return Counter{}, ErrQuiet
	}
	cl := getCall(opArith, key)
	cl.arith = o
	if err := c.do(ctx, cl); err != nil {
		return Counter{}, err
	}
	defer putCall(cl)
	if cl.err != nil {
		return Counter{}, cl.err
	}
	if err := statusErr(cl.rep.Status); err != nil {
		return Counter{}, err
	}
	n := Counter{TTL: cl.rep.TTL, CAS: cl.rep.CAS, Has: cl.rep.Has &^ RetOpaque}
	if cl.rep.Status == StatusVA {
		v, ok := parseUint(cl.rep.Value, 1<<64-1)
		if !ok {
			return Counter{}, fmt.Errorf("%w: ma of %q returned %q, not a number", ErrProtocol, key, trunc(cl.rep.Value))
		}
		n.Value = v
	}
	return n, nil
}

// Noop sends mn and waits for MN: every request sent before it on this
// connection has been answered. A server that answers ERROR does not speak
// the meta protocol: the error wraps ErrNoMeta (and ErrUnknownCommand).
func (c *Conn) Noop(ctx context.Context) error {
	cl := getCall(opNoop, "")
	if err := c.do(ctx, cl); err != nil {
		return err
	}
	defer putCall(cl)
	return cl.err
}

// GetMulti gets keys in one pipeline entry: a quiet mg per key (with o's
// flags, plus k and O<index>), then mn; the hits are collected until MN
// and matched by opaque. The result holds the hits only. A SERVER_ERROR
// for some key is returned with the hits of the others.
func (c *Conn) GetMulti(ctx context.Context, keys []string, o GetOptions) (map[string]Item, error) {
	for _, k := range keys {
		if err := CheckKey(k); err != nil {
			return nil, err
		}
	}
	if len(keys) == 0 {
		return map[string]Item{}, nil
	}
	// The reader may read the keys after we return.
	bt, err := c.StartGetMulti(ctx, append([]string(nil), keys...), o)
	if err != nil {
		return nil, err
	}
	err = bt.Wait(ctx)
	if !bt.Read() {
		return nil, err
	}
	m := make(map[string]Item, bt.Hits())
	for i, ok := range bt.b.hit {
		if ok {
			m[bt.b.keys[i]] = bt.b.items[i]
		}
	}
	bt.Release()
	return m, err
}

// Batch is a GetMulti batch sent by [Conn.StartGetMulti] or
// [Pool.StartGetMulti], whose replies [Batch.Wait] reads. Sending the
// batches of several servers first and then waiting for each costs about
// one round trip for all, on the caller's goroutine.
type Batch struct {
	c    *Conn
	cl   *call  // nil once waited for
	b    *batch // nil unless its replies were read
	hits int
}

// StartGetMulti sends keys as GetMulti does, and returns without waiting
// for the replies: [Batch.Wait] reads them. keys are not copied: they must
// not change from now on, as the replies may be read, and the keys
// compared, even after Wait returns (when its context ended). Keys are
// not checked (see CheckKey); at least one is sent.
//
// Until Wait is called, nobody may read this connection's replies past
// the batch's: a batch started is to be waited for soon, whatever
// happens, as the requests queued after it wait too.
func (c *Conn) StartGetMulti(ctx context.Context, keys []string, o GetOptions) (Batch, error) {
	b := newBatch(keys)
	cl := getCall(opBatch, "")
	cl.get, cl.batch = o, b
	if _, err := c.start(ctx, cl, false); err != nil {
		return Batch{}, err
	}
	return Batch{c: c, cl: cl}, nil
}

// Wait waits for the batch's replies, reading them on the caller's
// goroutine if nobody else reads the connection. Its wait for the first
// reply is bounded by the timeout from now, not from when the batch was
// sent, so that batches waited for one after the other each have it.
//
// It returns nil if every reply was read; otherwise the error of a
// SERVER_ERROR for some key (the hits of the others are read), or of
// the connection failing (the hits read before are kept), or of ctx
// ending (no hit is kept, and the replies are read and discarded by
// whoever reads next). Read tells whether hits were kept. Wait may be
// called once.
func (bt *Batch) Wait(ctx context.Context) error {
	cl := bt.cl
	if cl == nil {
		return nil
	}
	bt.cl = nil
	b := cl.batch
	c := bt.c
	c.mu.Lock()
	lead := c.leadLocked(cl) // unless another reads, or read it already
	c.mu.Unlock()
	if err := c.wait(ctx, cl, time.Now(), lead); err != nil {
		return err // cl and b are whoever reads next's
	}
	err := cl.err
	putCall(cl)
	bt.b = b
	for _, ok := range b.hit {
		if ok {
			bt.hits++
		}
	}
	return err
}

// Release recycles the batch's items: Item may not be called after it (the
// values already had stay the caller's). A batch not released is left to
// the garbage collector.
func (bt *Batch) Release() {
	if b := bt.b; b != nil {
		bt.b = nil
		clear(b.items)
		clear(b.hit)
		b.keys, b.items, b.hit = nil, b.items[:0], b.hit[:0]
		batchPool.Put(b)
	}
}

// Read reports whether the batch's replies were read, and its hits can
// be had (see Wait).
func (bt *Batch) Read() bool { return bt.b != nil }

// Hits is the number of the batch's keys that hit.
func (bt *Batch) Hits() int { return bt.hits }

// Item returns the item of the batch's ith key and true if it hit, and
// false if it missed or the batch was not read. The item's Value is the
// caller's.
func (bt *Batch) Item(i int) (Item, bool) {
	if bt.b == nil || !bt.b.hit[i] {
		return Item{}, false
	}
	return bt.b.items[i], true
}
