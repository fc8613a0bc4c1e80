package selectorotel_test

import (
	"context"
	"log"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/extra/selectorotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// A Client whose metrics go to an OpenTelemetry MeterProvider; in a
// program, the provider's reader is an exporter's (OTLP, or Prometheus
// through go.opentelemetry.io/otel/exporters/prometheus). It is not run: it
// needs a cluster (TestThroughClient runs the same against a fake API
// server and real memcached).
func Example() {
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer provider.Shutdown(context.Background())
	m, err := selectorotel.New(selectorotel.Options{MeterProvider: provider})
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cache, err := selector.NewClient(ctx, "memcache-headless:11211", selector.WithMetrics(m))
	if err != nil {
		log.Fatal(err)
	}
	defer cache.Close()
}
