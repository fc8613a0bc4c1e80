package meta

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostileReplies(t *testing.T) {
	tests := []struct {
		name     string
		reply    string
		is       error  // what the request's error wraps
		contains string // and says
		closed   bool   // whether the connection is closed after
	}{
		{"oversized line", "HD " + strings.Repeat("x", 3*MaxLineLen) + "\r\n", ErrProtocol, "reply line longer than 8192 bytes", true},
		{"oversized value size", "VA 999999999999\r\n", ErrProtocol, "value of 999999999999 bytes exceeds memcached's largest item size", true},
		{"value over the bound", "VA 3000000\r\n" + strings.Repeat("v", 3000000) + "\r\n", ErrTooLarge, "a value of 3000000 bytes, over the bound of 1049088", false},
		{"value over the bound, another opaque", "VA 3000000 O9\r\n" + strings.Repeat("v", 3000000) + "\r\n", ErrProtocol, "reply with opaque 9 to mg \"k\" sent with opaque 1", true},
		{"value over the bound without crlf", "VA 3000000 O1\r\n" + strings.Repeat("v", 3000000) + "XX", ErrProtocol, "value of 3000000 bytes not followed by \\r\\n", true},
		{"value without crlf", "VA 2\r\nhiXX", ErrProtocol, "value of 2 bytes not followed by \\r\\n", true},
		{"garbage", "\x16\x03\x01 tls hello?\r\n", ErrProtocol, "unknown reply status", true},
		{"classic protocol", "VALUE k 0 2\r\nhi\r\nEND\r\n", ErrProtocol, "unknown reply status", true},
		{"reply of another command", "MN\r\n", ErrProtocol, "reply MN to mg", true},
		{"garbled number", "VA 2 fxyz\r\nhi\r\n", ErrProtocol, "garbled number in return flag \"fxyz\"", true},
		{"reply for another key", "VA 2 kother\r\nhi\r\n", ErrProtocol, "reply for key \"other\" to mg of key \"k\"", true},
		{"reply with another opaque", "VA 2 O9\r\nhi\r\n", ErrProtocol, "reply with opaque 9 to mg \"k\" sent with opaque 1", true},
		{"ERROR", "ERROR\r\n", ErrUnknownCommand, "ERROR", true},
		{"CLIENT_ERROR", "CLIENT_ERROR bad command line format\r\n", nil, "CLIENT_ERROR bad command line format", false},
		{"SERVER_ERROR", "SERVER_ERROR out of memory storing object\r\n", nil, "SERVER_ERROR out of memory storing object", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkGoroutines(t)
			reply := []byte(tt.reply) // not counted below
			s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
				if _, err := readRequest(br); err != nil {
					return
				}
				nc.Write(reply)
				// Then a sane server, for the connections that survive.
				for {
					line, err := readRequest(br)
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "mn") {
						nc.Write([]byte("MN\r\n"))
					} else {
						nc.Write([]byte("EN\r\n"))
					}
				}
			})
			c := s.conn(t, Options{Timeout: time.Second})
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := c.Get(context.Background(), "k", GetOptions{Value: true})
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			require.Error(t, err)
			if tt.is != nil {
				require.ErrorIs(t, err, tt.is)
			}
			require.ErrorContains(t, err, tt.contains)
			require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<10), "memory allocated for a hostile reply")
			if !tt.closed {
				require.NoError(t, c.Err())
				_, err := c.Get(context.Background(), "k", GetOptions{Value: true})
				require.ErrorIs(t, err, ErrMiss, "the connection is still in step")
				require.NoError(t, c.Noop(context.Background()))
				return
			}
			require.ErrorIs(t, waitFailed(t, c), ErrConnClosed)
			_, err = c.Get(context.Background(), "k", GetOptions{})
			require.ErrorIs(t, err, ErrConnClosed)
		})
	}
}

// A failure fails every pending request, not only the one it hit.
func TestHostileFailsAllPending(t *testing.T) {
	checkGoroutines(t)
	const n = 8
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		for range n {
			if _, err := readRequest(br); err != nil {
				return
			}
		}
		nc.Write([]byte("EN\r\nGARBAGE\r\n"))
		readRequest(br)
	})
	c := s.conn(t, Options{Timeout: 5 * time.Second})
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := c.Get(context.Background(), "k"+string(rune('a'+i)), GetOptions{Value: true})
			errs <- err
		}()
	}
	var misses, failed int
	for range n {
		err := <-errs
		switch {
		case errors.Is(err, ErrMiss):
			misses++
		case errors.Is(err, ErrConnClosed) && errors.Is(err, ErrProtocol):
			failed++
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	require.Equal(t, 1, misses)
	require.Equal(t, n-1, failed)
}

func TestHostileUnsolicited(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, replyWith("EN\r\nHD\r\n"))
	c := s.conn(t, Options{})
	_, err := c.Get(context.Background(), "k", GetOptions{})
	require.ErrorIs(t, err, ErrMiss)
	err = waitFailed(t, c)
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "unsolicited reply \"HD\\r\\n\" with no request pending")
}

