package meta

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckKey(t *testing.T) {
	tests := []struct {
		name, key string
		ok        bool
	}{
		{"plain", "foo", true},
		{"punctuation", "a:b/c-d_e.f", true},
		{"utf8", "clé", true},
		{"max length", strings.Repeat("k", 250), true},
		{"empty", "", false},
		{"too long", strings.Repeat("k", 251), false},
		{"space", "a b", false},
		{"newline", "a\nb", false},
		{"cr", "a\r", false},
		{"nul", "a\x00", false},
		{"del", "a\x7f", false},
		{"tab", "\tab", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckKey(tt.key)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidKey)
			_, err = AppendGet(nil, tt.key, GetOptions{})
			require.ErrorIs(t, err, ErrInvalidKey)
			_, err = AppendSet(nil, tt.key, nil, SetOptions{})
			require.ErrorIs(t, err, ErrInvalidKey)
			_, err = AppendDelete(nil, tt.key, DeleteOptions{})
			require.ErrorIs(t, err, ErrInvalidKey)
			_, err = AppendArith(nil, tt.key, ArithOptions{})
			require.ErrorIs(t, err, ErrInvalidKey)
		})
	}
}

func TestEncode(t *testing.T) {
	must := func(b []byte, err error) string {
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name, got, want string
	}{
		{"mg bare", must(AppendGet(nil, "k", GetOptions{})), "mg k\r\n"},
		{"mg all", must(AppendGet(nil, "k", GetOptions{Value: true, ClientFlags: true, CAS: true, TTL: true, Size: true, Key: true, Quiet: true, Opaque: 7, Touch: true, TouchTTL: 30, Vivify: true, VivifyTTL: 60})),
			"mg k N60 T30 v f c t s k q O7\r\n"},
		{"mg touch never", must(AppendGet(nil, "k", GetOptions{Touch: true})), "mg k T0\r\n"},
		{"ms plain", must(AppendSet(nil, "k", []byte("hi"), SetOptions{})), "ms k 2\r\nhi\r\n"},
		{"ms all", must(AppendSet(nil, "k", []byte("hi"), SetOptions{TTL: 90, ClientFlags: 5, CompareCAS: 12, Invalidate: true, Mode: ModeAdd, ReturnCAS: true, Quiet: true, Opaque: 3})),
			"ms k 2 T90 F5 C12 I ME c q O3\r\nhi\r\n"},
		{"ms set mode omitted", must(AppendSet(nil, "k", nil, SetOptions{Mode: ModeSet})), "ms k 0\r\n\r\n"},
		{"ms replace", must(AppendSet(nil, "k", []byte("x"), SetOptions{Mode: ModeReplace})), "ms k 1 MR\r\nx\r\n"},
		{"ms append", must(AppendSet(nil, "k", []byte("x"), SetOptions{Mode: ModeAppend})), "ms k 1 MA\r\nx\r\n"},
		{"ms prepend", must(AppendSet(nil, "k", []byte("x"), SetOptions{Mode: ModePrepend})), "ms k 1 MP\r\nx\r\n"},
		{"ms binary value", must(AppendSet(nil, "k", []byte("a\r\nb"), SetOptions{})), "ms k 4\r\na\r\nb\r\n"},
		{"md plain", must(AppendDelete(nil, "k", DeleteOptions{})), "md k\r\n"},
		{"md all", must(AppendDelete(nil, "k", DeleteOptions{CompareCAS: 9, Invalidate: true, TTL: 30, Quiet: true, Opaque: 2})), "md k C9 I T30 q O2\r\n"},
		{"md ttl needs I", must(AppendDelete(nil, "k", DeleteOptions{TTL: 30})), "md k\r\n"},
		{"ma incr", must(AppendArith(nil, "k", ArithOptions{Delta: 1})), "ma k MI D1\r\n"},
		{"ma all", must(AppendArith(nil, "k", ArithOptions{Decrement: true, Delta: 3, Vivify: true, VivifyTTL: 60, Initial: 10, Touch: true, TouchTTL: 30, Value: true, TTL: true, CAS: true, CompareCAS: 4, Quiet: true, Opaque: 1})),
			"ma k MD D3 N60 J10 T30 C4 v t c q O1\r\n"},
		{"mn", string(AppendNoop(nil)), "mn\r\n"},
		{"appends", must(AppendGet([]byte("mn\r\n"), "k", GetOptions{Value: true})), "mn\r\nmg k v\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.got)
		})
	}
	_, err := AppendSet(nil, "k", nil, SetOptions{Mode: 'Q'})
	require.ErrorContains(t, err, "unknown set mode")
}

func TestEncodeAllocs(t *testing.T) {
	buf := make([]byte, 0, 512)
	v := []byte("value")
	n := testing.AllocsPerRun(100, func() {
		b, _ := AppendGet(buf[:0], "some:key", GetOptions{Value: true, ClientFlags: true, CAS: true, Opaque: 12, Touch: true, TouchTTL: 30})
		b, _ = AppendSet(b, "some:key", v, SetOptions{TTL: 90, ClientFlags: 3, CompareCAS: 77})
		b, _ = AppendDelete(b, "some:key", DeleteOptions{Invalidate: true, TTL: 5})
		b, _ = AppendArith(b, "some:key", ArithOptions{Delta: 5, Vivify: true, Value: true})
		AppendNoop(b)
	})
	require.Zero(t, n)
}

