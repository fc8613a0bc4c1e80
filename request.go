package selector

import (
	"github.com/bradfitz/gomemcache/memcache"
)

// opKind is a keyed operation of the Client.
type opKind uint8

const (
	opGet opKind = iota
	opGetAndTouch
	opTouch
	opSet
	opAdd
	opReplace
	opCAS
	opAppend
	opPrepend
	opDelete
	opIncr
	opDecr
)

// idempotent reports whether running the operation twice leaves the same
// state as once, so that it may be sent again after a broken connection:
// get, set, delete and touch. add, cas, append, prepend, incr and decr are
// not: a second run would report a stored add as not stored, or apply a
// change twice. A timeout is never retried: the server may be hung, and a
// retry would wait as long again.
func (k opKind) idempotent() bool {
	switch k {
	case opGet, opGetAndTouch, opTouch, opSet, opDelete:
		return true
	}
	return false
}

// inPlace reports whether the operation changes the value a server holds
// rather than replacing it, so that an old value there would leak into the
// result.
func (k opKind) inPlace() bool {
	switch k {
	case opTouch, opAppend, opPrepend, opIncr, opDecr, opGetAndTouch:
		return true
	}
	return false
}

// read reports whether the operation returns an item.
func (k opKind) read() bool { return k == opGet || k == opGetAndTouch }

// keyOp is one keyed operation: what to run, and what it returned. It is
// a value on the caller's stack, not a closure, so that the Client's Get and
// Set allocate no more than gomemcache's own.
type keyOp struct {
	kind  opKind
	key   string
	item  *memcache.Item // for the writes
	exp   int32          // for GetAndTouch and Touch
	delta uint64         // for Increment and Decrement

	got *memcache.Item // a read's item
	n   uint64         // a counter's new value
}

// run sends r to s. standIn says that s is not the key's home: the
// expiration of what r writes there is capped (see Client.standInExp).
func (c *Client) runOp(s *server, r *keyOp, standIn bool) error {
	s.inflight.Add(1)
	err := c.send(s.mc, r, standIn)
	if s.inflight.Add(-1) == 0 && s.retired.Load() {
		s.mc.Close()
	}
	if err == nil && !s.contacted.Load() {
		s.contacted.Store(true)
	}
	return err
}

func (c *Client) send(mc *memcache.Client, r *keyOp, standIn bool) (err error) {
	switch r.kind {
	case opGet:
		r.got, err = mc.Get(r.key)
	case opGetAndTouch:
		exp := r.exp
		if standIn {
			exp = c.standInExp(exp)
		}
		r.got, err = mc.GetAndTouch(r.key, exp)
	case opTouch:
		exp := r.exp
		if standIn {
			exp = c.standInExp(exp)
		}
		err = mc.Touch(r.key, exp)
	case opSet, opAdd, opReplace, opCAS, opAppend, opPrepend:
		it := r.item
		if standIn && c.standInExp(it.Expiration) != it.Expiration {
			cp := *it
			cp.Expiration = c.standInExp(it.Expiration)
			it = &cp
		}
		switch r.kind {
		case opSet:
			err = mc.Set(it)
		case opAdd:
			err = mc.Add(it)
		case opReplace:
			err = mc.Replace(it)
		case opCAS:
			err = mc.CompareAndSwap(it)
		case opAppend:
			err = mc.Append(it)
		case opPrepend:
			err = mc.Prepend(it)
		}
	case opDelete:
		err = mc.Delete(r.key)
	case opIncr:
		r.n, err = mc.Increment(r.key, r.delta)
	case opDecr:
		r.n, err = mc.Decrement(r.key, r.delta)
	}
	return err
}
