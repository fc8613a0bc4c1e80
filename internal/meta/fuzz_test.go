package meta

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzReply feeds arbitrary bytes to ReadReply, reply after reply: it must
// never panic, never return a value longer than the bound, and every
// reply it accepts must come back the same once encoded and parsed again;
// one over the bound is read past, with no value.
func FuzzReply(f *testing.F) {
	for _, s := range []string{
		// Replies seen from memcached 1.6.18 (see meta.md).
		"HD\r\n",
		"VA 2 t90 f5 c1 s2\r\nhi\r\n",
		"EN\r\n",
		"HD t-1\r\n",
		"VA 0 t30 c2 W\r\n\r\n",
		"VA 0 t29 c2 Z\r\n\r\n",
		"VA 2 t30 c3 X W\r\nhi\r\n",
		"VA 2 t30 c3 Z X\r\nhi\r\n",
		"EX\r\n",
		"NF\r\n",
		"NS\r\n",
		"VA 1 t60\r\n8\r\n",
		"HD c3 W\r\n",
		"MN\r\n",
		"VA 3 kfoo O1 f0\r\nbar\r\nVA 1 kbaz O3\r\nx\r\nMN\r\n",
		"ERROR\r\n",
		"CLIENT_ERROR bad command line format\r\n",
		"SERVER_ERROR out of memory storing object\r\n",
		// Hostile ones.
		"VA 999999999999\r\n",
		"VA 5\r\nhi",
		"VA 2\r\nhiXX",
		"HD tx c-1 f99999999999\r\n",
		"VA 64\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n",
		// Over the bound: read past, in step.
		"VA 65 O2\r\n01234567890123456789012345678901234567890123456789012345678901234\r\nHD\r\n",
		"VA 100\r\nshort",
		"VA 1073741825\r\n",
	} {
		f.Add([]byte(s))
	}
	const max = 64
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 256)
		var rep Reply
		for range 64 {
			err := ReadReply(br, &rep, max)
			if len(rep.Value) > max || cap(rep.Value) > max {
				t.Fatalf("value of %d bytes (cap %d) past the bound %d", len(rep.Value), cap(rep.Value), max)
			}
			if err != nil {
				var se *ServerError
				var ce *ClientError
				if errors.Is(err, ErrTooLarge) && (len(rep.Value) != 0 || rep.Status != StatusVA) {
					t.Fatalf("%q: a value over the bound read as %+v", data, rep)
				}
				if errors.As(err, &se) || errors.As(err, &ce) || errors.Is(err, ErrUnknownCommand) || errors.Is(err, ErrTooLarge) {
					continue // the stream stays in step after these
				}
				return
			}
			enc := appendReply(nil, &rep)
			var again Reply
			if err := ReadReply(bufio.NewReader(bytes.NewReader(enc)), &again, max); err != nil {
				t.Fatalf("%q, parsed as %+v and encoded as %q, does not parse again: %v", data, rep, enc, err)
			}
			if !sameReply(&rep, &again) {
				t.Fatalf("%q: round trip through %q changed %+v into %+v", data, enc, rep, again)
			}
		}
	})
}

func sameReply(a, b *Reply) bool {
	return a.Status == b.Status && a.Has == b.Has && bytes.Equal(a.Value, b.Value) &&
		a.TTL == b.TTL && a.ClientFlags == b.ClientFlags && a.CAS == b.CAS &&
		a.Size == b.Size && bytes.Equal(a.Key, b.Key) && a.Opaque == b.Opaque
}

// FuzzStat feeds arbitrary bytes to readStat: it must never panic, and
// reads at most maxStatLines lines.
func FuzzStat(f *testing.F) {
	for _, s := range []string{
		"STAT maxbytes 67108864\r\nSTAT item_size_max 4194304\r\nEND\r\n",
		"STAT item_size_max 1048576\nEND\n",
		"END\r\n",
		"ERROR\r\n",
		"SERVER_ERROR busy\r\n",
		"STAT item_size_max 99999999999999999999999\r\nEND\r\n",
		"STAT item_size_max\r\nEND\r\n",
		"HD\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		br := bufio.NewReaderSize(r, 256)
		n, err := readStat(br, "item_size_max")
		if err == nil && n < 0 {
			t.Fatalf("%q: item_size_max %d", data, n)
		}
		if read := len(data) - r.Len() - br.Buffered(); bytes.Count(data[:read], []byte("\n")) > maxStatLines {
			t.Fatalf("%q: read %d lines", data, bytes.Count(data[:read], []byte("\n")))
		}
	})
}

// FuzzConn answers a Conn's requests with arbitrary bytes: every request
// must return (no hang, no panic), values stay within the bound, and
// Close leaves no goroutine behind.
func FuzzConn(f *testing.F) {
	for _, s := range []string{
		"VA 2 O1\r\nhi\r\nHD O2\r\nVA 1 O1 kk0\r\nx\r\nMN\r\n",
		"EN O1\r\nEN O2\r\nMN\r\n",
		"SERVER_ERROR oom\r\nCLIENT_ERROR bad\r\nMN\r\n",
		"ERROR\r\n",
		"VA 999999999\r\n",
		"VA 5 O1\r\nhi",
		"HD O7\r\n",
		"MN\r\nMN\r\nMN\r\n",
		"VA 100 O1\r\n" + strings.Repeat("v", 100) + "\r\nHD O2\r\nMN\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		client, server := net.Pipe()
		go func() {
			io.Copy(io.Discard, server) // read whatever is sent
		}()
		go func() {
			server.Write(data)
		}()
		c := NewConn(client, Options{Timeout: 50 * time.Millisecond, MaxValueSize: 64})
		ctx := context.Background()
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			it, _ := c.Get(ctx, "k", GetOptions{Value: true})
			if len(it.Value) > 64 {
				t.Errorf("value of %d bytes", len(it.Value))
			}
		}()
		go func() {
			defer wg.Done()
			c.Set(ctx, "k", []byte("v"), SetOptions{})
		}()
		go func() {
			defer wg.Done()
			m, _ := c.GetMulti(ctx, []string{"k0", "k1"}, GetOptions{Value: true})
			for _, it := range m {
				if len(it.Value) > 64 {
					t.Errorf("value of %d bytes", len(it.Value))
				}
			}
		}()
		wg.Wait()
		c.Close()
		server.Close()
	})
}
