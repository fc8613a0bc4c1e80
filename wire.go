package selector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// wire is how the Client talks to one server: memcached's meta protocol on
// pipelined connections of its own (metaWire), or, for a server without the
// meta commands (memcached before 1.6, some proxies), gomemcache's classic
// protocol (classicWire). Both return gomemcache's items and error values,
// so that the Client's methods answer as *memcache.Client's do.
type wire interface {
	Get(ctx context.Context, key string) (*memcache.Item, error)
	// GetForCopy is Get with the item's remaining expiration in
	// Expiration (0: never expires), and whether it is exact: the classic
	// protocol cannot read it, and gives the fallback instead.
	GetForCopy(ctx context.Context, key string, fallback int32) (it *memcache.Item, exact bool, err error)
	GetMulti(ctx context.Context, keys []string) (map[string]*memcache.Item, error)
	// GetMultiForCopy is GetMulti with each item's expiration, as
	// GetForCopy's.
	GetMultiForCopy(ctx context.Context, keys []string, fallback int32) (map[string]*memcache.Item, error)
	GetAndTouch(ctx context.Context, key string, exp int32) (*memcache.Item, error)
	Touch(ctx context.Context, key string, exp int32) error
	Store(ctx context.Context, kind opKind, it *memcache.Item) error
	Delete(ctx context.Context, key string) error
	// Reserve puts a placeholder for a copy of key at the server (the meta
	// protocol's vivify, mg N), which the copy then fills with a
	// CompareAndSwap on the placeholder's CAS: a write or delete of the key
	// in between replaces or removes it, and the copy does not land over
	// it. Readers take a placeholder for a miss. Reserve returns the item
	// already there instead (present), or reserved false if another copy
	// holds the key; errNoReserve where the protocol has no placeholders
	// (classic).
	Reserve(ctx context.Context, key string, ttl int32) (present *memcache.Item, cas uint64, reserved bool, err error)
	// DeleteCAS deletes key if its CAS is still cas.
	DeleteCAS(ctx context.Context, key string, cas uint64) error
	Arith(ctx context.Context, key string, delta uint64, decr bool) (uint64, error)
	FlushAll(ctx context.Context) error
	Ping(ctx context.Context) error
	CloseIdle() // closes the idle connections; the wire stays usable
}

// metaWire is a wire over the meta protocol (see internal/meta). It is one
// pointer, so that it is a wire without an allocation.
type metaWire struct{ p *meta.Pool }

func newMetaWire(a *staticAddr, cc connConfig) metaWire {
	dial := cc.dialer()
	return metaWire{meta.NewPool(func(ctx context.Context) (net.Conn, error) {
		c, err := dial(ctx, a.network, a.str)
		if err != nil {
			return nil, &dialError{err}
		}
		return c, nil
	}, meta.Options{Timeout: cc.timeout, MaxConns: cc.maxIdle, MaxValueSize: cc.maxItem})}
}

// contact is the first contact with the server (see server.wire): mn tells
// whether it speaks the meta protocol. If it does, its stats settings tell
// the largest item it stores (memcached's -I, up to 1 GiB), which contact
// returns (0 if the server does not say), so that a larger value is not
// sent (see server.fits), and which becomes the bound on the values read
// from it, unless WithMaxItemSize set one: so that every value it stores is
// read, and no larger one is allocated for. A server that does not say
// keeps memcached's default bound, 1 MiB; a larger value fails its own
// request only (meta.ErrTooLarge).
func (w metaWire) contact(ctx context.Context) (itemMax int, err error) {
	if err := w.Ping(ctx); err != nil {
		return 0, err
	}
	n, err := w.p.ItemSizeMax(ctx)
	if err != nil {
		return 0, nil // it does not say: values are sent, and its answer stands
	}
	if w.p.Options().MaxValueSize == 0 { // WithMaxItemSize did not set it
		w.p.SetMaxValueSize(n)
	}
	return n, nil
}

var (
	getItem   = meta.GetOptions{Value: true, ClientFlags: true, CAS: true}
	copyItem  = meta.GetOptions{Value: true, ClientFlags: true, CAS: true, TTL: true}
	touchOnly = meta.GetOptions{Touch: true}
)

// placeholder reports whether it is a copy's placeholder (see
// wire.Reserve: W or Z) or an item another client invalidated (X): to
// this Client, a miss.
func placeholder(it meta.Item) bool {
	return it.Has&(meta.RetWon|meta.RetAlreadyWon|meta.RetStale) != 0
}

