package dns

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// msg builds a message by hand: a response header with the given counts,
// then the bytes of its sections as given, so that a test can say any lie.
func msg(qd, an, ns, ar int, body ...[]byte) []byte {
	b := []byte{0x12, 0x34, 0x81, 0x80, 0, byte(qd), byte(an >> 8), byte(an), 0, byte(ns), byte(ar >> 8), byte(ar)}
	for _, p := range body {
		b = append(b, p...)
	}
	return b
}

// wire returns name uncompressed.
func wire(name string) []byte {
	var b []byte
	for l := range strings.SplitSeq(name, ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

// rr returns a record's type, class IN, ttl and data, after its name.
func rr(t Type, ttl uint32, data ...byte) []byte {
	b := []byte{byte(t >> 8), byte(t), 0, 1, byte(ttl >> 24), byte(ttl >> 16), byte(ttl >> 8), byte(ttl), byte(len(data) >> 8), byte(len(data))}
	return append(b, data...)
}

// question is "memcache.default.svc" A: 22 bytes at offset 12.
var question = append(wire("memcache.default.svc"), 0, 1, 0, 1)

func TestParse(t *testing.T) {
	srvData := append([]byte{0, 10, 0, 5, 0x2b, 0xcb}, wire("memcache-0.memcache")...)
	tests := []struct {
		name    string
		in      []byte
		want    []Record // the answers
		wantErr string   // in the error, which wraps ErrMalformed
	}{
		{
			name: "an A record named by a pointer to the question",
			in:   msg(1, 1, 0, 0, question, []byte{0xc0, 12}, rr(TypeA, 30, 10, 0, 0, 1)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeA, TTL: 30, Addr: netip.MustParseAddr("10.0.0.1")}},
		},
		{
			name: "an AAAA record",
			in:   msg(1, 1, 0, 0, question, []byte{0xc0, 12}, rr(TypeAAAA, 5, []byte{0xfd, 15: 1}...)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeAAAA, TTL: 5, Addr: netip.MustParseAddr("fd00::1")}},
		},
		{
			name: "an SRV record with its priority, weight, port and target",
			in:   msg(1, 1, 0, 0, question, []byte{0xc0, 12}, rr(TypeSRV, 5, srvData...)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeSRV, TTL: 5, Priority: 10, Weight: 5, Port: 11211, Target: "memcache-0.memcache"}},
		},
		{
			name: "a TTL with the high bit set is zero",
			in:   msg(1, 1, 0, 0, question, []byte{0xc0, 12}, rr(TypeA, 0x80000000, 10, 0, 0, 1)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeA, TTL: 0, Addr: netip.MustParseAddr("10.0.0.1")}},
		},
		{
			name: "the largest TTL is kept",
			in:   msg(1, 1, 0, 0, question, []byte{0xc0, 12}, rr(TypeA, 0x7fffffff, 10, 0, 0, 1)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeA, TTL: 0x7fffffff, Addr: netip.MustParseAddr("10.0.0.1")}},
		},
		{
			name: "upper case and bytes that are not a hostname's are written so",
			in:   msg(0, 1, 0, 0, []byte{5, 'M', 'e', '.', ' ', 0xff, 0}, rr(TypeA, 1, 1, 2, 3, 4)),
			want: []Record{{Name: `me\.\032\255`, Type: TypeA, TTL: 1, Addr: netip.MustParseAddr("1.2.3.4")}},
		},
		{
			name: "a record of another type is skipped",
			in:   msg(1, 2, 0, 0, question, []byte{0xc0, 12}, rr(16, 1, 3, 'a', 'b', 'c'), []byte{0xc0, 12}, rr(TypeA, 1, 1, 2, 3, 4)),
			want: []Record{{Name: "memcache.default.svc", Type: TypeA, TTL: 1, Addr: netip.MustParseAddr("1.2.3.4")}},
		},
		{name: "a short header", in: []byte{1, 2, 3}, wantErr: "shorter than a DNS header"},
		{name: "two questions", in: msg(2, 0, 0, 0, question, question), wantErr: "2 questions"},
		{name: "a question cut off", in: msg(1, 0, 0, 0, question[:len(question)-2]), wantErr: "the question ends"},
		{
			name:    "a pointer to itself",
			in:      msg(0, 1, 0, 0, []byte{0xc0, 12}, rr(TypeA, 1, 1, 2, 3, 4)),
			wantErr: "points forward",
		},
		{
			name:    "a loop of two pointers",
			in:      msg(0, 1, 0, 0, []byte{1, 'a', 0xc0, 16, 0xc0, 12}, rr(TypeA, 1, 1, 2, 3, 4)),
			wantErr: "points forward",
		},
		{
			name:    "a label that runs past the end",
			in:      msg(0, 1, 0, 0, []byte{40, 'a', 'b', 11: 0}),
			wantErr: "runs past the end",
		},
		{
			name:    "a name longer than 255 octets, by pointers",
			in:      longName(),
			wantErr: "longer than the 255 octets",
		},
		{
			name:    "a reserved label type",
			in:      msg(0, 1, 0, 0, []byte{0x41, 'a', 0}, rr(TypeA, 1, 1, 2, 3, 4)),
			wantErr: "reserved type bits",
		},
		{
			name:    "an A record of 5 bytes",
			in:      msg(0, 1, 0, 0, wire("a"), rr(TypeA, 1, 1, 2, 3, 4, 5)),
			wantErr: "5 bytes of data, not 4",
		},
		{
			name:    "record data past the end",
			in:      msg(0, 1, 0, 0, wire("a"), rr(TypeA, 1, 1, 2, 3, 4)[:12]),
			wantErr: "past the message",
		},
		{
			name:    "an SRV target that ends before its data",
			in:      msg(0, 1, 0, 0, wire("a"), rr(TypeSRV, 1, append(append([]byte{}, srvData...), 0)...)),
			wantErr: "its target ends at byte",
		},
		{
			name:    "more records claimed than the bytes hold",
			in:      msg(0, 60000, 0, 0, wire("a"), rr(TypeA, 1, 1, 2, 3, 4)),
			wantErr: "more than the 4096",
		},
		{
			name:    "a count that the bytes cannot hold",
			in:      msg(0, 3, 0, 0, wire("a"), rr(TypeA, 1, 1, 2, 3, 4)),
			wantErr: "claims 3 records",
		},
		{
			name:    "a message larger than TCP can frame",
			in:      make([]byte, MaxMessage+1),
			wantErr: "more than the 65535",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.True(t, errors.Is(err, ErrMalformed), "%v does not wrap ErrMalformed", err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, m.Answers)
		})
	}
}

