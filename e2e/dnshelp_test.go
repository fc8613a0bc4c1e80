package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// Helpers of the tests of discovery by DNS (dns_test.go): the addresses of
// the example Service in CoreDNS, and Clients and ServerLists that discover
// it by DNS.

// dnsInterval is the DNS clients' poll interval here: a tenth of the
// default, so that the tests wait for changes less; CoreDNS answers with
// TTL 0, so the interval alone paces the polls.
const dnsInterval = 500 * time.Millisecond

// dnsWait bounds the wait for a change to reach a DNS client: the
// EndpointSlice controller (up to a second's backoff), CoreDNS's watch,
// then a poll.
const dnsWait = 20 * time.Second

// srvAddress is the SRV address of the example Service's port "memcache"
// in namespace ns; aAddress its A records with the port.
func srvAddress(ns string) string {
	return "dnssrv+_memcache._tcp." + serviceName + "." + ns + ".svc.cluster.local"
}

func aAddress(ns string) string {
	return "dns+" + serviceName + "." + ns + ".svc.cluster.local:11211"
}

// followed is a discovery's servers as WithOnChange reports them.
type followed struct {
	mu      sync.Mutex
	cur     []string
	changed chan struct{}
}

func newFollowed() *followed { return &followed{changed: make(chan struct{}, 1)} }

// option is the WithOnChange that feeds f.
func (f *followed) option() selector.Option {
	return selector.WithOnChange(func(servers []net.Addr) {
		s := make([]string, len(servers))
		for i, a := range servers {
			s[i] = a.String()
		}
		slices.Sort(s)
		f.mu.Lock()
		f.cur = s
		f.mu.Unlock()
		select {
		case f.changed <- struct{}{}:
		default:
		}
	})
}

func (f *followed) servers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

// await waits until the servers are exactly want and returns the time since
// start.
func (f *followed) await(want []string, start time.Time, timeout time.Duration) (time.Duration, error) {
	want = sorted(want)
	deadline := time.NewTimer(time.Until(start.Add(timeout)))
	defer deadline.Stop()
	for {
		got := f.servers()
		if slices.Equal(got, want) {
			return time.Since(start), nil
		}
		select {
		case <-f.changed:
		case <-deadline.C:
			return 0, fmt.Errorf("servers after %v: got %d %v, want %d %v", timeout, len(got), got, len(want), want)
		}
	}
}

func (f *followed) wait(t *testing.T, want []string, timeout time.Duration) time.Duration {
	t.Helper()
	d, err := f.await(want, time.Now(), timeout)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// dnsClient is a selector.Client made by NewClient for a DNS address, and
// its servers as its discovery reports them.
type dnsClient struct {
	*selector.Client
	*followed
	log *testLogger
}

// awaitRouting waits until the Client's discovery has exactly want, and
// then the Client itself routes to them: each up in its Stats, and no other
// member. OnChange is the ServerList's: the Client applies a change a moment
// later, and probes a server that returns before it uses it, so a request
// sent at OnChange may still find no server. It returns the time from start
// to OnChange.
func (c *dnsClient) awaitRouting(want []string, start time.Time, timeout time.Duration) (time.Duration, error) {
	d, err := c.await(want, start, timeout)
	if err != nil {
		return 0, err
	}
	want = sorted(want)
	for end := start.Add(timeout); ; time.Sleep(2 * time.Millisecond) {
		var up, other []string
		for _, s := range c.Stats().Servers {
			switch s.State {
			case "up":
				up = append(up, s.Addr)
			case "gone":
			default:
				other = append(other, s.Addr+" "+string(s.State))
			}
		}
		if slices.Equal(sorted(up), want) && len(other) == 0 {
			return d, nil
		}
		if time.Now().After(end) {
			return 0, fmt.Errorf("the Client after %v: up %v, others %v; want up %v", timeout, up, other, want)
		}
	}
}

func (c *dnsClient) waitRouting(t *testing.T, want []string, timeout time.Duration) time.Duration {
	t.Helper()
	d, err := c.awaitRouting(want, time.Now(), timeout)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// newDNSClient runs selector.NewClient for addr, asking the DNS server
// dnsServer every dnsInterval, with the Client scenarios' settings
// (clienthelp_test.go); Close runs when the test ends.
func (e *env) newDNSClient(addr, dnsServer string, opts ...selector.Option) *dnsClient {
	e.t.Helper()
	c := &dnsClient{followed: newFollowed(), log: newTestLogger(e.t)}
	all := append([]selector.Option{
		selector.WithDNS(selector.DNS{Server: dnsServer, Interval: dnsInterval}),
		selector.WithLogger(c.log),
		c.option(),
		selector.WithTimeout(cTimeout),
		selector.WithMaxIdleConns(cMaxIdle),
		selector.WithFailover(cFailover),
	}, opts...)
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	cl, err := selector.NewClient(ctx, addr, all...)
	if err != nil {
		e.t.Fatalf("NewClient(%q): %v", addr, err)
	}
	c.Client = cl
	e.t.Cleanup(func() { cl.Close() })
	return c
}

// newDNSLib runs selector.NewServerList for addr, asking dnsServer every
// dnsInterval; Close runs when the test ends.
func (e *env) newDNSLib(addr, dnsServer string) *lib {
	e.t.Helper()
	l := &lib{changed: make(chan struct{}, 1), log: newTestLogger(e.t)}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, addr,
		selector.WithDNS(selector.DNS{Server: dnsServer, Interval: dnsInterval}),
		selector.WithLogger(l.log),
		selector.WithOnChange(func([]net.Addr) {
			select {
			case l.changed <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		e.t.Fatalf("NewServerList(%q): %v", addr, err)
	}
	l.ServerList = ss
	e.t.Cleanup(func() { ss.Close() })
	return l
}