func parseOne(t *testing.T, in string, maxValue int) (Reply, error) {
	t.Helper()
	var rep Reply
	err := ReadReply(bufio.NewReaderSize(strings.NewReader(in), MaxLineLen), &rep, maxValue)
	return rep, err
}

func TestReadReply(t *testing.T) {
	tests := []struct {
		name, in string
		want     Reply
	}{
		{"HD", "HD\r\n", Reply{Status: StatusHD}},
		{"EN", "EN\r\n", Reply{Status: StatusEN}},
		{"NF", "NF\r\n", Reply{Status: StatusNF}},
		{"NS", "NS\r\n", Reply{Status: StatusNS}},
		{"EX", "EX\r\n", Reply{Status: StatusEX}},
		{"MN", "MN\r\n", Reply{Status: StatusMN}},
		{"VA with flags", "VA 2 t90 f5 c1 s2\r\nhi\r\n",
			Reply{Status: StatusVA, Value: []byte("hi"), TTL: 90, ClientFlags: 5, CAS: 1, Size: 2, Has: RetTTL | RetFlags | RetCAS | RetSize}},
		{"never expires", "HD t-1\r\n", Reply{Status: StatusHD, TTL: -1, Has: RetTTL}},
		{"vivified", "VA 0 t30 c2 W\r\n\r\n", Reply{Status: StatusVA, Value: []byte{}, TTL: 30, CAS: 2, Has: RetTTL | RetCAS | RetWon}},
		{"stale won", "VA 2 t30 c3 X W\r\nhi\r\n", Reply{Status: StatusVA, Value: []byte("hi"), TTL: 30, CAS: 3, Has: RetTTL | RetCAS | RetStale | RetWon}},
		{"stale claimed", "VA 2 t30 c3 Z X\r\nhi\r\n", Reply{Status: StatusVA, Value: []byte("hi"), TTL: 30, CAS: 3, Has: RetTTL | RetCAS | RetStale | RetAlreadyWon}},
		{"key and opaque", "HD kfoo O17\r\n", Reply{Status: StatusHD, Key: []byte("foo"), Opaque: 17, Has: RetKey | RetOpaque}},
		{"unknown flags skipped", "HD h1 l30 b\r\n", Reply{Status: StatusHD}},
		{"value holding crlf", "VA 4\r\na\r\nb\r\n", Reply{Status: StatusVA, Value: []byte("a\r\nb")}},
		{"max cas", "HD c18446744073709551615\r\n", Reply{Status: StatusHD, CAS: 1<<64 - 1, Has: RetCAS}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseOne(t, tt.in, 0)
			require.NoError(t, err)
			if len(got.Key) == 0 {
				got.Key = nil
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestReadReplyErrors(t *testing.T) {
	tests := []struct {
		name, in string
		max      int
		is       error  // errors.Is target, if any
		contains string // a substring of the message
	}{
		{"ERROR", "ERROR\r\n", 0, ErrUnknownCommand, "ERROR"},
		{"SERVER_ERROR", "SERVER_ERROR out of memory storing object\r\n", 0, nil, "SERVER_ERROR out of memory storing object"},
		{"CLIENT_ERROR", "CLIENT_ERROR bad command line format\r\n", 0, nil, "CLIENT_ERROR bad command line format"},
		{"long line", "HD " + strings.Repeat("x", MaxLineLen) + "\r\n", 0, ErrProtocol, "reply line longer than 8192 bytes"},
		{"huge size", "VA 999999999999\r\n", 0, ErrProtocol, "value of 999999999999 bytes exceeds memcached's largest item size, 1073741824"},
		{"huge size, bound above memcached's", "VA 1073741825\r\n", 2 << 30, ErrProtocol, "exceeds memcached's largest item size"},
		{"size past bound", "VA 11\r\n01234567890\r\n", 10, ErrTooLarge, "a value of 11 bytes, over the bound of 10"},
		{"size past bound, eof mid value", "VA 11\r\n0123", 10, ErrProtocol, "reading a value of 11 bytes: unexpected EOF"},
		{"size past bound, no crlf after value", "VA 11\r\n01234567890XX", 10, ErrProtocol, "not followed by \\r\\n"},
		{"overflowing size", "VA 99999999999999999999999\r\n", 0, ErrProtocol, "garbled value size"},
		{"negative size", "VA -1\r\n", 0, ErrProtocol, "garbled value size"},
		{"missing size", "VA\r\n", 0, ErrProtocol, "garbled value size"},
		{"no crlf after value", "VA 2\r\nhiXX", 0, ErrProtocol, "not followed by \\r\\n"},
		{"eof mid value", "VA 10\r\nhi", 0, ErrProtocol, "reading a value of 10 bytes: unexpected EOF"},
		{"eof before crlf", "VA 2\r\nhi", 0, ErrProtocol, "reading the \\r\\n after a value"},
		{"eof mid line", "VA 2 t", 0, ErrProtocol, "cut short"},
		{"bare lf", "HD\n", 0, ErrProtocol, "not ended by \\r\\n"},
		{"unknown status", "OK\r\n", 0, ErrProtocol, "unknown reply status \"OK\""},
		{"garbage", "\x00\x01garbage\r\n", 0, ErrProtocol, "unknown reply status"},
		{"classic reply", "STORED\r\n", 0, ErrProtocol, "unknown reply status \"STORED\""},
		{"garbled ttl", "HD tabc\r\n", 0, ErrProtocol, "garbled number in return flag \"tabc\""},
		{"ttl below -1", "HD t-2\r\n", 0, ErrProtocol, "garbled number in return flag \"t-2\""},
		{"garbled flags", "HD f4294967296\r\n", 0, ErrProtocol, "garbled number in return flag \"f4294967296\""},
		{"garbled cas", "HD c18446744073709551616\r\n", 0, ErrProtocol, "garbled number in return flag"},
		{"empty opaque", "HD O\r\n", 0, ErrProtocol, "garbled number in return flag \"O\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseOne(t, tt.in, tt.max)
			require.Error(t, err)
			if tt.is != nil {
				require.ErrorIs(t, err, tt.is)
			}
			require.ErrorContains(t, err, tt.contains)
		})
	}
	t.Run("typed server errors", func(t *testing.T) {
		_, err := parseOne(t, "SERVER_ERROR out of memory\r\n", 0)
		var se *ServerError
		require.ErrorAs(t, err, &se)
		require.Equal(t, "out of memory", se.Msg)
		_, err = parseOne(t, "CLIENT_ERROR bad data chunk\r\n", 0)
		var ce *ClientError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "bad data chunk", ce.Msg)
		require.NotErrorIs(t, err, ErrProtocol)
	})
}

// A stream of replies, read one after another from one reader.
func TestReadReplyStream(t *testing.T) {
	in := "VA 2 f1\r\nhi\r\nEN\r\nSERVER_ERROR oom\r\nHD c5\r\nMN\r\n"
	br := bufio.NewReader(strings.NewReader(in))
	var rep Reply
	want := []Status{StatusVA, StatusEN, StatusNone, StatusHD, StatusMN}
	for i, w := range want {
		err := ReadReply(br, &rep, 0)
		if w == StatusNone {
			require.Error(t, err, "reply %d", i)
			continue
		}
		require.NoError(t, err, "reply %d", i)
		require.Equal(t, w, rep.Status, "reply %d", i)
	}
}

func TestReadReplyAllocs(t *testing.T) {
	in := []byte("VA 5 t90 f5 c1 s5 kfoo O3 W\r\nhello\r\nHD c7\r\nEN\r\n")
	r := bytes.NewReader(in)
	br := bufio.NewReaderSize(r, MaxLineLen)
	var rep Reply
	rep.Value = make([]byte, 0, 16)
	rep.Key = make([]byte, 0, 16)
	n := testing.AllocsPerRun(100, func() {
		r.Reset(in)
		br.Reset(r)
		for range 3 {
			if err := ReadReply(br, &rep, 0); err != nil {
				t.Fatal(err)
			}
		}
	})
	require.Zero(t, n, "reusing Value and Key")
}

// appendReply encodes rep as a server would: the inverse of ReadReply.
func appendReply(dst []byte, rep *Reply) []byte {
	dst = append(dst, rep.Status.String()...)
	if rep.Status == StatusVA {
		dst = append(dst, ' ')
		dst = appendDec(dst, uint64(len(rep.Value)))
	}
	if rep.Has&RetTTL != 0 {
		if rep.TTL == -1 {
			dst = append(dst, " t-1"...)
		} else {
			dst = appendDec(append(dst, " t"...), uint64(rep.TTL))
		}
	}
	if rep.Has&RetFlags != 0 {
		dst = appendDec(append(dst, " f"...), uint64(rep.ClientFlags))
	}
	if rep.Has&RetCAS != 0 {
		dst = appendDec(append(dst, " c"...), rep.CAS)
	}
	if rep.Has&RetSize != 0 {
		dst = appendDec(append(dst, " s"...), uint64(rep.Size))
	}
	if rep.Has&RetKey != 0 {
		dst = append(append(dst, " k"...), rep.Key...)
	}
	if rep.Has&RetOpaque != 0 {
		dst = appendDec(append(dst, " O"...), uint64(rep.Opaque))
	}
	if rep.Has&RetWon != 0 {
		dst = append(dst, " W"...)
	}
	if rep.Has&RetStale != 0 {
		dst = append(dst, " X"...)
	}
	if rep.Has&RetAlreadyWon != 0 {
		dst = append(dst, " Z"...)
	}
	dst = append(dst, "\r\n"...)
	if rep.Status == StatusVA {
		dst = append(append(dst, rep.Value...), "\r\n"...)
	}
	return dst
}

func appendDec(dst []byte, v uint64) []byte { return strconv.AppendUint(dst, v, 10) }