// longName returns a message whose second answer is named by a pointer to
// 5 labels of 60 bytes, each label but the first followed by a pointer to
// the one before: 305 octets once followed. The labels are the data of a
// first record, of a type that is skipped.
func longName() []byte {
	const base = 12 + 1 + rrFixed // the first record's data: after the root name and fixed part
	l := append([]byte{60}, strings.Repeat("x", 60)...)
	data := append(append([]byte{}, l...), 0)
	prev := base
	for range 4 {
		at := base + len(data)
		data = append(data, l...)
		data = append(data, 0xc0|byte(prev>>8), byte(prev))
		prev = at
	}
	return msg(0, 2, 0, 0, []byte{0}, rr(16, 1, data...), []byte{0xc0 | byte(prev>>8), byte(prev)}, rr(TypeA, 1, 1, 2, 3, 4))
}

func TestQuery(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{name: "a service name", in: "memcache.default.svc.cluster.local"},
		{name: "an SRV name", in: "_memcache._tcp.memcache.default.svc.cluster.local."},
		{name: "an empty label", in: "a..b", wantErr: "empty label"},
		{name: "a label too long", in: strings.Repeat("a", 64) + ".b", wantErr: "more than 63"},
		{name: "a name too long", in: strings.Repeat("abcdefghi.", 26), wantErr: "more than the 253"},
		{name: "a space", in: "a b.c", wantErr: "other than letters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := Query(7, tt.in, TypeSRV)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			m, err := Parse(q)
			require.NoError(t, err)
			assert.Equal(t, Question{Name: strings.TrimSuffix(tt.in, "."), Type: TypeSRV}, m.Question)
			assert.Equal(t, uint16(7), m.ID)
			assert.False(t, m.Response)
		})
	}
}

func TestIsHostname(t *testing.T) {
	tests := []struct {
		name, in string
		want     bool
	}{
		{"a pod's name", "memcache-0.memcache.default.svc.cluster.local", true},
		{"one label", "localhost", true},
		{"an escaped byte", `me\032mo`, false},
		{"an underscore", "_memcache._tcp.x", false},
		{"a leading hyphen", "-a.b", false},
		{"empty", "", false},
		{"an empty label", "a..b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, IsHostname(tt.in), "IsHostname(%q)", tt.in)
		})
	}
}
