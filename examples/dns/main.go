// Command dns finds memcached servers by DNS, without access to the
// Kubernetes API: the SRV records of a headless Service (a StatefulSet's
// pods, each under its hostname), or the A records of any name. It stores
// one key, reads it back, and then prints the servers each time DNS
// changes them, until interrupted.
//
// In a pod (no Role needed), against the StatefulSet of
// ../kubernetes/statefulset.yaml:
//
//	go run ./examples/dns -addr dnssrv+_memcache._tcp.memcache-headless
//
// Outside Kubernetes, against a DNS server of your own (Consul's, here):
//
//	go run ./examples/dns -addr dnssrv+_memcache._tcp.memcache.service.consul -server 127.0.0.1:8600
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	selector "github.com/kubecache/k8s-memcache-selector"
)

func main() {
	addr := flag.String("addr", "dnssrv+_memcache._tcp.memcache-headless", "dnssrv+_port._tcp.name (SRV records) or dns+name:port (A/AAAA records)")
	server := flag.String("server", "", "the DNS server's host:port; default: /etc/resolv.conf's first nameserver, with its search list")
	interval := flag.Duration("interval", 0, "the time between lookups (default 5s)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := selector.NewClient(ctx, *addr,
		selector.WithDNS(selector.DNS{Server: *server, Interval: *interval}),
		selector.WithOnChange(func(servers []net.Addr) { log.Printf("servers: %v", servers) }))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Set(&memcache.Item{Key: "hello", Value: []byte("world")}); err != nil {
		log.Fatal(err)
	}
	item, err := c.Get("hello")
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("hello = %s", item.Value)

	stop, done := signal.NotifyContext(context.Background(), os.Interrupt)
	defer done()
	<-stop.Done()
	if st := c.Stats().Discovery; st.LastError != nil {
		log.Printf("the last DNS error (%s): %v", st.LastErrorTime.Format(time.RFC3339), st.LastError)
	}
}
