package histcheck

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
)

// stallProxy forwards a client's connections to one memcached, and can
// hold the next writes it sees on some of them for a while: connections
// stalled (a slow path, a busy worker thread) while the server and its
// other connections run. What it held is sent when the stall ends, and
// what followed it on that connection after it, even if the client closed
// the connection meanwhile: memcached runs what it had read before it
// sees the close.
type stallProxy struct {
	l       net.Listener
	backend string
	wg      sync.WaitGroup

	mu     sync.Mutex
	stall  time.Duration // the length of the stalls armed
	armed  int           // the writes still to hold, each on its own connection
	stalls int           // the writes held
	conns  []net.Conn
	closed bool
}

// writePrefixes start the requests a stall waits for: the writes of the
// meta protocol and of the text protocol (gomemcache's).
var writePrefixes = [][]byte{[]byte("ms "), []byte("md "), []byte("set "), []byte("delete ")}

// newStallProxy listens on loopback for connections to backend.
func newStallProxy(backend string) (*stallProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &stallProxy{l: l, backend: backend}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address clients dial.
func (p *stallProxy) Addr() string { return p.l.Addr().String() }

// Stall holds the next write on each of n connections for d.
func (p *stallProxy) Stall(d time.Duration, n int) {
	p.mu.Lock()
	p.stall, p.armed = d, n
	p.mu.Unlock()
}

// take reports how long to hold a write read from a connection: the
// stall's length, if one is armed.
func (p *stallProxy) take(b []byte) time.Duration {
	if !isWrite(b) {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == 0 {
		return 0
	}
	p.armed--
	p.stalls++
	return p.stall
}

func (p *stallProxy) accept() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.backend, time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			in.Close()
			out.Close()
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Go(func() {
			io.Copy(in, out)
			in.Close()
		})
		p.wg.Go(func() { p.forward(out, in) })
	}
}

// forward copies what the client sends to memcached, holding a write for
// the length armed: a read from the socket starts with a request (each is
// written whole), and one that starts with a write takes the stall.
func (p *stallProxy) forward(out, in net.Conn) {
	defer out.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if d := p.take(buf[:n]); d > 0 {
				time.Sleep(d) // this connection's later requests wait too
			}
			if _, werr := out.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// held returns the number of writes held so far.
func (p *stallProxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalls
}

func isWrite(b []byte) bool {
	for _, w := range writePrefixes {
		if bytes.HasPrefix(b, w) {
			return true
		}
	}
	return false
}

// Close stops the proxy and waits for its goroutines.
func (p *stallProxy) Close() {
	p.l.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// deadlined is the Client with a deadline on every operation's context,
// shorter than a stall (Params.Deadline): the schedules of abandoned
// writes. gomemcache's client, which takes no context, has its Timeout
// for the deadline.
type deadlined struct {
	*selector.Client
	d time.Duration
}

func (c deadlined) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.d)
}

func (c deadlined) Get(key string) (*memcache.Item, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Client.GetContext(ctx, key)
}

func (c deadlined) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Client.GetMultiContext(ctx, keys)
}

func (c deadlined) Set(item *memcache.Item) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Client.SetContext(ctx, item)
}

func (c deadlined) Delete(key string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Client.DeleteContext(ctx, key)
}

func (c deadlined) Increment(key string, delta uint64) (uint64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Client.IncrementContext(ctx, key, delta)
}
