package meta

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Get allocates the value it returns and nothing else in steady state:
// requests, buffers and reply structs are recycled.
func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random")
	}
	m := startMemcached(t)
	c := m.conn(t, Options{})
	p := m.pool(t, Options{})
	ctx := context.Background()
	value := []byte("a value of some 32 bytes, or so.")
	_, err := c.Set(ctx, "alloc:k", value, SetOptions{})
	require.NoError(t, err)
	get := GetOptions{Value: true, ClientFlags: true, CAS: true}
	tests := []struct {
		name string
		max  float64
		f    func() error
	}{
		{"conn get hit", 1, func() error { _, err := c.Get(ctx, "alloc:k", get); return err }},
		{"conn get miss", 0, func() error {
			if _, err := c.Get(ctx, "alloc:missing", get); err != ErrMiss {
				return err
			}
			return nil
		}},
		{"conn set", 0, func() error { _, err := c.Set(ctx, "alloc:k", value, SetOptions{TTL: 60}); return err }},
		{"conn delete", 0, func() error {
			if err := c.Delete(ctx, "alloc:none", DeleteOptions{}); err != ErrNotFound {
				return err
			}
			return nil
		}},
		{"conn arith", 0, func() error {
			_, err := c.Arith(ctx, "alloc:n", ArithOptions{Delta: 1, Vivify: true, Value: true})
			return err
		}},
		{"conn noop", 0, func() error { return c.Noop(ctx) }},
		{"pool get hit", 1, func() error { _, err := p.Get(ctx, "alloc:k", get); return err }},
		{"pool set", 0, func() error { _, err := p.Set(ctx, "alloc:k", value, SetOptions{}); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			n := testing.AllocsPerRun(200, func() {
				if e := tt.f(); e != nil {
					err = e
				}
			})
			require.NoError(t, err)
			require.LessOrEqual(t, n, tt.max)
		})
	}
}
