package selector

import (
	"context"

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
	opLease      // a read that takes a lease on a miss (see GetOrLoad)
	opInvalidate // marks the key's value stale (see Invalidate)
)

// idempotent reports whether running the operation twice leaves the same
// state as once, so that it may be sent again after a broken connection:
// get, set, delete, touch and invalidate, and GetOrLoad's lease read (a
// second one finds the first's placeholder, and waits for it, or loads
// after LoadOptions.Wait). add, cas, append, prepend, incr and decr are
// not: a second run would report a stored add as not stored, or apply a
// change twice. A timeout is never retried: the server may be hung, and a
// retry would wait as long again.
func (k opKind) idempotent() bool {
	switch k {
	case opGet, opGetAndTouch, opTouch, opSet, opDelete, opInvalidate, opLease:
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

// stores reports whether the operation leaves a value of its own at the
// server, with a new CAS id.
func (k opKind) stores() bool {
	switch k {
	case opSet, opAdd, opReplace, opCAS, opAppend, opPrepend, opIncr, opDecr:
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
	ctx   context.Context
	kind  opKind
	key   string
	item  *memcache.Item // for the writes
	exp   int32          // for GetAndTouch and Touch
	ttl   bool           // for Get: the item's Expiration is its remaining one (see wire.GetForCopy)
	delta uint64         // for Increment and Decrement
	lease *leaseRead     // for opLease: what the read found (see leaseRead)
	only  *server        // if not nil, the one server it may run at (see storeLoaded)

	// For a delete: the routing whose former servers of the key it has
	// deleted it at (see Client.do), and whether it found it there.
	seen         *routing
	deletedFirst bool

	got *memcache.Item // a read's item
	n   uint64         // a counter's new value
}

// keepsOnRefusal reports whether a refusal of the operation leaves the
// key's value as it was: add, replace, cas, append and prepend. (A set that
// memcached refuses deletes the value, in either protocol.)
func (k opKind) keepsOnRefusal() bool {
	switch k {
	case opAdd, opReplace, opCAS, opAppend, opPrepend:
		return true
	}
	return false
}

// classicFrom is the size of value from which the operations that keep the
// value on a refusal go by the classic protocol: memcached's ms of a value
// too large for it deletes the key's value whatever the mode (its
// process_mset_command avoids "stale data" so), where its classic commands
// delete it only for a set. gomemcache's Append of a value too large keeps
// the value, and so does the Client's. It is under 1 MiB, memcached's
// default largest item, by more than an item's header and longest key.
const classicFrom = 1<<20 - 512

// runOp sends r to s. standIn says that s is not the key's home: the
// expiration of what r writes there is capped (see Client.standInExp).
// A value larger than s stores is not sent (see server.fits): the check
// runs in call, after the first contact has read s's limit.
func (c *Client) runOp(s *server, r *keyOp, standIn bool) error {
	if r.kind.keepsOnRefusal() && len(r.item.Value) >= classicFrom {
		return s.call(func(wire) error {
			if err := s.fits(r); err != nil {
				return err
			}
			return c.send(s.classic, r, standIn)
		})
	}
	return s.call(func(w wire) error {
		if err := s.fits(r); err != nil {
			return err
		}
		return c.send(w, r, standIn)
	})
}

func (c *Client) send(w wire, r *keyOp, standIn bool) (err error) {
	ctx := r.ctx
	switch r.kind {
	case opGet:
		if r.ttl {
			r.got, _, err = w.GetForCopy(ctx, r.key, c.handoffTTL())
		} else {
			r.got, err = w.Get(ctx, r.key)
		}
	case opGetAndTouch:
		exp := r.exp
		if standIn {
			exp = c.standInExp(exp)
		}
		r.got, err = w.GetAndTouch(ctx, r.key, exp)
	case opTouch:
		exp := r.exp
		if standIn {
			exp = c.standInExp(exp)
		}
		err = w.Touch(ctx, r.key, exp)
	case opSet, opAdd, opReplace, opCAS, opAppend, opPrepend:
		it := r.item
		if standIn && c.standInExp(it.Expiration) != it.Expiration {
			cp := *it
			cp.Expiration = c.standInExp(it.Expiration)
			it = &cp
		}
		err = w.Store(ctx, r.kind, it)
	case opDelete:
		err = w.Delete(ctx, r.key)
	case opIncr, opDecr:
		r.n, err = w.Arith(ctx, r.key, r.delta, r.kind == opDecr)
	case opLease:
		r.got, err = r.lease.send(ctx, w, r.key, r.exp)
	case opInvalidate:
		err = invalidateOn(ctx, w, r.key, r.exp)
	}
	return err
}
