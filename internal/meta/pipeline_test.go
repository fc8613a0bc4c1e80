package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPipelineReal: a pipeline of every kind against memcached, each
// request's outcome as the single request's method gives it.
func TestPipelineReal(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	_, err := c.Set(ctx, "old", []byte("o"), SetOptions{})
	require.NoError(t, err)
	old, err := c.Get(ctx, "old", GetOptions{CAS: true})
	require.NoError(t, err)

	reqs := []Request{
		{Kind: KindSet, Key: "a", Value: []byte("va"), Set: SetOptions{ClientFlags: 7, TTL: 100, ReturnCAS: true}},
		{Kind: KindGet, Key: "a", Get: GetOptions{Value: true, ClientFlags: true, TTL: true, CAS: true}},
		{Kind: KindGet, Key: "missing", Get: GetOptions{Value: true}},
		{Kind: KindSet, Key: "a", Value: []byte("x"), Set: SetOptions{Mode: ModeAdd}},
		{Kind: KindDelete, Key: "old", Delete: DeleteOptions{CompareCAS: old.CAS + 1000}},
		{Kind: KindDelete, Key: "old", Delete: DeleteOptions{CompareCAS: old.CAS}},
		{Kind: KindDelete, Key: "old"},
		{Kind: KindGet, Key: "vivified", Get: GetOptions{Vivify: true, VivifyTTL: 30, CAS: true}},
	}
	require.NoError(t, c.Pipeline(ctx, reqs))
	require.NoError(t, reqs[0].Err)
	require.NotZero(t, reqs[0].Item.CAS)
	require.NoError(t, reqs[1].Err)
	require.Equal(t, "va", string(reqs[1].Item.Value))
	require.EqualValues(t, 7, reqs[1].Item.ClientFlags)
	require.InDelta(t, 100, reqs[1].Item.TTL, 1)
	require.Equal(t, reqs[0].Item.CAS, reqs[1].Item.CAS)
	require.ErrorIs(t, reqs[2].Err, ErrMiss)
	require.ErrorIs(t, reqs[3].Err, ErrNotStored)
	require.ErrorIs(t, reqs[4].Err, ErrExists)
	require.NoError(t, reqs[5].Err)
	require.ErrorIs(t, reqs[6].Err, ErrNotFound)
	require.NoError(t, reqs[7].Err)
	require.True(t, reqs[7].Item.Won(), "a vivify's placeholder is won")

	// The connection is in step after it.
	it, err := c.Get(ctx, "a", GetOptions{Value: true})
	require.NoError(t, err)
	require.Equal(t, "va", string(it.Value))
}

