package selector

import (
	"context"
	"errors"
	"net"

	"github.com/bradfitz/gomemcache/memcache"
)

// classicWire is a wire over gomemcache's classic protocol. gomemcache has
// no contexts: a request's context is checked before it is sent, and its
// deadline does not bound it (the Client's timeout does).
type classicWire struct{ mc *memcache.Client }

func newClassicWire(a *staticAddr, cc connConfig) classicWire {
	mc := memcache.NewFromSelector(fixed{a})
	mc.Timeout = cc.timeout
	mc.MaxIdleConns = cc.maxIdle
	dial := cc.dialer()
	mc.DialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, &dialError{err}
		}
		return c, nil
	}
	return classicWire{mc}
}

func (w classicWire) Get(ctx context.Context, key string) (*memcache.Item, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return w.mc.Get(key)
}

func (w classicWire) GetForCopy(ctx context.Context, key string, fallback int32) (*memcache.Item, bool, error) {
	it, err := w.Get(ctx, key)
	if err == nil {
		it.Expiration = fallback
	}
	return it, false, err
}

func (w classicWire) GetMulti(ctx context.Context, keys []string) (map[string]*memcache.Item, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return w.mc.GetMulti(keys)
}

func (w classicWire) GetMultiForCopy(ctx context.Context, keys []string, fallback int32) (map[string]*memcache.Item, error) {
	m, err := w.GetMulti(ctx, keys)
	for _, it := range m {
		it.Expiration = fallback
	}
	return m, err
}

func (w classicWire) GetAndTouch(ctx context.Context, key string, exp int32) (*memcache.Item, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return w.mc.GetAndTouch(key, exp)
}

func (w classicWire) Touch(ctx context.Context, key string, exp int32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.mc.Touch(key, exp)
}

func (w classicWire) Store(ctx context.Context, kind opKind, it *memcache.Item) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch kind {
	case opAdd:
		return w.mc.Add(it)
	case opReplace:
		return w.mc.Replace(it)
	case opCAS:
		return w.mc.CompareAndSwap(it)
	case opAppend:
		return w.mc.Append(it)
	case opPrepend:
		return w.mc.Prepend(it)
	}
	return w.mc.Set(it)
}

func (w classicWire) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.mc.Delete(key)
}

// errNoReserve: the classic protocol has no placeholders (see
// wire.Reserve); a copy is added, checked and undone instead.
var errNoReserve = errors.New("selector: no placeholders in the classic protocol")

func (classicWire) Reserve(context.Context, string, int32) (*memcache.Item, uint64, bool, error) {
	return nil, 0, false, errNoReserve
}

func (classicWire) DeleteCAS(context.Context, string, uint64) error { return errNoReserve }

func (w classicWire) Arith(ctx context.Context, key string, delta uint64, decr bool) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if decr {
		return w.mc.Decrement(key, delta)
	}
	return w.mc.Increment(key, delta)
}

func (w classicWire) FlushAll(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.mc.FlushAll()
}

func (w classicWire) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return w.mc.Ping()
}

func (w classicWire) CloseIdle() { w.mc.Close() }

// noMetaNote is logged once for a server found without the meta protocol.
const noMetaNote = "the server does not speak memcached's meta protocol (memcached 1.6 or later): using the classic protocol, " +
	"with which handoff copies get a fixed expiration and a request's context does not bound it once sent"