// missed reports whether it, read for key by a plain read, is to this
// Client a miss (see placeholder). memcached gives the first read of an
// invalidated item, of any kind, the right to recompute it (W with X): a
// plain read does not use it, and hands it back with a new invalidation
// (which bumps the CAS, and gives W to the next read), so that a
// GetOrLoad after it loads at once instead of waiting for a load that
// never comes.
func (w metaWire) missed(ctx context.Context, key string, it meta.Item) bool {
	if !placeholder(it) {
		return false
	}
	if it.Won() && it.Stale() {
		w.p.Delete(ctx, key, meta.DeleteOptions{Invalidate: true, CompareCAS: it.CAS})
	}
	return true
}

func (w metaWire) Get(ctx context.Context, key string) (*memcache.Item, error) {
	it, err := w.p.Get(ctx, key, getItem)
	if err == nil && w.missed(ctx, key, it) {
		err = meta.ErrMiss
	}
	if err != nil {
		return nil, gomemcacheErr("get", err)
	}
	return gmItem(key, it), nil
}

func (w metaWire) GetForCopy(ctx context.Context, key string, _ int32) (*memcache.Item, bool, error) {
	it, err := w.p.Get(ctx, key, copyItem)
	if err == nil && w.missed(ctx, key, it) {
		err = meta.ErrMiss
	}
	if err != nil {
		return nil, false, gomemcacheErr("get", err)
	}
	return gmItem(key, it), true, nil
}

func (w metaWire) GetMulti(ctx context.Context, keys []string) (map[string]*memcache.Item, error) {
	return w.getMulti(ctx, keys, getItem)
}

func (w metaWire) GetMultiForCopy(ctx context.Context, keys []string, _ int32) (map[string]*memcache.Item, error) {
	return w.getMulti(ctx, keys, copyItem)
}

func (w metaWire) getMulti(ctx context.Context, keys []string, o meta.GetOptions) (map[string]*memcache.Item, error) {
	got, err := w.p.GetMulti(ctx, keys, o)
	m := make(map[string]*memcache.Item, len(got))
	for k, it := range got {
		if w.missed(ctx, k, it) {
			continue
		}
		m[k] = gmItem(k, it)
	}
	if err != nil {
		return m, gomemcacheErr("get", err)
	}
	return m, nil
}

// gmItem is it, read for key, as gomemcache's item: with its remaining
// expiration if it was read (see copyExp), else none, as gomemcache's Get.
func gmItem(key string, it meta.Item) *memcache.Item {
	return &memcache.Item{Key: key, Value: it.Value, Flags: it.ClientFlags, CasID: it.CAS, Expiration: copyExp(it)}
}

// copyExp is the expiration, in memcached's form, that a copy of it keeps:
// its remaining TTL, if it was read.
func copyExp(it meta.Item) int32 {
	switch {
	case it.Has&meta.RetTTL == 0, it.TTL < 0: // not asked; t-1: never expires
		return 0
	case it.TTL == 0: // t0: it expires within the second
		return 1
	case it.TTL > maxRelativeExp: // memcached would read it as a unix time, long past
		return int32(time.Now().Unix() + it.TTL)
	}
	return int32(it.TTL)
}

// maxRelativeExp is the longest expiration memcached reads as seconds from
// now (30 days); a larger one is a unix time.
const maxRelativeExp = 30 * 24 * 3600

func (w metaWire) GetAndTouch(ctx context.Context, key string, exp int32) (*memcache.Item, error) {
	o := getItem
	o.Touch, o.TouchTTL = true, exp
	it, err := w.p.Get(ctx, key, o)
	if err == nil && w.missed(ctx, key, it) {
		err = meta.ErrMiss
	}
	if err != nil {
		return nil, gomemcacheErr("gat", err)
	}
	return gmItem(key, it), nil
}

func (w metaWire) Touch(ctx context.Context, key string, exp int32) error {
	o := touchOnly
	o.TouchTTL = exp
	_, err := w.p.Get(ctx, key, o)
	return gomemcacheErr("touch", err)
}

// storeModes are the ms modes of the store kinds, and their classic verbs,
// for errors worded as gomemcache's.
var storeModes = map[opKind]struct {
	mode meta.Mode
	verb string
}{
	opSet: {meta.ModeSet, "set"}, opAdd: {meta.ModeAdd, "add"}, opReplace: {meta.ModeReplace, "replace"},
	opCAS: {meta.ModeSet, "cas"}, opAppend: {meta.ModeAppend, "append"}, opPrepend: {meta.ModePrepend, "prepend"},
}

