package selector

import (
	"math/rand/v2"
	"time"
)

// timing holds the watch's durations; tests shorten them.
type timing struct {
	watchTimeout func() time.Duration // the timeoutSeconds of each WATCH
	watchGrace   time.Duration        // client-side deadline past watchTimeout
	backoffBase  time.Duration
	backoffCap   time.Duration
	backoffReset time.Duration // start over after this long without failures
	shortWatch   time.Duration // a watch that ends sooner is a failure
	// The cap on the server's Retry-After, so that one answer cannot stop
	// discovery for long.
	maxRetryAfter time.Duration
}

func defaultTiming() timing {
	return timing{
		// 5 to 10 minutes, as client-go does, to spread reconnects over time.
		watchTimeout:  func() time.Duration { return 5*time.Minute + rand.N(5*time.Minute) },
		watchGrace:    30 * time.Second,
		backoffBase:   800 * time.Millisecond,
		backoffCap:    30 * time.Second,
		backoffReset:  2 * time.Minute,
		shortWatch:    time.Second,
		maxRetryAfter: time.Minute,
	}
}

// backoff is client-go's: from backoffBase doubling to backoffCap, each
// interval d stretched to a random point in [d, 2d], starting over after
// backoffReset without failures.
type backoff struct {
	timing
	d    time.Duration
	last time.Time
}

func (b *backoff) next() time.Duration {
	if time.Since(b.last) > b.backoffReset {
		b.d = 0
	}
	b.last = time.Now()
	b.d = min(max(b.backoffBase, 2*b.d), b.backoffCap)
	return b.d + rand.N(b.d+1)
}
