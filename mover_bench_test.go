package selector

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// BenchmarkMoves measures one client moving keys after a scale-up from 2
// to 3 memcached: 10,000 keys of 1 KB (the test memcached has 16 MB), a
// third of which move. It reports the mover's keys/s and MB/s (over
// Stats().Moves.Took, the time it listed and moved), and the p99 of the
// application's Gets of 1000 other keys (8 goroutines, through the same
// Client) while the keys move, against their p99 just before, as a ratio.
// Each op is one scale-up; run it with -benchtime 3x or so. rate=default
// is Moves' default rate; rate=max is unlimited, the mover's own speed.
func BenchmarkMoves(b *testing.B) {
	for _, tc := range []struct {
		name string
		rate int
	}{{"default", 0}, {"max", 1 << 30}} {
		b.Run("rate="+tc.name, func(b *testing.B) {
			const keys, size = 10000, 1024
			value := make([]byte, size)
			var took, moving time.Duration
			var movedKeys int
			var p99Before, p99During []time.Duration
			for range b.N {
				b.StopTimer()
				ms := startMemcached(b, 3)
				ss := new(ServerList)
				if err := ss.SetServers(addrsOf(ms[:2])...); err != nil {
					b.Fatal(err)
				}
				c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithMoves(Moves{Rate: tc.rate}))
				if err != nil {
					b.Fatal(err)
				}
				fillKeys(b, c, "move:", keys, value)
				fillKeys(b, c, "app:", 1000, value)
				stop := make(chan struct{})
				var lat latencies
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Go(func() {
						for i := g; ; i += 8 {
							select {
							case <-stop:
								return
							default:
							}
							start := time.Now()
							c.Get(fmt.Sprint("app:", i%1000))
							lat.add(time.Since(start))
						}
					})
				}
				time.Sleep(time.Second)
				p99Before = append(p99Before, lat.p99AndReset())
				before := c.Stats().Moves
				b.StartTimer()
				start := time.Now()
				if err := ss.SetServers(addrsOf(ms)...); err != nil {
					b.Fatal(err)
				}
				eventually(b, "the move", func() bool { return c.Stats().Moves.Rounds > before.Rounds })
				took += time.Since(start)
				b.StopTimer()
				p99During = append(p99During, lat.p99AndReset())
				close(stop)
				wg.Wait()
				st := c.Stats().Moves
				movedKeys += st.Moved - before.Moved
				moving += st.Took - before.Took
				c.Close()
				for _, m := range ms {
					m.kill()
				}
			}
			secs := moving.Seconds()
			b.ReportMetric(float64(movedKeys)/secs, "keys/s")
			b.ReportMetric(float64(movedKeys)*size/secs/1e6, "MB/s")
			b.ReportMetric(float64(median(p99During))/float64(median(p99Before)), "p99-during/before")
			b.ReportMetric(float64(median(p99Before).Microseconds()), "p99-before-µs")
		})
	}
}

// fillKeys sets n keys prefix0 ... of value through c, from 16 goroutines.
func fillKeys(b *testing.B, c *Client, prefix string, n int, value []byte) {
	var wg sync.WaitGroup
	var failed atomic.Int32
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				if c.SetContext(context.Background(), &memcache.Item{Key: fmt.Sprint(prefix, i), Value: value}) != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		b.Fatalf("%d sets failed", failed.Load())
	}
}

// latencies collects request latencies from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) p99AndReset() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.d
	l.d = nil
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}
