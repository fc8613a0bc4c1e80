package meta

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Values over memcached's default item size: read up to the bound the
// server's item_size_max sets, and past it dropped with the connection in
// step; a size a server claims costs memory only as its bytes arrive.

// TestRealItemSizeMax: ItemSizeMax reads memcached's -I, which, made the
// bound, lets the values memcached stores be read.
func TestRealItemSizeMax(t *testing.T) {
	checkGoroutines(t)
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"default", nil, 1 << 20},
		{"-I 4m", []string{"-I", "4m", "-m", "64"}, 4 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := startMemcached(t, tt.args...)
			p := m.pool(t, Options{MaxConns: 1, Timeout: 5 * time.Second}) // 4 MB under -race on a loaded machine
			ctx := context.Background()
			n, err := p.ItemSizeMax(ctx)
			require.NoError(t, err)
			require.Equal(t, tt.want, n)
			require.NoError(t, p.Noop(ctx), "in step after stats")

			v := bytes.Repeat([]byte("0123456789"), (tt.want-1024)/10)
			_, err = p.Set(ctx, "large", v, SetOptions{})
			require.NoError(t, err)
			p.SetMaxValueSize(n)
			it, err := p.Get(ctx, "large", GetOptions{Value: true})
			require.NoError(t, err)
			require.True(t, bytes.Equal(v, it.Value))
			got, err := p.GetMulti(ctx, []string{"large", "missing"}, GetOptions{Value: true})
			require.NoError(t, err)
			require.True(t, bytes.Equal(v, got["large"].Value))
		})
	}
}

// TestRealOverTheBound: a value over the bound fails its own request, in
// a Get or in a batch; the requests around it on the connection succeed.
func TestRealOverTheBound(t *testing.T) {
	checkGoroutines(t)
	m := startMemcached(t, "-I", "4m", "-m", "64")
	c := m.conn(t, Options{Timeout: 5 * time.Second}) // 3 MB under -race on a loaded machine
	ctx := context.Background()
	large := bytes.Repeat([]byte("x"), 3<<20)
	_, err := c.Set(ctx, "large", large, SetOptions{})
	require.NoError(t, err)
	_, err = c.Set(ctx, "small", []byte("s"), SetOptions{})
	require.NoError(t, err)

	errs := make(chan error, 3)
	go func() { _, err := c.Get(ctx, "small", GetOptions{Value: true}); errs <- err }()
	go func() { _, err := c.Get(ctx, "large", GetOptions{Value: true}); errs <- err }()
	go func() { _, err := c.Get(ctx, "small", GetOptions{Value: true}); errs <- err }()
	var tooLarge int
	for range 3 {
		err := <-errs
		if errors.Is(err, ErrTooLarge) {
			tooLarge++
			require.ErrorContains(t, err, fmt.Sprintf("a value of %d bytes, over the bound of %d", 3<<20, DefaultMaxValueSize))
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 1, tooLarge)

	got, err := c.GetMulti(ctx, []string{"small", "large", "missing"}, GetOptions{Value: true})
	require.ErrorIs(t, err, ErrTooLarge)
	require.Len(t, got, 1)
	require.Equal(t, "s", string(got["small"].Value))
	require.NoError(t, c.Err())
	require.NoError(t, c.Noop(ctx))

	c.SetMaxValueSize(4 << 20)
	it, err := c.Get(ctx, "large", GetOptions{Value: true})
	require.NoError(t, err)
	require.Len(t, it.Value, 3<<20)
}

// TestHostileClaimedSize: a server that claims a value of memcached's
// largest size, within the bound, and sends a few MB of it costs a few MB,
// not the size it claimed.
func TestHostileClaimedSize(t *testing.T) {
	checkGoroutines(t)
	sent := make([]byte, 3<<20)
	s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
		if _, err := readRequest(br); err != nil {
			return
		}
		nc.Write([]byte(fmt.Sprintf("VA %d\r\n", MaxItemSize)))
		nc.Write(sent)
	})
	c := s.conn(t, Options{MaxValueSize: MaxItemSize, Timeout: time.Second})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.Get(context.Background(), "k", GetOptions{Value: true})
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, fmt.Sprintf("reading a value of %d bytes", MaxItemSize))
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "memory allocated for a claim of 1 GiB")
}

