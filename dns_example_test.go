package selector_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/internal/dns"
	"github.com/kubecache/k8s-memcache-selector/internal/dns/dnstest"
)

// ExampleWithDNS discovers the pods of a StatefulSet by the SRV records of
// its headless Service, without access to the Kubernetes API. Here a DNS
// server in this process stands in for the cluster DNS; in a pod, leave
// DNS.Server out and the pod's own resolver is asked.
func ExampleWithDNS() {
	const name = "_memcache._tcp.memcache.cache.svc.cluster.local"
	srv, err := dnstest.Start(func(q dns.Question, tcp bool) dnstest.Reply {
		var r dnstest.Reply
		for i, ip := range []string{"10.244.0.5", "10.244.0.6"} {
			pod := fmt.Sprintf("memcache-%d.memcache.cache.svc.cluster.local", i)
			r.Answers = append(r.Answers, dns.Record{Name: name, Type: dns.TypeSRV, TTL: 5, Port: 11211, Target: pod})
			r.Additional = append(r.Additional, dns.Record{Name: pod, Type: dns.TypeA, TTL: 5, Addr: netip.MustParseAddr(ip)})
		}
		return r
	})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ss, err := selector.NewServerList(ctx, "dnssrv+"+name,
		selector.WithDNS(selector.DNS{Server: srv.Addr(), Interval: 5 * time.Second}),
		selector.WithSlog(slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Fatal(err)
	}
	defer ss.Close()
	fmt.Println(ss.Servers())
	// Output: [10.244.0.5:11211 10.244.0.6:11211]
}