func (w metaWire) Store(ctx context.Context, kind opKind, it *memcache.Item) error {
	if err := checkKey(it.Key); err != nil {
		return err
	}
	m := storeModes[kind]
	o := meta.SetOptions{TTL: it.Expiration, ClientFlags: it.Flags, Mode: m.mode}
	if kind == opCAS {
		o.CompareCAS = it.CasID
		if it.CasID == 0 { // gomemcache sends cas 0, which no item has
			o.CompareCAS = 1<<64 - 1
		}
	}
	_, err := w.p.Set(ctx, it.Key, it.Value, o)
	return gomemcacheErr(m.verb, err)
}

func (w metaWire) Delete(ctx context.Context, key string) error {
	return gomemcacheErr("delete", w.p.Delete(ctx, key, meta.DeleteOptions{}))
}

func (w metaWire) Reserve(ctx context.Context, key string, ttl int32) (*memcache.Item, uint64, bool, error) {
	o := getItem
	o.Vivify, o.VivifyTTL = true, ttl
	it, err := w.p.Get(ctx, key, o)
	switch {
	case err != nil:
		return nil, 0, false, gomemcacheErr("get", err)
	case it.Won() && !it.Stale():
		return nil, it.CAS, true, nil // a placeholder of this copy's
	case w.missed(ctx, key, it):
		return nil, 0, false, nil // another copy's, or an invalidated item
	}
	return gmItem(key, it), 0, false, nil
}

func (w metaWire) DeleteCAS(ctx context.Context, key string, cas uint64) error {
	return gomemcacheErr("delete", w.p.Delete(ctx, key, meta.DeleteOptions{CompareCAS: cas}))
}

// Arith adds delta to key's value. A copy's placeholder (see Reserve) is
// no value to this Client, but memcached answers an arithmetic on its
// empty value as on text ("non-numeric"): a refusal of that kind is
// checked, and a placeholder is a miss, as the key is to a reader. A number
// that filled the placeholder in between is tried again, twice at most: a
// new copy's placeholder may have taken its place meanwhile.
func (w metaWire) Arith(ctx context.Context, key string, delta uint64, decr bool) (uint64, error) {
	o := meta.ArithOptions{Decrement: decr, Delta: delta, Value: true}
	n, err := w.p.Arith(ctx, key, o)
	var ce *meta.ClientError
	for try := 0; try < 2 && errors.As(err, &ce); try++ {
		it, gerr := w.p.Get(ctx, key, meta.GetOptions{Value: true})
		if errors.Is(gerr, meta.ErrMiss) || gerr == nil && placeholder(it) {
			err = meta.ErrMiss // a placeholder, or gone since: a miss
			break
		}
		if gerr != nil || !numeric(it.Value) {
			break // the server's answer stands
		}
		n, err = w.p.Arith(ctx, key, o)
	}
	if err != nil {
		return 0, gomemcacheErr("incr", err)
	}
	return n.Value, nil
}

// numeric reports whether v is a value memcached can increment.
func numeric(v []byte) bool {
	_, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
	return err == nil
}

// FlushAll has no meta command: server.call sends it by the classic
// protocol (see server.classic).
func (w metaWire) FlushAll(context.Context) error { return errNoMetaFlush }

var errNoMetaFlush = errors.New("selector: flush_all has no meta command")

func (w metaWire) Ping(ctx context.Context) error { return gomemcacheErr("mn", w.p.Noop(ctx)) }

func (w metaWire) CloseIdle() { w.p.CloseIdle() }

// gomemcacheErr returns err, from the meta protocol, as gomemcache returns
// the classic protocol's answer: its sentinels for the answers (a miss, not
// stored, a CAS conflict), its wording for the server's errors; transport
// errors as they are (see failureOf).
func gomemcacheErr(verb string, err error) error {
	var se *meta.ServerError
	var ce *meta.ClientError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, meta.ErrMiss), errors.Is(err, meta.ErrNotFound):
		return memcache.ErrCacheMiss
	case errors.Is(err, meta.ErrNotStored):
		return memcache.ErrNotStored
	case errors.Is(err, meta.ErrExists):
		return memcache.ErrCASConflict
	case errors.Is(err, meta.ErrInvalidKey):
		return memcache.ErrMalformedKey
	case errors.As(err, &se):
		return &serverAnswer{fmt.Errorf("memcache: unexpected response line from %q: %q", verb, "SERVER_ERROR "+se.Msg+"\r\n"), err}
	case errors.As(err, &ce):
		return &serverAnswer{errors.New("memcache: client error: " + ce.Msg), err}
	}
	return err
}

// serverAnswer is the server's error answer (SERVER_ERROR, CLIENT_ERROR),
// worded as gomemcache words it; Unwrap gives the meta protocol's error.
type serverAnswer struct {
	gm   error
	meta error
}

func (e *serverAnswer) Error() string { return e.gm.Error() }
func (e *serverAnswer) Unwrap() error { return e.meta }
