package selector

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubecache/k8s-memcache-selector/internal/dns"
	"github.com/kubecache/k8s-memcache-selector/internal/dns/dnstest"
)

// These tests run discovery by DNS against servers that fail or lie (see
// dns_test.go for the fake): the start, the errors' messages, and hostile
// answers.

// TestDNSStart shows NewServerList's start: an answer without servers is a
// start with none, its reason in Stats; WithWaitForServers waits for one;
// a DNS server that never answers fails it when its ctx ends, saying why.
func TestDNSStart(t *testing.T) {
	f := newFakeDNS(t) // NXDOMAIN
	ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 0))
	require.NoError(t, err)
	assert.Empty(t, ss.Servers())
	assert.ErrorIs(t, ss.Stats().LastError, dns.ErrNotFound)
	assert.ErrorContains(t, ss.Stats().LastError, "clusterIP: None")
	f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
	eventually(t, "the first server", func() bool { return len(ss.Servers()) == 1 })

	f.reply(dnstest.Reply{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = NewServerList(ctx, "dnssrv+"+dnsSRV, fastDNS(f, 0), WithWaitForServers(), quietLog)
	assert.ErrorContains(t, err, "DNS has no server for dnssrv+"+dnsSRV+" (WithWaitForServers)")

	f.reply(dnstest.Reply{Drop: true})
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = NewServerList(ctx, "dns+"+dnsSvc+":11211", WithDNS(DNS{Server: f.Addr(), Timeout: 20 * time.Millisecond}), quietLog)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "did not answer in time")
}

// TestDNSErrorsNameTheFix shows the message of each answer without
// servers.
func TestDNSErrorsNameTheFix(t *testing.T) {
	tests := []struct {
		name, addr string
		reply      dnstest.Reply
		want       string
	}{
		{"NXDOMAIN of an SRV name", "dnssrv+" + dnsSRV, dnstest.Reply{RCode: dns.RCodeNXDomain}, "has a port named as the address's first label"},
		{"NXDOMAIN of a name", "dns+" + dnsSvc + ":11211", dnstest.Reply{RCode: dns.RCodeNXDomain}, "that it is headless (clusterIP: None)"},
		{"no SRV records", "dnssrv+" + dnsSRV, dnstest.Reply{}, "no SRV records for " + dnsSRV + ": check that the Service has a port named memcache with protocol TCP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeDNS(t)
			f.reply(tt.reply)
			var logs strings.Builder
			var mu sync.Mutex
			ss, err := startDNSList(t, tt.addr, fastDNS(f, 0), WithLogger(lineLogger(func(s string) { mu.Lock(); logs.WriteString(s + "\n"); mu.Unlock() })))
			require.NoError(t, err)
			assert.Empty(t, ss.Servers())
			mu.Lock()
			defer mu.Unlock()
			assert.Contains(t, logs.String(), tt.want)
		})
	}
}

// lineLogger is a Logger that hands each line to f.
type lineLogger func(string)

func (l lineLogger) Errorf(f string, a ...any) { l(fmt.Sprintf(f, a...)) }
func (l lineLogger) Infof(f string, a ...any)  { l(fmt.Sprintf(f, a...)) }

// TestDNSHostile shows answers that a broken or hostile server sends:
// truncated ones are asked again over TCP, thousands of records are
// bounded by the message, targets that are not hostnames are skipped, and
// a huge TTL delays the next lookup only up to the cap.
func TestDNSHostile(t *testing.T) {
	t.Run("truncated, then over TCP", func(t *testing.T) {
		f := newFakeDNS(t)
		f.pods(map[string]string{"memcache-0": "10.0.0.1"}, 11211)
		good := f.answer
		f.set(func(q dns.Question, tcp bool) dnstest.Reply { r := good(q, tcp); r.Truncate = true; return r })
		ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 0))
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.1:11211"}, addrs(ss))
		assert.Positive(t, f.TCP.Load())
	})
	t.Run("two thousand records", func(t *testing.T) {
		f := newFakeDNS(t)
		var rs []dns.Record
		for i := range 2000 {
			rs = append(rs, aRecord(dnsSvc, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), 5))
		}
		f.reply(dnstest.Reply{Answers: rs, Truncate: true})
		// A query's timeout of 2 s, not fastDNS's 100 ms: the answer over
		// TCP is 2,000 records, which -race on a loaded machine took
		// longer than 100 ms to read and parse, every try for 15 s.
		ss, err := startDNSList(t, "dns+"+dnsSvc+":11211", WithDNS(DNS{Server: f.Addr(), Interval: 10 * time.Millisecond, Timeout: 2 * time.Second}))
		require.NoError(t, err)
		assert.Len(t, ss.Servers(), 2000)
	})
	t.Run("targets that are not hostnames", func(t *testing.T) {
		f := newFakeDNS(t)
		bad := "bad name." + dnsSvc
		f.reply(dnstest.Reply{
			Answers: []dns.Record{
				{Name: dnsSRV, Type: dns.TypeSRV, Port: 11211, Target: "memcache-0." + dnsSvc},
				{Name: dnsSRV, Type: dns.TypeSRV, Port: 11211, Target: bad},
				{Name: dnsSRV, Type: dns.TypeSRV, Port: 11211, Target: "memcache-9." + dnsSvc}, // no address
			},
			Additional: []dns.Record{aRecord("memcache-0."+dnsSvc, "10.0.0.1", 5), aRecord(bad, "10.0.0.2", 5)},
		})
		var logs strings.Builder
		var mu sync.Mutex
		ss, err := startDNSList(t, "dnssrv+"+dnsSRV, fastDNS(f, 0), WithLogger(lineLogger(func(s string) { mu.Lock(); logs.WriteString(s + "\n"); mu.Unlock() })))
		require.NoError(t, err)
		assert.Equal(t, []string{"10.0.0.1:11211"}, addrs(ss))
		mu.Lock()
		defer mu.Unlock()
		assert.Contains(t, logs.String(), `032name.`+dnsSvc)
		assert.Contains(t, logs.String(), `is not a hostname`)
		assert.Contains(t, logs.String(), "memcache-9."+dnsSvc+" has no address")
	})
	t.Run("a huge TTL", func(t *testing.T) {
		f := newFakeDNS(t)
		f.reply(dnstest.Reply{Answers: []dns.Record{aRecord(dnsSvc, "10.0.0.1", 1<<31-1)}})
		ss, err := startDNSList(t, "dns+"+dnsSvc+":11211", fastDNS(f, 0), withDNSTTLCap(50*time.Millisecond))
		require.NoError(t, err)
		asked := f.UDP.Load()
		eventually(t, "a lookup after the capped TTL", func() bool { return f.UDP.Load() > asked })
		assert.Len(t, ss.Servers(), 1)
	})
	t.Run("a TTL longer than the interval is a floor", func(t *testing.T) {
		f := newFakeDNS(t)
		f.reply(dnstest.Reply{Answers: []dns.Record{aRecord(dnsSvc, "10.0.0.1", 1)}})
		_, err := startDNSList(t, "dns+"+dnsSvc+":11211", fastDNS(f, 0), withDNSTTLCap(time.Minute))
		require.NoError(t, err)
		asked := f.UDP.Load()
		time.Sleep(300 * time.Millisecond) // 30 intervals, less than the TTL
		assert.Equal(t, asked, f.UDP.Load())
	})
}