// A reply to nothing that arrives while the connection is idle, when
// nothing reads, is read by the next request, as a reply without the
// opaque it sent (the server had echoed one before): the connection fails
// with a protocol error rather than take it for the answer.
func TestHostileUnsolicitedWhileIdle(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		line, err := readRequest(br)
		if err != nil {
			return
		}
		_, opaque, _ := strings.Cut(line, " O")
		opaque, _, _ = strings.Cut(opaque, " ")
		nc.Write([]byte("EN O" + opaque + "\r\n"))
		time.Sleep(50 * time.Millisecond)
		nc.Write([]byte("HD\r\n")) // to nothing
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
		}
	})
	c := s.conn(t, Options{})
	_, err := c.Get(context.Background(), "k", GetOptions{})
	require.ErrorIs(t, err, ErrMiss)
	time.Sleep(150 * time.Millisecond)
	_, err = c.Get(context.Background(), "k", GetOptions{})
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "reply HD without the opaque")
	require.ErrorIs(t, c.Err(), ErrConnClosed)
}

func TestHostileHangMidValue(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, replyWith("VA 10\r\nhi"))
	c := s.conn(t, Options{Timeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := c.Get(context.Background(), "k", GetOptions{Value: true})
	took := time.Since(start)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorIs(t, err, ErrConnClosed)
	require.ErrorContains(t, err, "within 100ms")
	require.Less(t, took, time.Second)
	require.GreaterOrEqual(t, took, 90*time.Millisecond)
	require.Error(t, c.Err())
}

func TestHostileEOFMidValue(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		readRequest(br)
		nc.Write([]byte("VA 10\r\nhi"))
	})
	c := s.conn(t, Options{})
	_, err := c.Get(context.Background(), "k", GetOptions{Value: true})
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "reading a value of 10 bytes: unexpected EOF")
}

func TestHostileNeverAnswers(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
		}
	})
	c := s.conn(t, Options{Timeout: 150 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "k", GetOptions{Value: true})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 200*time.Millisecond, "a 20 ms deadline")
	require.NoError(t, c.Err(), "a request's deadline does not close the connection")
	// The connection's own timeout does, once the oldest reply is late.
	_, err = c.Get(context.Background(), "k2", GetOptions{Value: true})
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Error(t, c.Err())
}

// Detection: a server that predates the meta protocol answers mn ERROR.
func TestHostileNoMeta(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, replyWith("ERROR\r\n"))
	p := NewPool(s.dial, Options{})
	defer p.Close()
	err := p.Detect(context.Background())
	require.ErrorIs(t, err, ErrNoMeta)
	require.ErrorIs(t, err, ErrUnknownCommand)
	require.ErrorContains(t, err, "memcached 1.6 or later")
}

// A Pool drops a broken connection and dials a new one on next use.
func TestPoolRedials(t *testing.T) {
	checkGoroutines(t)
	var mu sync.Mutex
	accepted := 0
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		mu.Lock()
		accepted++
		first := accepted == 1
		mu.Unlock()
		for {
			line, err := readRequest(br)
			if err != nil {
				return
			}
			if first {
				return // hang up: the request fails
			}
			if strings.HasPrefix(line, "mn") {
				nc.Write([]byte("MN\r\n"))
			}
		}
	})
	p := NewPool(s.dial, Options{MaxConns: 1})
	defer p.Close()
	ctx := context.Background()
	err := p.Noop(ctx)
	require.ErrorIs(t, err, ErrConnClosed)
	require.ErrorContains(t, err, "EOF")
	require.NoError(t, p.Noop(ctx))
	require.NoError(t, p.Noop(ctx))
	mu.Lock()
	require.Equal(t, 2, accepted)
	mu.Unlock()
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	require.ErrorIs(t, p.Noop(ctx), ErrConnClosed)
}

func TestPoolDialError(t *testing.T) {
	p := NewPool(func(ctx context.Context) (net.Conn, error) {
		return nil, errors.New("no route")
	}, Options{})
	defer p.Close()
	_, err := p.Get(context.Background(), "k", GetOptions{})
	require.ErrorContains(t, err, "meta: dial: no route")
}

