package meta_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// A Pool for one server: detect the meta protocol on first contact, then
// get, set and batch. (Compiled, not run: it needs a memcached.)
func ExampleNewPool() {
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", "127.0.0.1:11211")
	}
	p := meta.NewPool(dial, meta.Options{Timeout: 500 * time.Millisecond, MaxConns: 2})
	defer p.Close()
	ctx := context.Background()

	if err := p.Detect(ctx); errors.Is(err, meta.ErrNoMeta) {
		fmt.Println("memcached before 1.6: use the classic protocol")
		return
	}
	if _, err := p.Set(ctx, "greeting", []byte("hello"), meta.SetOptions{TTL: 60, ClientFlags: 1}); err != nil {
		fmt.Println(err)
		return
	}
	it, err := p.Get(ctx, "greeting", meta.GetOptions{Value: true, ClientFlags: true, TTL: true})
	switch {
	case errors.Is(err, meta.ErrMiss):
		fmt.Println("miss")
	case err != nil:
		var se *meta.ServerError
		if errors.As(err, &se) {
			fmt.Println("the server refused:", se.Msg)
		}
	default:
		fmt.Printf("%s (flags %d, %d s left)\n", it.Value, it.ClientFlags, it.TTL)
	}
	hits, _ := p.GetMulti(ctx, []string{"greeting", "other"}, meta.GetOptions{Value: true})
	fmt.Println(len(hits), "hits")
}

// A lease against dog-piling: the first caller to miss wins (W) the right
// to recompute; others see Z. An invalidation in between makes the
// winner's CAS set fail (ErrExists).
func ExamplePool_Get_lease() {
	var p *meta.Pool // from NewPool
	ctx := context.Background()
	it, err := p.Get(ctx, "report", meta.GetOptions{Value: true, CAS: true, Vivify: true, VivifyTTL: 30})
	if err != nil {
		return
	}
	if it.Won() {
		_, err := p.Set(ctx, "report", []byte("recomputed"), meta.SetOptions{TTL: 300, CompareCAS: it.CAS})
		if errors.Is(err, meta.ErrExists) {
			fmt.Println("invalidated meanwhile; not stored")
		}
	}
}
