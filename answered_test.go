package selector

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// cacheClient is what the tests run through both gomemcache's Client and
// this one.
type cacheClient interface {
	Set(*memcache.Item) error
	Get(string) (*memcache.Item, error)
	Add(*memcache.Item) error
	Replace(*memcache.Item) error
	Append(*memcache.Item) error
	Prepend(*memcache.Item) error
	CompareAndSwap(*memcache.Item) error
	Increment(string, uint64) (uint64, error)
	Decrement(string, uint64) (uint64, error)
}

// TestRefusedWriteKeepsValue runs each write that memcached refuses, as an
// answer to a well-formed request (CLIENT_ERROR, SERVER_ERROR object too
// large), through gomemcache and through the Client, on a key that holds
// "abc": the Client returns gomemcache's error, and the key then holds what
// it holds after gomemcache's. The Client took such an answer for a failed
// write, whose outcome is unknown, and deleted the key; and its ms of a
// value too large has memcached delete the value in every mode (its classic
// commands, only for a set). A value larger than the server stores is not
// sent at all: the key is left as memcached would have left it.
func TestRefusedWriteKeepsValue(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	big := bytes.Repeat([]byte("x"), 2<<20)
	for _, tc := range []struct {
		name string
		op   func(cc cacheClient, key string) error
	}{
		{"increment of a value not a number", func(cc cacheClient, k string) error { _, err := cc.Increment(k, 1); return err }},
		{"decrement of a value not a number", func(cc cacheClient, k string) error { _, err := cc.Decrement(k, 1); return err }},
		{"append too large", func(cc cacheClient, k string) error { return cc.Append(&memcache.Item{Key: k, Value: big}) }},
		{"prepend too large", func(cc cacheClient, k string) error { return cc.Prepend(&memcache.Item{Key: k, Value: big}) }},
		{"replace too large", func(cc cacheClient, k string) error { return cc.Replace(&memcache.Item{Key: k, Value: big}) }},
		{"add too large", func(cc cacheClient, k string) error { return cc.Add(&memcache.Item{Key: k, Value: big}) }},
		{"compare-and-swap too large", func(cc cacheClient, k string) error {
			it, err := cc.Get(k)
			require.NoError(t, err)
			it.Value = big
			return cc.CompareAndSwap(it)
		}},
		// memcached deletes the value itself (in either protocol): a miss
		// for both.
		{"set too large", func(cc cacheClient, k string) error { return cc.Set(&memcache.Item{Key: k, Value: big}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcome := func(cc cacheClient, key string) (opErr error, read string) {
				require.NoError(t, cc.Set(&memcache.Item{Key: key, Value: []byte("abc")}))
				err := tc.op(cc, key)
				require.Error(t, err)
				it, gerr := cc.Get(key)
				if gerr != nil {
					return err, gerr.Error()
				}
				return err, fmt.Sprintf("%q", it.Value)
			}
			wantErr, want := outcome(direct(ms[0].addr), "gomemcache")
			gotErr, got := outcome(c, "client")
			var tl *valueTooLargeError
			if errors.As(gotErr, &tl) {
				// Not sent (see server.fits): the server's refusal, in
				// words of the Client's.
				require.True(t, refusedStore(wantErr), "gomemcache: %v", wantErr)
				require.ErrorContains(t, gotErr, "2097152 bytes, over the largest item memcached at "+ms[0].addr+" stores (1048576 bytes")
			} else {
				require.Equal(t, wantErr.Error(), gotErr.Error(), "the error")
			}
			require.Equal(t, want, got, "the key after the refused write")
		})
	}
}

// TestAnswered: the server's answers that leave the value as it was, in
// both protocols' wording; a SERVER_ERROR that may be a proxy's timeout,
// and the transport's failures, are failed writes.
func TestAnswered(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"meta client error", gomemcacheErr("incr", &meta.ClientError{Msg: "cannot increment or decrement non-numeric value"}), true},
		{"meta too large", gomemcacheErr("append", &meta.ServerError{Msg: "object too large for cache"}), true},
		{"meta out of memory", gomemcacheErr("set", &meta.ServerError{Msg: "out of memory storing object"}), true},
		{"a proxy's server error", gomemcacheErr("set", &meta.ServerError{Msg: "timeout"}), false},
		{"classic client error", errors.New("memcache: client error: cannot increment or decrement non-numeric value"), true},
		{"classic too large", errors.New(`memcache: unexpected response line from "append": "SERVER_ERROR object too large for cache\r\n"`), true},
		{"classic other server error", errors.New(`memcache: unexpected response line from "set": "SERVER_ERROR backend failure\r\n"`), false},
		{"timeout", &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
		{"broken", io.ErrUnexpectedEOF, false},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, answered(tc.err)) })
	}
}

// TestIncrementOfPlaceholderIsAMiss: a key that another client's copy has
// reserved holds an empty placeholder (mg N), which memcached increments
// as text ("non-numeric"). To the Client the key has no value, as to its
// reads: Increment and Decrement miss, as gomemcache's do on a key with no
// value, instead of failing with an error no application can act on (the
// history checker's flap and kill schedules met it after each change).
func TestIncrementOfPlaceholderIsAMiss(t *testing.T) {
	ms := startMemcached(t, 1)
	c, _ := newTestClient(t, addrsOf(ms))
	for _, tc := range []struct {
		name string
		op   func(key string) error
	}{
		{"increment", func(k string) error { _, err := c.Increment(k, 1); return err }},
		{"decrement", func(k string) error { _, err := c.Decrement(k, 1); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "reserved-" + tc.name
			line := rawLine(t, ms[0].addr, "mg "+key+" N30 c")
			require.Contains(t, line, " W", "the placeholder was made")

			require.ErrorIs(t, tc.op(key), memcache.ErrCacheMiss)
			_, err := c.Get(key)
			require.ErrorIs(t, err, memcache.ErrCacheMiss)

			// Once the copy fills it, the value counts as any other.
			require.NoError(t, direct(ms[0].addr).Set(&memcache.Item{Key: key, Value: []byte("10")}))
			require.NoError(t, tc.op(key))
		})
	}
}
