package selectorotel_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/extra/selectorotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A Client whose metrics go to an OpenTelemetry MeterProvider and whose
// operations are spans of a TracerProvider; in a program, the providers'
// reader and exporter are OTLP's (or, for the metrics, Prometheus's
// through go.opentelemetry.io/otel/exporters/prometheus). It is not run:
// it needs a cluster (TestThroughClient runs the same against a fake API
// server and real memcached).
func Example() {
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer meters.Shutdown(context.Background())
	tracers := sdktrace.NewTracerProvider() // with sdktrace.WithBatcher(exporter)
	defer tracers.Shutdown(context.Background())
	m, err := selectorotel.New(selectorotel.Options{MeterProvider: meters, TracerProvider: tracers})
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

// The spans of a Client's operations, each in the trace of the context it
// is given: here a handler's, printed from an in-memory exporter. A miss
// is not an error. The example starts a memcached on this machine.
func Example_traces() {
	addr, stop := startMemcached()
	defer stop()

	spans := tracetest.NewInMemoryExporter()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tracers.Shutdown(context.Background())
	m, err := selectorotel.New(selectorotel.Options{TracerProvider: tracers})
	if err != nil {
		log.Fatal(err)
	}
	var ss selector.ServerList
	if err := ss.SetServers(addr); err != nil {
		log.Fatal(err)
	}
	cache, err := selector.NewClientFromList(&ss, selector.WithMetrics(m), selector.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer cache.Close()

	ctx, handler := tracers.Tracer("app").Start(context.Background(), "handler")
	if err := cache.SetContext(ctx, &memcache.Item{Key: "greeting", Value: []byte("hello")}); err != nil {
		log.Fatal(err)
	}
	if _, err := cache.GetContext(ctx, "greeting"); err != nil {
		log.Fatal(err)
	}
	if _, err := cache.GetContext(ctx, "absent"); err != memcache.ErrCacheMiss {
		log.Fatal(err)
	}
	handler.End()

	for _, s := range spans.GetSpans() {
		outcome := ""
		for _, kv := range s.Attributes {
			if kv.Key == "memcache.selector.outcome" {
				outcome = kv.Value.AsString()
			}
		}
		fmt.Printf("%-7s %-6s %-4s status %s, under the handler: %v\n", s.Name, s.SpanKind, outcome, s.Status.Code,
			s.Parent.SpanID() == handler.SpanContext().SpanID())
	}
	// Output:
	// set     client ok   status Unset, under the handler: true
	// get     client hit  status Unset, under the handler: true
	// get     client miss status Unset, under the handler: true
	// handler internal      status Unset, under the handler: false
}

// startMemcached starts a memcached on a free port of 127.0.0.1, and
// returns its address and how to stop it.
func startMemcached() (addr string, stop func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("memcached", "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1")
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "-u", "nobody")
	}
	if err := cmd.Start(); err != nil {
		log.Fatalf("memcached (make test-deps installs it): %v", err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr, stop
		}
		if time.Now().After(deadline) {
			stop()
			log.Fatalf("memcached at %s did not start", addr)
		}
	}
}
