package dns_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/dns"
	"github.com/kubecache/k8s-memcache-selector/internal/dns/dnstest"
)

// These tests run Client against dnstest's server on 127.0.0.1: no query
// leaves the machine.

const svc = "memcache.cache.svc.cluster.local"

func a(name, ip string, ttl uint32) dns.Record {
	ad := netip.MustParseAddr(ip)
	t := dns.TypeA
	if ad.Is6() {
		t = dns.TypeAAAA
	}
	return dns.Record{Name: name, Type: t, TTL: ttl, Addr: ad}
}

func srv(name, target string, port uint16) dns.Record {
	return dns.Record{Name: name, Type: dns.TypeSRV, TTL: 5, Weight: 1, Port: port, Target: target}
}

// manyA returns n A records of name.
func manyA(name string, n int) []dns.Record {
	rs := make([]dns.Record, n)
	for i := range rs {
		rs[i] = a(name, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), 5)
	}
	return rs
}

func TestLookup(t *testing.T) {
	srvName := "_memcache._tcp." + svc
	pod := "memcache-0.memcache.cache.svc.cluster.local"
	tests := []struct {
		name     string
		ask      string
		typ      dns.Type
		reply    func(q dns.Question) dnstest.Reply
		client   dns.Client // Server is set by the test
		want     []dns.Record
		wantName string
		wantTTL  uint32
		wantAdd  int
		wantErr  error
		wantText string
		wantTCP  bool
	}{
		{
			name: "A records and their least TTL",
			ask:  svc, typ: dns.TypeA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Answers: []dns.Record{a(svc, "10.0.0.1", 30), a(svc, "10.0.0.2", 5)}}
			},
			want:     []dns.Record{a(svc, "10.0.0.1", 30), a(svc, "10.0.0.2", 5)},
			wantName: svc, wantTTL: 5,
		},
		{
			name: "SRV records with their targets' addresses in the additional section",
			ask:  srvName, typ: dns.TypeSRV,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Answers: []dns.Record{srv(srvName, pod, 11211)}, Additional: []dns.Record{a(pod, "10.0.0.7", 5)}}
			},
			want:     []dns.Record{srv(srvName, pod, 11211)},
			wantName: srvName, wantTTL: 5, wantAdd: 1,
		},
		{
			name: "a truncated answer is asked again over TCP",
			ask:  svc, typ: dns.TypeA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Truncate: true, Answers: []dns.Record{a(svc, "10.0.0.1", 5)}}
			},
			want:     []dns.Record{a(svc, "10.0.0.1", 5)},
			wantName: svc, wantTTL: 5, wantTCP: true,
		},
		{
			name: "thousands of records, over TCP",
			ask:  svc, typ: dns.TypeA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Truncate: true, Answers: manyA(svc, 3000)}
			},
			want:     manyA(svc, 3000),
			wantName: svc, wantTTL: 5, wantTCP: true,
		},
		{
			name: "a CNAME chain is followed, its TTL counted",
			ask:  "alias.example", typ: dns.TypeA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Answers: []dns.Record{
					{Name: "alias.example", Type: dns.TypeCNAME, TTL: 2, Target: svc}, a(svc, "10.0.0.1", 30)}}
			},
			want:     []dns.Record{a(svc, "10.0.0.1", 30)},
			wantName: "alias.example", wantTTL: 2,
		},
		{
			name: "the search list, NXDOMAIN moving on to the next name",
			ask:  "memcache", typ: dns.TypeA,
			client: dns.Client{Search: []string{"default.svc.cluster.local", "cache.svc.cluster.local"}, Ndots: 5},
			reply: func(q dns.Question) dnstest.Reply {
				if q.Name != svc {
					return dnstest.Reply{RCode: dns.RCodeNXDomain}
				}
				return dnstest.Reply{Answers: []dns.Record{a(svc, "10.0.0.1", 5)}}
			},
			want:     []dns.Record{a(svc, "10.0.0.1", 5)},
			wantName: svc, wantTTL: 5,
		},
		{
			name: "a name without records of the type",
			ask:  svc, typ: dns.TypeAAAA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{}
			},
			wantName: svc,
		},
		{
			name: "NXDOMAIN",
			ask:  svc, typ: dns.TypeA,
			reply:    func(q dns.Question) dnstest.Reply { return dnstest.Reply{RCode: dns.RCodeNXDomain} },
			wantErr:  dns.ErrNotFound,
			wantText: "lookup A " + svc + " at 127.0.0.1:",
		},
		{
			name: "SERVFAIL",
			ask:  svc, typ: dns.TypeA,
			reply:   func(q dns.Question) dnstest.Reply { return dnstest.Reply{RCode: dns.RCodeServFail} },
			wantErr: dns.ErrServerFailure,
		},
		{
			name: "REFUSED",
			ask:  svc, typ: dns.TypeA,
			reply:   func(q dns.Question) dnstest.Reply { return dnstest.Reply{RCode: dns.RCodeRefused} },
			wantErr: dns.ErrRefused,
		},
		{
			name: "no answer",
			ask:  svc, typ: dns.TypeA,
			client:  dns.Client{Timeout: 50 * time.Millisecond},
			reply:   func(q dns.Question) dnstest.Reply { return dnstest.Reply{Drop: true} },
			wantErr: dns.ErrTimeout, wantText: "2 tries of 50ms",
		},
		{
			name: "garbage datagrams are dropped, and named in the timeout",
			ask:  svc, typ: dns.TypeA,
			client: dns.Client{Timeout: 50 * time.Millisecond, Tries: 1},
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Raw: []byte{0, 0, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12}}
			},
			wantErr: dns.ErrTimeout, wantText: "points forward",
		},
		{
			name: "an answer to another question is dropped",
			ask:  svc, typ: dns.TypeA,
			client: dns.Client{Timeout: 50 * time.Millisecond, Tries: 1},
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Raw: dnstest.Pack(0, dns.Question{Name: "evil.example", Type: dns.TypeA}, dnstest.Reply{Answers: []dns.Record{a("evil.example", "192.0.2.1", 5)}}, false)}
			},
			wantErr: dns.ErrTimeout, wantText: "not to A " + svc,
		},
		{
			name: "a CNAME loop",
			ask:  "a.example", typ: dns.TypeA,
			reply: func(q dns.Question) dnstest.Reply {
				return dnstest.Reply{Answers: []dns.Record{
					{Name: "a.example", Type: dns.TypeCNAME, Target: "b.example"}, {Name: "b.example", Type: dns.TypeCNAME, Target: "a.example"}}}
			},
			wantErr: dns.ErrMalformed, wantText: "more than 8 CNAMEs",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := dnstest.New(t, func(q dns.Question, tcp bool) dnstest.Reply { return tt.reply(q) })
			c := tt.client
			c.Server = s.Addr()
			start := time.Now()
			got, err := c.Lookup(context.Background(), tt.ask, tt.typ)
			if tt.wantErr != nil {
				require.Error(t, err)
				assert.True(t, errors.Is(err, tt.wantErr), "Lookup: %v, want %v", err, tt.wantErr)
				var de *dns.Error
				assert.True(t, errors.As(err, &de), "Lookup: %v is not a *dns.Error", err)
				assert.Contains(t, err.Error(), tt.wantText)
				assert.Less(t, time.Since(start), 2*time.Second, "a failed lookup must end within its timeouts")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Records)
			assert.Equal(t, tt.wantName, got.Name)
			assert.Equal(t, tt.wantTTL, got.TTL)
			assert.Len(t, got.Additional, tt.wantAdd)
			assert.Equal(t, tt.wantTCP, s.TCP.Load() > 0, "asked over TCP")
		})
	}
}

// TestLookupContext shows that a lookup ends with its context, whatever
// the timeouts.
func TestLookupContext(t *testing.T) {
	s := dnstest.New(t, func(q dns.Question, tcp bool) dnstest.Reply { return dnstest.Reply{Drop: true} })
	c := dns.Client{Server: s.Addr(), Timeout: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Lookup(ctx, svc, dns.TypeA)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestTCPTimeout shows a server that truncates over UDP and never answers
// over TCP: a timeout, within the Client's.
func TestTCPTimeout(t *testing.T) {
	s := dnstest.New(t, func(q dns.Question, tcp bool) dnstest.Reply {
		return dnstest.Reply{Truncate: true, Drop: tcp}
	})
	c := dns.Client{Server: s.Addr(), Timeout: 50 * time.Millisecond}
	_, err := c.Lookup(context.Background(), svc, dns.TypeA)
	assert.ErrorIs(t, err, dns.ErrTimeout)
	assert.ErrorContains(t, err, "truncated, and TCP failed")
}
