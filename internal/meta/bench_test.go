package meta

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// The benchmarks run against a real memcached, through a Pool and, for
// comparison, through gomemcache's Client (one request per connection,
// MaxIdleConns raised to 64 so that 64 goroutines keep their connections).

var benchValue = []byte("a value of some 64 bytes, as a small cached object might be......")

const benchGoroutines = 64

func benchParallel(b *testing.B, f func() error) {
	procs := testingProcs()
	b.SetParallelism((benchGoroutines + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkGet(b *testing.B) {
	m := startMemcached(b)
	p := m.pool(b, Options{})
	ctx := context.Background()
	if _, err := p.Set(ctx, "bench:k", benchValue, SetOptions{}); err != nil {
		b.Fatal(err)
	}
	mc := memcache.New(m.addr)
	mc.MaxIdleConns = benchGoroutines
	get := func() error {
		_, err := p.Get(ctx, "bench:k", GetOptions{Value: true, ClientFlags: true, CAS: true})
		return err
	}
	gmGet := func() error { _, err := mc.Get("bench:k"); return err }
	b.Run("meta/1", func(b *testing.B) { b.ReportAllocs(); serial(b, get) })
	b.Run("gomemcache/1", func(b *testing.B) { b.ReportAllocs(); serial(b, gmGet) })
	b.Run("meta/64", func(b *testing.B) { b.ReportAllocs(); benchParallel(b, get) })
	b.Run("gomemcache/64", func(b *testing.B) { b.ReportAllocs(); benchParallel(b, gmGet) })
}

func BenchmarkSet(b *testing.B) {
	m := startMemcached(b)
	p := m.pool(b, Options{})
	ctx := context.Background()
	mc := memcache.New(m.addr)
	mc.MaxIdleConns = benchGoroutines
	set := func() error { _, err := p.Set(ctx, "bench:k", benchValue, SetOptions{TTL: 60}); return err }
	gmSet := func() error { return mc.Set(&memcache.Item{Key: "bench:k", Value: benchValue, Expiration: 60}) }
	b.Run("meta/1", func(b *testing.B) { b.ReportAllocs(); serial(b, set) })
	b.Run("gomemcache/1", func(b *testing.B) { b.ReportAllocs(); serial(b, gmSet) })
	b.Run("meta/64", func(b *testing.B) { b.ReportAllocs(); benchParallel(b, set) })
	b.Run("gomemcache/64", func(b *testing.B) { b.ReportAllocs(); benchParallel(b, gmSet) })
}

func BenchmarkGetMulti100(b *testing.B) {
	m := startMemcached(b)
	p := m.pool(b, Options{})
	ctx := context.Background()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench:multi:%d", i)
		if _, err := p.Set(ctx, keys[i], benchValue, SetOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	mc := memcache.New(m.addr)
	b.Run("meta", func(b *testing.B) {
		b.ReportAllocs()
		serial(b, func() error {
			got, err := p.GetMulti(ctx, keys, GetOptions{Value: true, ClientFlags: true})
			if err == nil && len(got) != len(keys) {
				err = fmt.Errorf("%d hits of %d", len(got), len(keys))
			}
			return err
		})
	})
	b.Run("gomemcache", func(b *testing.B) {
		b.ReportAllocs()
		serial(b, func() error {
			got, err := mc.GetMulti(keys)
			if err == nil && len(got) != len(keys) {
				err = fmt.Errorf("%d hits of %d", len(got), len(keys))
			}
			return err
		})
	})
}

func serial(b *testing.B, f func() error) {
	for b.Loop() {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
