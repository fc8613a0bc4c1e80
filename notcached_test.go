package selector

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
)

// notCachedMetrics counts NotCached events.
type notCachedMetrics struct {
	NopMetrics
	n    atomic.Int64
	size atomic.Int64
}

func (m *notCachedMetrics) NotCached(e NotCachedEvent) { m.n.Add(1); m.size.Store(int64(e.Size)) }

// syncBuffer is a bytes.Buffer for a log that goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestGetOrLoadNotCachedReported: a 2 MB value, which memcached (-I 1m,
// its default) refuses, is returned by every GetOrLoad, loaded each time,
// counted each time, and logged once, with its size and the server's
// limit. Before, nothing said why the cache never held it.
func TestGetOrLoadNotCachedReported(t *testing.T) {
	ms := startMemcached(t, 1)
	var m notCachedMetrics
	var log syncBuffer
	c, _ := newTestClient(t, addrsOf(ms), WithMetrics(&m), WithSlog(slog.New(slog.NewTextHandler(&log, nil))))
	big := bytes.Repeat([]byte("x"), 2<<20)
	loads := 0
	load := func(context.Context, string) (*memcache.Item, error) {
		loads++
		return &memcache.Item{Value: big}, nil
	}
	for range 3 {
		it, err := c.GetOrLoad(context.Background(), "big", LoadOptions{}, load)
		require.NoError(t, err)
		require.Len(t, it.Value, len(big))
	}
	require.Equal(t, 3, loads)
	require.Equal(t, int64(3), m.n.Load(), "NotCached events")
	require.Equal(t, int64(len(big)), m.size.Load())
	require.Equal(t, 1, strings.Count(log.String(), "refused to cache"), "warnings: %s", log.String())
	require.Contains(t, log.String(), "size=2097152")
	require.Contains(t, log.String(), "item_size_max=1048576")

	// A value it takes is cached, and not reported.
	_, err := c.GetOrLoad(context.Background(), "small", LoadOptions{}, func(context.Context, string) (*memcache.Item, error) {
		return &memcache.Item{Value: []byte("v")}, nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(3), m.n.Load())
}
