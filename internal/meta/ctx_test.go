package meta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stop SIGSTOPs the server and waits until all its threads are stopped
// (kill only queues the signal).
func (m *memcached) stop(t *testing.T) {
	t.Helper()
	pid := m.cmd.Process.Pid
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	require.Eventually(t, func() bool {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			// pid (comm) state ...: the state follows the last ')'.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				return false
			}
		}
		return len(stats) > 0
	}, 2*time.Second, time.Millisecond, "memcached did not stop")
}

func (m *memcached) cont(t *testing.T) {
	t.Helper()
	require.NoError(t, syscall.Kill(m.cmd.Process.Pid, syscall.SIGCONT))
}

// A request with a 20 ms deadline to a stopped memcached returns about
// then; the connection's timeout later closes it and fails the rest.
func TestContextDeadlineStoppedServer(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{Timeout: 300 * time.Millisecond})
	require.NoError(t, c.Noop(context.Background()))
	m.stop(t)

	other := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), "other", GetOptions{Value: true})
		other <- err
	}()
	start := time.Now() // before the deadline is set: the goroutine may be descheduled in between
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "k", GetOptions{Value: true})
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, `meta: mg "k": context deadline exceeded`)
	require.Less(t, took, 200*time.Millisecond, "a 20 ms deadline")
	require.GreaterOrEqual(t, took, 20*time.Millisecond)

	err = <-other
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the connection's timeout")
	require.ErrorIs(t, err, ErrConnClosed)
	require.Less(t, time.Since(start), time.Second)
}

// A request cancelled while others are pending returns at once; its late
// reply is read and dropped, and the others' replies still match.
func TestContextCancelWhilePending(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{Timeout: 10 * time.Second})
	bg := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		_, err := c.Set(bg, k, []byte("value of "+k), SetOptions{})
		require.NoError(t, err)
	}
	m.stop(t)

	type result struct {
		key string
		it  Item
		err error
	}
	results := make(chan result, 3)
	get := func(ctx context.Context, k string) {
		it, err := c.Get(ctx, k, GetOptions{Value: true, Key: true})
		results <- result{k, it, err}
	}
	ctx, cancel := context.WithCancel(bg)
	go get(bg, "a")
	require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
	go get(ctx, "b")
	require.Eventually(t, func() bool { return c.Outstanding() == 2 }, time.Second, time.Millisecond)
	go get(bg, "c")
	require.Eventually(t, func() bool { return c.Outstanding() == 3 }, time.Second, time.Millisecond)

	cancel()
	r := <-results
	require.Equal(t, "b", r.key)
	require.ErrorIs(t, r.err, context.Canceled)

	m.cont(t)
	for range 2 {
		r := <-results
		require.NoError(t, r.err, r.key)
		require.Equal(t, r.key, r.it.Key)
		require.Equal(t, "value of "+r.key, string(r.it.Value))
	}
	require.NoError(t, c.Err())
	it, err := c.Get(bg, "d", GetOptions{Value: true})
	require.NoError(t, err)
	require.Equal(t, "value of d", string(it.Value))
	require.Zero(t, c.Outstanding(), "the cancelled request's reply was read")
}

// A context already done sends nothing.
func TestContextDoneBefore(t *testing.T) {
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Get(ctx, "k", GetOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, c.Outstanding())
	require.NoError(t, c.Noop(context.Background()))
}

// Many requests cancelled at random among others: every reply that is
// returned is its own, and the connection stays up.
func TestContextCancelStorm(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{Timeout: 5 * time.Second})
	bg := context.Background()
	for i := range 50 {
		_, err := c.Set(bg, key(i), []byte(key(i)), SetOptions{})
		require.NoError(t, err)
	}
	errs := make(chan error, 32)
	for g := range 32 {
		go func() {
			errs <- func() error {
				for i := range 200 {
					k := key((g*7 + i) % 50)
					ctx, cancel := context.WithTimeout(bg, time.Duration(i%5)*20*time.Microsecond)
					it, err := c.Get(ctx, k, GetOptions{Value: true})
					cancel()
					switch {
					case errors.Is(err, context.DeadlineExceeded):
					case err != nil:
						return err
					case string(it.Value) != k:
						return errors.New("get " + k + " returned " + string(it.Value))
					}
				}
				return nil
			}()
		}()
	}
	for range 32 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, c.Err())
	require.NoError(t, c.Noop(bg))
	require.Zero(t, c.Outstanding())
}

func key(i int) string { return "storm:" + string(rune('a'+i%26)) + string(rune('a'+i/26)) }

// The caller reading replies (the first of a stopped server's requests)
// is cancelled: it returns at once, without consuming a byte; the read
// role passes to a request waiting behind it, or, when none waits, to the
// next one, and each reads the cancelled request's reply first and drops
// it.
func TestContextCancelTheReader(t *testing.T) {
	for _, waiters := range []int{2, 0} {
		t.Run(fmt.Sprintf("%d waiting", waiters), func(t *testing.T) {
			checkGoroutines(t)
			m := startMemcached(t)
			c := m.conn(t, Options{Timeout: 10 * time.Second})
			bg := context.Background()
			for _, k := range []string{"a", "b", "c", "d"} {
				_, err := c.Set(bg, k, []byte("value of "+k), SetOptions{})
				require.NoError(t, err)
			}
			m.stop(t)

			type result struct {
				key string
				it  Item
				err error
			}
			results := make(chan result, 3)
			get := func(ctx context.Context, k string) {
				it, err := c.Get(ctx, k, GetOptions{Value: true, Key: true})
				results <- result{k, it, err}
			}
			ctx, cancel := context.WithCancel(bg)
			go get(ctx, "a")
			require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
			for i, k := range []string{"b", "c"}[:waiters] {
				go get(bg, k)
				require.Eventually(t, func() bool { return c.Outstanding() == 2+i }, time.Second, time.Millisecond)
			}

			start := time.Now()
			cancel()
			r := <-results
			require.Equal(t, "a", r.key)
			require.ErrorIs(t, r.err, context.Canceled)
			require.Less(t, time.Since(start), time.Second, "cancelled while waiting for its reply")

			m.cont(t)
			for range waiters {
				r := <-results
				require.NoError(t, r.err, r.key)
				require.Equal(t, r.key, r.it.Key)
				require.Equal(t, "value of "+r.key, string(r.it.Value))
			}
			require.NoError(t, c.Err())
			it, err := c.Get(bg, "d", GetOptions{Value: true, Key: true})
			require.NoError(t, err)
			require.Equal(t, "value of d", string(it.Value))
			require.Zero(t, c.Outstanding(), "the cancelled request's reply was read")
		})
	}
}
