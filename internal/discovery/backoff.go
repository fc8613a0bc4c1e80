package discovery

import (
	"math/rand/v2"
	"time"
)

// Timing holds the watch's durations. The zero Timing means the defaults,
// client-go's reflector's; tests shorten them.
type Timing struct {
	WatchTimeout func() time.Duration // the timeoutSeconds of each WATCH
	WatchGrace   time.Duration        // client-side deadline past WatchTimeout
	BackoffBase  time.Duration
	BackoffCap   time.Duration
	BackoffReset time.Duration // start over after this long without failures
	ShortWatch   time.Duration // a watch that ends sooner is a failure
	// The cap on the server's Retry-After, so that one answer cannot stop
	// discovery for long.
	MaxRetryAfter time.Duration
}

func defaultTiming() Timing {
	return Timing{
		// 5 to 10 minutes, as client-go does, to spread reconnects over time.
		WatchTimeout:  func() time.Duration { return 5*time.Minute + rand.N(5*time.Minute) },
		WatchGrace:    30 * time.Second,
		BackoffBase:   800 * time.Millisecond,
		BackoffCap:    30 * time.Second,
		BackoffReset:  2 * time.Minute,
		ShortWatch:    time.Second,
		MaxRetryAfter: time.Minute,
	}
}

// backoff is client-go's: from BackoffBase doubling to BackoffCap, each
// interval d stretched to a random point in [d, 2d], starting over after
// BackoffReset without failures.
type backoff struct {
	Timing
	d    time.Duration
	last time.Time
}

func (b *backoff) next() time.Duration {
	if time.Since(b.last) > b.BackoffReset {
		b.d = 0
	}
	b.last = time.Now()
	b.d = min(max(b.BackoffBase, 2*b.d), b.BackoffCap)
	return b.d + rand.N(b.d+1)
}
