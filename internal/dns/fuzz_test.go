package dns_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubecache/k8s-memcache-selector/internal/dns"
	"github.com/kubecache/k8s-memcache-selector/internal/dns/dnstest"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, every
// error must wrap ErrMalformed, and what it accepts must be within the
// bounds: no more records than the bytes can hold, names no longer than a
// domain name can be written, TTLs below 2^31, addresses of their type.
func FuzzParse(f *testing.F) {
	q := dns.Question{Name: "_memcache._tcp.memcache.default.svc.cluster.local", Type: dns.TypeSRV}
	srv := dns.Record{Name: q.Name, Type: dns.TypeSRV, TTL: 5, Priority: 0, Weight: 10, Port: 11211, Target: "memcache-0.memcache.default.svc.cluster.local"}
	a := dns.Record{Name: srv.Target, Type: dns.TypeA, TTL: 5, Addr: netip.MustParseAddr("10.244.0.5")}
	aaaa := dns.Record{Name: srv.Target, Type: dns.TypeAAAA, TTL: 1 << 31, Addr: netip.MustParseAddr("fd00::5")}
	cname := dns.Record{Name: "alias.example", Type: dns.TypeCNAME, TTL: 60, Target: "memcache.example"}
	for _, r := range []dnstest.Reply{
		{Answers: []dns.Record{srv}, Additional: []dns.Record{a, aaaa}},
		{Answers: []dns.Record{cname, a}},
		{RCode: dns.RCodeNXDomain},
		{RCode: dns.RCodeServFail},
	} {
		f.Add(dnstest.Pack(0x1234, q, r, false))
	}
	f.Add(dnstest.Pack(1, q, dnstest.Reply{}, true))
	query, _ := dns.Query(9, q.Name, dns.TypeA)
	f.Add(query)
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0x81, 0x80, 0, 0, 0, 1, 0, 0, 0, 0, 0xc0, 12})

	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := dns.Parse(b)
		if err != nil {
			if !errors.Is(err, dns.ErrMalformed) {
				t.Fatalf("Parse: %v does not wrap ErrMalformed", err)
			}
			return
		}
		if n := len(m.Answers) + len(m.Additional); n*11 > len(b) {
			t.Fatalf("%d records from %d bytes", n, len(b))
		}
		for _, r := range append(m.Answers, m.Additional...) {
			// 253 octets of name, each written as at most 4 characters.
			if len(r.Name) > 4*253 || len(r.Target) > 4*253 {
				t.Fatalf("a name of %d characters: %q", len(r.Name), r.Name)
			}
			if r.Name != strings.ToLower(r.Name) {
				t.Fatalf("name %q is not in lower case", r.Name)
			}
			if r.TTL >= 1<<31 {
				t.Fatalf("TTL %d", r.TTL)
			}
			switch r.Type {
			case dns.TypeA:
				if !r.Addr.Is4() {
					t.Fatalf("A record with %v", r.Addr)
				}
			case dns.TypeAAAA:
				if !r.Addr.Is6() {
					t.Fatalf("AAAA record with %v", r.Addr)
				}
			case dns.TypeSRV, dns.TypeCNAME:
			default:
				t.Fatalf("a record of type %v kept", r.Type)
			}
		}
	})
}
