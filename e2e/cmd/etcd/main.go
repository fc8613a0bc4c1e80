// Command etcd runs a single-member embedded etcd for the e2e control plane.
//
//	etcd -data-dir DIR -client-url http://127.0.0.1:PORT -peer-url http://127.0.0.1:PORT [-compaction-interval 5s]
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory (required)")
	clientURL := flag.String("client-url", "http://127.0.0.1:2379", "client URL to listen on")
	peerURL := flag.String("peer-url", "http://127.0.0.1:2380", "peer URL to listen on")
	compaction := flag.Duration("compaction-interval", 0, "periodic compaction interval (0 disables it)")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("etcd: -data-dir is required")
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "error"
	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("etcd: bad -client-url: %v", err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("etcd: bad -peer-url: %v", err)
	}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	if *compaction > 0 {
		cfg.AutoCompactionMode = "periodic"
		cfg.AutoCompactionRetention = compaction.String()
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: start: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		log.Fatal("etcd: not ready after 60s")
	}
	log.Printf("etcd: ready on %s", cu)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Printf("etcd: %v", err)
	}
	e.Close()
}
