package meta

import (
	"sync"
	"sync/atomic"
	"time"
)

// op is the kind of a pipeline entry.
type op uint8

const (
	opGet op = iota + 1
	opSet
	opDelete
	opArith
	opNoop
	opBatch // quiet mg per key, an mn every batchMark keys, and mn
	opStats // stats settings (see stats.go)
)

var opNames = [...]string{"?", "mg", "ms", "md", "ma", "mn", "mg batch", "stats settings"}

func (o op) String() string { return opNames[o] }

// expects reports whether s is a reply o can get; any other is a sign
// that the stream is out of step.
func (o op) expects(s Status) bool {
	switch o {
	case opGet:
		return s == StatusVA || s == StatusHD || s == StatusEN
	case opSet:
		return s == StatusHD || s == StatusNS || s == StatusEX || s == StatusNF
	case opDelete:
		return s == StatusHD || s == StatusNF || s == StatusEX
	case opArith:
		return s == StatusHD || s == StatusVA || s == StatusNF || s == StatusNS || s == StatusEX
	case opNoop:
		return s == StatusMN
	}
	return false
}

// The states of a call: waiting for its reply, answered, left by its
// caller (whose context ended), in which case whoever reads its reply
// recycles it, or its caller holds the read role (see Conn).
const (
	callWaiting int32 = iota
	callDone
	callAbandoned
	callLeading
)

// call is one pipeline entry: a request, and then its reply. Calls are
// recycled through callPool so that a request allocates nothing.
type call struct {
	state atomic.Int32
	done  chan struct{} // receives once, when state becomes callDone or callLeading

	op    op
	key   string
	value []byte
	get   GetOptions
	set   SetOptions
	del   DeleteOptions
	arith ArithOptions
	batch *batch

	sent time.Time // when it was queued: its reply is due by sent+timeout
	n    uint64    // its place among the Conn's requests (see Conn.answered)
	rep  Reply
	err  error
}

// batch is a GetMulti's keys and, by index (opaque-1), its hits.
type batch struct {
	keys  []string
	items []Item
	hit   []bool
}

// batchPool recycles the batches that were read and released (see
// Batch.Release); one abandoned by its caller is not recycled, as its
// reader may still write it.
var batchPool = sync.Pool{New: func() any { return new(batch) }}

// newBatch returns a batch of keys, recycled if one is at hand.
func newBatch(keys []string) *batch {
	b := batchPool.Get().(*batch)
	n := len(keys)
	if cap(b.items) < n || cap(b.items) > 4*n+64 {
		b.items, b.hit = make([]Item, n), make([]bool, n)
	}
	b.keys, b.items, b.hit = keys, b.items[:n], b.hit[:n]
	return b
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func getCall(o op, key string) *call {
	cl := callPool.Get().(*call)
	cl.state.Store(callWaiting)
	cl.op, cl.key = o, key
	return cl
}

// putCall recycles cl, keeping its value buffer unless it is large.
func putCall(cl *call) {
	v, k := cl.rep.Value[:0], cl.rep.Key[:0]
	if cap(v) > 4<<10 {
		v = nil
	}
	done := cl.done
	*cl = call{done: done}
	cl.rep.Value, cl.rep.Key = v, k
	callPool.Put(cl)
}

// setOpaque sets the opaque cl's request is sent with, except for mn
// (which takes no flags) and batches (whose opaques are key indexes).
func (cl *call) setOpaque(o uint32) {
	switch cl.op {
	case opGet:
		cl.get.Opaque = o
	case opSet:
		cl.set.Opaque = o
	case opDelete:
		cl.del.Opaque = o
	case opArith:
		cl.arith.Opaque = o
	}
}

// opaque is the opaque cl's request was sent with, 0 for none.
func (cl *call) opaque() uint32 {
	switch cl.op {
	case opGet:
		return cl.get.Opaque
	case opSet:
		return cl.set.Opaque
	case opDelete:
		return cl.del.Opaque
	case opArith:
		return cl.arith.Opaque
	}
	return 0
}

// encode appends cl's request to dst. Keys were checked before.
func (cl *call) encode(dst []byte) []byte {
	switch cl.op {
	case opGet:
		dst, _ = AppendGet(dst, cl.key, cl.get)
	case opSet:
		dst, _ = AppendSet(dst, cl.key, cl.value, cl.set)
	case opDelete:
		dst, _ = AppendDelete(dst, cl.key, cl.del)
	case opArith:
		dst, _ = AppendArith(dst, cl.key, cl.arith)
	case opNoop:
		dst = AppendNoop(dst)
	case opStats:
		dst = append(dst, "stats settings\r\n"...)
	case opBatch:
		o := cl.get
		o.Quiet = true
		for i, k := range cl.batch.keys {
			if i > 0 && i%batchMark == 0 {
				dst = AppendNoop(dst)
			}
			o.Opaque = uint32(i + 1)
			dst, _ = AppendGet(dst, k, o)
		}
		dst = AppendNoop(dst)
	}
	return dst
}

// batchMark is how many keys of a batch go between two mn: a batch's
// misses have no reply, so a large batch that misses would otherwise
// show no sign of progress until its end (see readBatch).
const batchMark = 1024

// marks is the number of mn a batch of n keys is sent with, its last one
// included.
func marks(n int) int { return (n-1)/batchMark + 1 }
