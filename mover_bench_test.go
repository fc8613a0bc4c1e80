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
// to 3 memcached (1 GB each): a third of the keys move. impl=plain is the
// floor, a plain pipelined copy of the same keys between the same servers
// (see plainCopy), with none of the mover's guarantees; impl=max is the
// mover unlimited (NoYield), impl=default at Moves' defaults (it yields to
// the application). Each reports
// keys/s and MB/s (the mover's over Stats().Moves.Took, the time it
// listed and moved; the floor's over its own run), and the p99 of the
// application's Gets of 1000 other keys (8 goroutines, through the same
// Client) while the keys move, against their p99 just before, as a ratio.
// Each op is one scale-up; run it with -benchtime 1x or 3x.
func BenchmarkMoves(b *testing.B) {
	for _, size := range []struct {
		name       string
		size, keys int
	}{{"32B", 32, 100000}, {"1KB", 1024, 100000}, {"16KB", 16 << 10, 20000}} {
		for _, tc := range []struct {
			name  string
			moves *Moves // nil: the plain copy
		}{{"plain", nil}, {"max", &Moves{NoYield: true}}, {"default", &Moves{}}} {
			b.Run(fmt.Sprintf("value=%s/impl=%s", size.name, tc.name), func(b *testing.B) {
				benchMoves(b, size.size, size.keys, tc.moves)
			})
		}
	}
}

func benchMoves(b *testing.B, size, keys int, mv *Moves) {
	value := make([]byte, size)
	var took, moving time.Duration
	var movedKeys int
	var p99Before, p99During []time.Duration
	for range b.N {
		b.StopTimer()
		ms := startMemcachedWith(b, 3, "-m", "1024")
		ss := new(ServerList)
		if err := ss.SetServers(addrsOf(ms[:2])...); err != nil {
			b.Fatal(err)
		}
		moves := Moves{Rate: -1} // the plain copy moves them
		if mv != nil {
			moves = *mv
		}
		c, err := NewClientFromList(ss, WithSlog(slog.New(slog.DiscardHandler)), WithMoves(moves))
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
		if mv == nil {
			movedKeys += plainCopy(b, ss, addrsOf(ms[:2]))
			moving += time.Since(start)
		} else {
			eventually(b, "the move", func() bool { return c.Stats().Moves.Rounds > before.Rounds })
			st := c.Stats().Moves
			movedKeys += st.Moved - before.Moved
			moving += st.Took - before.Took
		}
		took += time.Since(start)
		b.StopTimer()
		p99During = append(p99During, lat.p99AndReset())
		close(stop)
		wg.Wait()
		c.Close()
		for _, m := range ms {
			m.kill()
		}
	}
	secs := moving.Seconds()
	b.ReportMetric(float64(movedKeys)/secs, "keys/s")
	b.ReportMetric(float64(movedKeys)*float64(size)/secs/1e6, "MB/s")
	b.ReportMetric(float64(median(p99During))/float64(median(p99Before)), "p99-during/before")
	b.ReportMetric(float64(median(p99Before).Microseconds()), "p99-before-µs")
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
