package selectorprometheus_test

import (
	"context"
	"log"
	"net/http"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/extra/selectorprometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// A program in a pod that serves its Client's metrics at /metrics. It is
// not run: it needs a cluster (TestThroughClient runs the same against a
// fake API server and real memcached).
func Example() {
	m := selectorprometheus.New(selectorprometheus.Options{})
	prometheus.MustRegister(m)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cache, err := selector.NewClient(ctx, "memcache-headless:11211", selector.WithMetrics(m))
	if err != nil {
		log.Fatal(err)
	}
	defer cache.Close()

	http.Handle("/metrics", promhttp.Handler())
	log.Fatal(http.ListenAndServe(":9090", nil))
}
