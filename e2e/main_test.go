// Package e2e tests the selector against a real Kubernetes control plane
// (etcd, kube-apiserver, kube-controller-manager built from source) and real
// memcached servers. Run it with `make e2e`, which runs e2e/run.sh: the suite
// needs the private network namespace that script creates.
package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

var (
	binDir       = flag.String("e2e.bin", ".bin", "directory with etcd, kube-apiserver and kube-controller-manager")
	manifestsDir = flag.String("e2e.manifests", "../examples/kubernetes", "directory with rbac.yaml and service.yaml")
	keepDir      = flag.Bool("e2e.keep", false, "keep the working directory (logs, data) after a successful run")
	reportFile   = flag.String("e2e.report", "", "append the scenarios' figures as Markdown to this file (make bench-e2e)")
)

// report appends Markdown to the -e2e.report file, if there is one.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	if *reportFile == "" {
		return
	}
	f, err := os.OpenFile(*reportFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = fmt.Fprintf(f, format, args...)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		t.Errorf("report: %v", err)
	}
}

// The control plane and fake kubelet shared by all tests.
var (
	cp      *cluster.ControlPlane
	kubelet *cluster.Kubelet
	workDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	if err := cluster.CheckNetwork(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	memcachedBin, err := exec.LookPath("memcached")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: memcached is not installed (apt-get install memcached; run.sh does it)")
		return 1
	}
	if workDir, err = os.MkdirTemp("", "e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	// Interrupts (Ctrl-C, a CI cancel) stop every process we started.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "e2e: %v: stopping all processes; logs are in %s\n", s, workDir)
		cluster.StopAll()
		os.Exit(2)
	}()
	defer func() {
		if cp != nil {
			cp.Stop()
		}
		cluster.StopAll()
		if code != 0 || *keepDir {
			fmt.Fprintf(os.Stderr, "e2e: logs and data kept in %s\n", workDir)
		} else {
			os.RemoveAll(workDir)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	bin, err := filepath.Abs(*binDir)
	if err == nil {
		cp, err = cluster.Start(ctx, cluster.Options{BinDir: bin, Dir: workDir})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start control plane: %v\n", err)
		return 1
	}
	logDir := filepath.Join(workDir, "pods")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if kubelet, err = cluster.NewKubelet(ctx, cp.Client, memcachedBin, logDir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	fmt.Printf("e2e: control plane up in %v (etcd, kube-apiserver %s, kube-controller-manager); work dir %s\n",
		time.Since(start).Round(time.Millisecond), cp.APIServer.URL, workDir)
	return m.Run()
}

// dumpLogsOnFailure prints the tail of every component's log if t fails.
func dumpLogsOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		logs := cp.Logs()
		names := make([]string, 0, len(logs))
		for name := range logs {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			t.Logf("---- tail of %s (%s) ----\n%s", name, logs[name], cluster.Tail(logs[name], 30))
		}
	})
}
