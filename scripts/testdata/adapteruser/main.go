// A user's program: both metric adapters, each reporting a ServerList's
// servers and a Client's request, read back from a Prometheus registry and
// an OpenTelemetry reader. It needs no memcached: its one server is a
// loopback port that refuses connections.
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/extra/selectorotel"
	"github.com/kubecache/k8s-memcache-selector/extra/selectorprometheus"
	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func main() {
	log.SetFlags(0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	prom := selectorprometheus.New(selectorprometheus.Options{})
	registry := prometheus.NewRegistry()
	registry.MustRegister(prom)
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	otel, err := selectorotel.New(selectorotel.Options{MeterProvider: provider})
	if err != nil {
		log.Fatal(err)
	}

	for _, m := range []selector.Metrics{prom, otel} {
		var ss selector.ServerList
		if err := ss.SetServers(addr); err != nil {
			log.Fatal(err)
		}
		c, err := selector.NewClientFromList(&ss, selector.WithMetrics(m), selector.WithTimeout(time.Second),
			selector.WithSlog(slog.New(slog.DiscardHandler)))
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.Get("key"); err == nil {
			log.Fatalf("Get from %s, which refuses connections: no error", addr)
		}
		c.Close()
	}

	families, err := registry.Gather()
	if err != nil {
		log.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		seen[f.GetName()] = true
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			seen[m.Name] = true
		}
	}
	ok := true
	for _, name := range []string{
		"memcache_selector_ring_servers", "memcache_selector_requests_total",
		"memcache.selector.ring.servers", "db.client.operation.duration",
	} {
		if !seen[name] {
			fmt.Printf("missing: %s\n", name)
			ok = false
		}
	}
	if !ok {
		os.Exit(1)
	}
	fmt.Println("both adapters report")
}