func TestReadValueGrows(t *testing.T) {
	tests := []struct {
		name string
		size int
		buf  []byte // the reply's buffer before
	}{
		{"small", 10, nil},
		{"small into a buffer", 10, make([]byte, 0, 64)},
		{"empty", 0, nil},
		{"at the start size", growFrom, nil},
		{"past the start size", growFrom + 1, nil},
		{"a few times the start size", 5*growFrom + 12345, nil},
		{"large into a buffer", 3 * growFrom, make([]byte, 0, 3*growFrom)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := make([]byte, tt.size)
			for i := range v {
				v[i] = byte(i * 31)
			}
			in := fmt.Sprintf("VA %d\r\n%s\r\nHD\r\n", tt.size, v)
			br := bufio.NewReaderSize(strings.NewReader(in), MaxLineLen)
			rep := Reply{Value: tt.buf}
			require.NoError(t, ReadReply(br, &rep, MaxItemSize))
			require.True(t, bytes.Equal(v, rep.Value))
			require.NotNil(t, rep.Value)
			require.Equal(t, max(tt.size, cap(tt.buf)), cap(rep.Value), "no more than the value's size, unless in the caller's buffer")
			require.NoError(t, ReadReply(br, &rep, MaxItemSize), "in step after the value")
			require.Equal(t, StatusHD, rep.Status)
		})
	}
}

func TestReadStat(t *testing.T) {
	settings := "STAT maxbytes 67108864\r\nSTAT item_size_max 4194304\r\nSTAT slab_chunk_max 524288\r\nEND\r\n"
	tests := []struct {
		name, in string
		want     int64
		is       error  // what the error wraps, if any
		contains string // and says
	}{
		{"memcached's", settings, 4 << 20, nil, ""},
		{"bare lf", strings.ReplaceAll(settings, "\r\n", "\n"), 4 << 20, nil, ""},
		{"not said", "STAT maxbytes 67108864\r\nEND\r\n", 0, ErrNoSetting, "item_size_max"},
		{"unknown command", "ERROR\r\n", 0, ErrUnknownCommand, ""},
		{"server error", "SERVER_ERROR busy\r\n", 0, nil, "SERVER_ERROR busy"},
		{"garbled number", "STAT item_size_max 4m\r\nEND\r\n", 0, ErrProtocol, "garbled stat"},
		{"a meta reply", "HD\r\n", 0, ErrProtocol, "\"HD\" in a stats reply"},
		{"endless", strings.Repeat("STAT x 1\r\n", maxStatLines+1), 0, ErrProtocol, "more than 1024 lines"},
		{"long line", "STAT " + strings.Repeat("x", 2*MaxLineLen) + "\r\n", 0, ErrProtocol, "stats line longer than"},
		{"cut short", "STAT item_size_max 4194304\r\nST", 0, ErrProtocol, "cut short"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			if tt.is != ErrProtocol {
				in += "MN\r\n" // to read after the stats, in step
			}
			br := bufio.NewReaderSize(strings.NewReader(in), MaxLineLen)
			got, err := readStat(br, "item_size_max")
			if tt.is == nil && tt.contains == "" {
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
			} else {
				require.Error(t, err)
				if tt.is != nil {
					require.ErrorIs(t, err, tt.is)
				}
				require.ErrorContains(t, err, tt.contains)
			}
			if tt.is != ErrProtocol {
				var rep Reply
				require.NoError(t, ReadReply(br, &rep, 0), "in step after the stats")
				require.Equal(t, StatusMN, rep.Status)
			}
		})
	}
}
