package selector

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGetMultiCleansBeforeItsBatches: a GetMulti cleans its keys (see
// Client.clean) before it sends any of its batches. A clean's delete at a
// key's stand-in, sent while a batch of the same GetMulti waited unread on
// that stand-in's connection, waited forever: the batch could hold the
// connection's read role, passed to it by a request read before, which
// only the GetMulti's own wait for it takes up (histcheck two-out on
// 1.6.45 under load: every request to that server hung). One connection a
// server, and Gets beside, make the role pass to the batch often.
func TestGetMultiCleansBeforeItsBatches(t *testing.T) {
	ms := startMemcached(t, 2)
	c, ss := newTestClient(t, addrsOf(ms), WithMaxIdleConns(1), WithTimeout(2*time.Second))
	kA, kB := keysOf(t, ss, ms[0].addr, 1)[0], keysOf(t, ss, ms[1].addr, 1)[0]
	a, b := serverOf(c, ms[0].addr), serverOf(c, ms[1].addr)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		if !t.Failed() { // else Close (a cleanup) ends the requests that wait
			wg.Wait()
		}
	}()
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					c.Get(kA)
				}
			}
		})
	}
	for i := range 2000 {
		c.logKey(b, kB, a) // its clean deletes it at a too
		done := make(chan error, 1)
		go func() { _, err := c.GetMulti([]string{kA, kB}); done <- err }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("GetMulti %d still waits after 10 s", i)
		}
	}
}