// TestPipelineBeside: pipelines and single requests from many goroutines
// on one connection each get their own replies.
func TestPipelineBeside(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			for round := range 50 {
				reqs := make([]Request, 0, 40)
				for i := range 20 {
					k := fmt.Sprintf("p%d.%d", g, i)
					v := strconv.Itoa(round*100 + i)
					reqs = append(reqs, Request{Kind: KindSet, Key: k, Value: []byte(v)},
						Request{Kind: KindGet, Key: k, Get: GetOptions{Value: true, Key: true}})
				}
				if err := c.Pipeline(ctx, reqs); err != nil {
					errs <- err
					return
				}
				for i := 1; i < len(reqs); i += 2 {
					if reqs[i].Err != nil || string(reqs[i].Item.Value) != string(reqs[i-1].Value) || reqs[i].Item.Key != reqs[i].Key {
						errs <- fmt.Errorf("%s: got %q %q (%v), want %q", reqs[i].Key, reqs[i].Item.Key, reqs[i].Item.Value, reqs[i].Err, reqs[i-1].Value)
						return
					}
				}
			}
		})
		wg.Go(func() {
			k := fmt.Sprintf("s%d", g)
			for i := range 200 {
				v := strconv.Itoa(i)
				if _, err := c.Set(ctx, k, []byte(v), SetOptions{}); err != nil {
					errs <- err
					return
				}
				it, err := c.Get(ctx, k, GetOptions{Value: true})
				if err != nil || string(it.Value) != v {
					errs <- fmt.Errorf("%s: got %q (%v), want %q", k, it.Value, err, v)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestPipelineContextEnds: a pipeline to a stopped server returns when
// its context ends, with every request failed; the next request reads
// their late replies and gets its own.
func TestPipelineContextEnds(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{Timeout: 300 * time.Millisecond})
	require.NoError(t, c.Noop(context.Background()))
	m.stop(t)
	reqs := make([]Request, 10)
	for i := range reqs {
		reqs[i] = Request{Kind: KindGet, Key: fmt.Sprint("k", i), Get: GetOptions{Value: true}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Pipeline(ctx, reqs)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 250*time.Millisecond, "a 20 ms deadline")
	for _, r := range reqs {
		require.ErrorIs(t, r.Err, context.DeadlineExceeded, r.Key)
	}
	m.cont(t)
	_, err = c.Set(context.Background(), "after", []byte("v"), SetOptions{})
	require.NoError(t, err)
	it, err := c.Get(context.Background(), "after", GetOptions{Value: true})
	require.NoError(t, err)
	require.Equal(t, "v", string(it.Value))
	require.Zero(t, c.Outstanding())
}

// TestPipelineRefused: a bad key or option sends nothing.
func TestPipelineRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"bad key", Request{Kind: KindGet, Key: "a b"}, ErrInvalidKey},
		{"quiet", Request{Kind: KindDelete, Key: "k", Delete: DeleteOptions{Quiet: true}}, ErrQuiet},
		{"no kind", Request{Key: "k"}, errKind},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, func(nc net.Conn, br *bufio.Reader) {
				if line, err := br.ReadString('\n'); err == nil {
					t.Errorf("sent %q", line)
				}
			})
			c := f.conn(t, Options{})
			reqs := []Request{{Kind: KindGet, Key: "ok"}, tc.req}
			require.ErrorIs(t, c.Pipeline(context.Background(), reqs), tc.want)
			require.ErrorIs(t, reqs[0].Err, tc.want)
		})
	}
}

// TestPipelineCancelStorm: pipelines and single requests cancelled at
// random among others: every reply returned is its own, and the
// connection stays up.
func TestPipelineCancelStorm(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t)
	c := m.conn(t, Options{Timeout: 5 * time.Second})
	bg := context.Background()
	for i := range 50 {
		_, err := c.Set(bg, key(i), []byte(key(i)), SetOptions{})
		require.NoError(t, err)
	}
	errs := make(chan error, 16)
	for g := range 16 {
		go func() {
			errs <- func() error {
				for i := range 100 {
					ctx, cancel := context.WithTimeout(bg, time.Duration(i%5)*30*time.Microsecond)
					reqs := make([]Request, 1+(g+i)%7)
					for j := range reqs {
						reqs[j] = Request{Kind: KindGet, Key: key((g*7 + i + j) % 50), Get: GetOptions{Value: true}}
					}
					var err error
					if g%2 == 0 {
						err = c.Pipeline(ctx, reqs)
					} else {
						reqs[0].Item, reqs[0].Err = c.Get(ctx, reqs[0].Key, reqs[0].Get)
						reqs = reqs[:1]
					}
					cancel()
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return err
					}
					for _, r := range reqs {
						switch {
						case errors.Is(r.Err, context.DeadlineExceeded):
						case r.Err != nil:
							return r.Err
						case string(r.Item.Value) != r.Key:
							return fmt.Errorf("%s returned %q", r.Key, r.Item.Value)
						}
					}
				}
				return nil
			}()
		}()
	}
	for range 16 {
		require.NoError(t, <-errs)
	}
	require.NoError(t, c.Err())
	require.NoError(t, c.Noop(bg))
	require.Zero(t, c.Outstanding())
}
