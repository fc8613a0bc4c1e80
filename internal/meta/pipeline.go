package meta

import (
	"context"
	"errors"
	"time"
)

// Kind is the command of a [Request] in a pipeline.
type Kind uint8

const (
	KindGet    Kind = iota + 1 // mg, with Request.Get's flags
	KindSet                    // ms of Request.Value, with Request.Set's flags
	KindDelete                 // md, with Request.Delete's flags
)

// Request is one request of [Conn.Pipeline], and then its outcome: Item
// and Err as Get, Set or Delete return them (ErrMiss, ErrNotStored,
// ErrExists, ErrNotFound are answers).
type Request struct {
	Kind   Kind
	Key    string
	Value  []byte // KindSet's
	Get    GetOptions
	Set    SetOptions
	Delete DeleteOptions

	Item Item
	Err  error
}

// Pipeline sends reqs on c at once, in order and in one write, and waits
// for all their replies: a batch of requests costs about one round trip
// and one system call each way, where as many separate requests cost a
// wake-up each. Each request's outcome is set in it. It returns an error,
// also set in every request not answered, if a key or option is refused
// (nothing is sent), if the connection fails, or if ctx ends: then the
// requests not answered yet are left as one request's caller leaves it
// (see Conn), and may still run.
func (c *Conn) Pipeline(ctx context.Context, reqs []Request) error {
	for i := range reqs {
		if err := checkRequest(&reqs[i]); err != nil {
			return failAll(reqs, err)
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	calls := make([]*call, len(reqs))
	for i := range reqs {
		calls[i] = requestCall(&reqs[i])
	}
	lead, err := c.enqueue(ctx, calls)
	if err != nil {
		return failAll(reqs, err)
	}
	for i, cl := range calls {
		if err := c.await(ctx, cl, i == 0 && lead); err != nil {
			for _, rest := range calls[i+1:] {
				c.abandon(rest)
			}
			return failAll(reqs[i:], err)
		}
		reqs[i].Item, reqs[i].Err = outcome(cl)
		putCall(cl)
	}
	return nil
}

func checkRequest(r *Request) error {
	if err := CheckKey(r.Key); err != nil {
		return err
	}
	switch {
	case r.Kind == KindGet && r.Get.Quiet, r.Kind == KindSet && r.Set.Quiet, r.Kind == KindDelete && r.Delete.Quiet:
		return ErrQuiet
	case r.Kind < KindGet || r.Kind > KindDelete:
		return errKind
	}
	return nil
}

// errKind is a Request of no Kind.
var errKind = errors.New("meta: a pipeline's request has no Kind")

func failAll(reqs []Request, err error) error {
	for i := range reqs {
		reqs[i].Item, reqs[i].Err = Item{}, err
	}
	return err
}

func requestCall(r *Request) *call {
	switch r.Kind {
	case KindGet:
		cl := getCall(opGet, r.Key)
		cl.get = r.Get
		return cl
	case KindSet:
		cl := getCall(opSet, r.Key)
		cl.value, cl.set = r.Value, r.Set
		return cl
	}
	cl := getCall(opDelete, r.Key)
	cl.del = r.Delete
	return cl
}

// outcome is what Get, Set or Delete returns for cl's reply. A value read
// is the caller's, not cl's.
func outcome(cl *call) (Item, error) {
	if cl.err != nil {
		return Item{}, cl.err
	}
	if err := statusErr(cl.rep.Status); err != nil {
		return Item{}, err
	}
	switch cl.op {
	case opGet:
		it := itemOf(&cl.rep)
		if cl.rep.Status == StatusVA {
			cl.rep.Value = nil
		}
		return it, nil
	case opSet:
		return Item{CAS: cl.rep.CAS, Has: cl.rep.Has &^ RetOpaque}, nil
	}
	return Item{}, nil
}

// enqueue queues calls in order and writes them, as do does one, and
// reports whether the first holds the read role. On an error, nothing was
// sent and the calls are recycled.
func (c *Conn) enqueue(ctx context.Context, calls []*call) (lead bool, _ error) {
	if err := ctx.Err(); err != nil {
		err = ctxError(calls[0].op, calls[0].key, err)
		for _, cl := range calls {
			putCall(cl)
		}
		return false, err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		for _, cl := range calls {
			putCall(cl)
		}
		return false, &unsentError{err}
	}
	now := time.Now()
	for _, cl := range calls {
		c.queueLocked(cl, now)
	}
	if !c.writing {
		c.writing = true
		c.flushLocked(true)
	}
	lead = !c.leading && c.err == nil && calls[0].state.CompareAndSwap(callWaiting, callLeading)
	if lead {
		c.leading = true
	}
	c.mu.Unlock()
	return lead, nil
}

// await waits for cl's reply, as do does once cl is queued: reading
// replies itself if it holds the read role (lead), or is passed it. On an
// error, cl is no longer the caller's.
func (c *Conn) await(ctx context.Context, cl *call, lead bool) error {
	if lead {
		return c.lead(ctx, cl, cl.sent)
	}
	o, key, n := cl.op, cl.key, cl.n // cl is recycled once abandoned
	select {
	case <-cl.done:
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callWaiting, callAbandoned) {
			return &abandonedError{ctxError(o, key, ctx.Err()), c, n}
		}
		<-cl.done
	}
	if cl.state.Load() == callLeading {
		return c.lead(ctx, cl, cl.sent)
	}
	return nil
}

// abandon leaves cl, queued and not awaited, as a caller whose context
// ended leaves its request: whoever reads its reply recycles it, and a
// read role passed to it is passed on.
func (c *Conn) abandon(cl *call) {
	if cl.state.CompareAndSwap(callWaiting, callAbandoned) {
		return
	}
	<-cl.done
	if cl.state.Load() == callLeading {
		c.pass(cl)
		return
	}
	putCall(cl)
}

// Pipeline is [Conn.Pipeline] on one of p's connections. Keys pinned to
// another connection (see Pool) are not kept in order with the requests
// abandoned there: a pipeline is for requests whose order against an
// application's does not matter (conditional writes, reads).
func (p *Pool) Pipeline(ctx context.Context, reqs []Request) error {
	_, err := send(ctx, p, false, "", func(c *Conn) (struct{}, error) { return struct{}{}, c.Pipeline(ctx, reqs) })
	return err
}