func TestConnCloseIdempotent(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		readRequest(br) // and never answer
		readRequest(br)
	})
	c := s.conn(t, Options{})
	errs := make(chan error, 1)
	go func() { errs <- c.Noop(context.Background()) }()
	require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	err := <-errs
	require.ErrorIs(t, err, ErrConnClosed)
	require.ErrorContains(t, err, "closed by Close")
	require.Zero(t, c.Outstanding())
}

func TestQuietRefused(t *testing.T) {
	s := startFake(t, replyWith(""))
	c := s.conn(t, Options{})
	ctx := context.Background()
	_, err := c.Get(ctx, "k", GetOptions{Quiet: true})
	require.ErrorIs(t, err, ErrQuiet)
	_, err = c.Set(ctx, "k", nil, SetOptions{Quiet: true})
	require.ErrorIs(t, err, ErrQuiet)
	require.ErrorIs(t, c.Delete(ctx, "k", DeleteOptions{Quiet: true}), ErrQuiet)
	_, err = c.Arith(ctx, "k", ArithOptions{Quiet: true})
	require.ErrorIs(t, err, ErrQuiet)
	_, err = c.Get(ctx, "bad key", GetOptions{})
	require.ErrorIs(t, err, ErrInvalidKey)
}

func TestHostileBatch(t *testing.T) {
	tests := []struct {
		name, reply, contains string
	}{
		{"opaque never sent", "VA 1 k0 O7\r\nx\r\nMN\r\n", "opaque 7, not one sent"},
		{"no opaque", "VA 1 kk0\r\nx\r\nMN\r\n", "opaque 0, not one sent"},
		{"key of another opaque", "VA 1 kk1 O1\r\nx\r\nMN\r\n", "for key \"k1\" with the opaque of key \"k0\""},
		{"status of another command", "NS\r\nMN\r\n", "reply NS in a get batch"},
		{"garbage", "hello\r\n", "unknown reply status"},
		{"more hits than keys", "VA 1 kk0 O1\r\nx\r\nVA 1 kk0 O1\r\nx\r\nVA 1 kk0 O1\r\nx\r\nMN\r\n", "more replies than the 2 keys of a get batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkGoroutines(t)
			s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
				for {
					line, err := readRequest(br)
					if err != nil {
						return
					}
					if line == "mn" {
						nc.Write([]byte(tt.reply))
					}
				}
			})
			c := s.conn(t, Options{})
			_, err := c.GetMulti(context.Background(), []string{"k0", "k1"}, GetOptions{Value: true})
			require.ErrorIs(t, err, ErrProtocol)
			require.ErrorIs(t, err, ErrConnClosed)
			require.ErrorContains(t, err, tt.contains)
		})
	}
	t.Run("server error among hits", func(t *testing.T) {
		checkGoroutines(t)
		s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
			for {
				line, err := readRequest(br)
				if err != nil {
					return
				}
				if line == "mn" {
					nc.Write([]byte("VA 1 kk0 O1\r\nx\r\nSERVER_ERROR out of memory\r\nMN\r\n"))
				}
			}
		})
		c := s.conn(t, Options{})
		got, err := c.GetMulti(context.Background(), []string{"k0", "k1"}, GetOptions{Value: true})
		var se *ServerError
		require.ErrorAs(t, err, &se)
		require.Equal(t, "x", string(got["k0"].Value))
		require.Len(t, got, 1)
		require.NoError(t, c.Err())
	})
}

// opaqueOf returns the O token of a request line ("O12"), or "".
func opaqueOf(line string) string {
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "O") {
			return f
		}
	}
	return ""
}

// A reply sent twice while other requests are pending: the opaque shows
// that the second copy is not the next request's, so the connection is
// failed rather than handing the next request a wrong answer.
func TestHostileDuplicateReply(t *testing.T) {
	checkGoroutines(t)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		var ops []string
		for range 2 {
			line, err := readRequest(br)
			if err != nil {
				return
			}
			ops = append(ops, opaqueOf(line))
		}
		nc.Write([]byte("EN " + ops[0] + "\r\nEN " + ops[0] + "\r\nEN " + ops[1] + "\r\n"))
		readRequest(br)
	})
	c := s.conn(t, Options{})
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.Get(context.Background(), "a", GetOptions{}); errA <- err }()
	require.Eventually(t, func() bool { return c.Outstanding() == 1 }, time.Second, time.Millisecond)
	go func() { _, err := c.Get(context.Background(), "b", GetOptions{}); errB <- err }()
	first, second := <-errA, <-errB
	require.ErrorIs(t, first, ErrMiss)
	require.ErrorIs(t, second, ErrProtocol)
	require.ErrorContains(t, second, "reply with opaque 1 to mg \"b\" sent with opaque 2")
	require.Error(t, c.Err())
}
