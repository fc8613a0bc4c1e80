// Command demo is `make demo`: it starts a Kubernetes control plane on this
// machine (etcd, kube-apiserver and kube-controller-manager from e2e/.bin)
// with memcached pods, and runs examples/demo against it (see package
// e2e/internal/demo). It stops everything it started when the program ends,
// fails, or is interrupted.
//
// e2e/run.sh demo builds it and runs it, from the e2e folder, as root in a
// private network namespace (unshare -n); it refuses to run anywhere else.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/demo"
)

func main() {
	var (
		binDir    = flag.String("bin", ".bin", "directory with etcd, kube-apiserver and kube-controller-manager")
		app       = flag.String("app", ".bin/demo-app", "the examples/demo binary")
		manifests = flag.String("manifests", "../examples/kubernetes", "directory with rbac.yaml and service.yaml")
		logFile   = flag.String("log", filepath.Join(os.TempDir(), "k8s-memcache-selector-demo.log"), "file for the library's logs")
		short     = flag.Bool("short", false, "fewer keys and shorter waits")
		summary   = flag.String("summary-json", "", "write the demo's summary as JSON to this file")
		keep      = flag.Bool("keep", false, "keep the work directory (control plane logs and data)")
	)
	flag.Parse()
	os.Exit(run(*binDir, *app, *manifests, *logFile, *short, *summary, *keep))
}

func run(binDir, app, manifests, logFile string, short bool, summary string, keep bool) (code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var interrupted atomic.Bool
	fail := func(format string, args ...any) int {
		if !interrupted.Load() {
			fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
		}
		return 1
	}
	if err := cluster.CheckNetwork(); err != nil {
		return fail("%v", err)
	}
	memcached, err := exec.LookPath("memcached")
	if err != nil {
		return fail("memcached is not installed (apt-get install memcached; e2e/run.sh does it)")
	}
	for _, p := range []*string{&binDir, &app, &manifests, &logFile} {
		if *p, err = filepath.Abs(*p); err != nil {
			return fail("%v", err)
		}
	}
	workDir, err := os.MkdirTemp("", "k8s-memcache-selector-demo-")
	if err != nil {
		return fail("%v", err)
	}

	// Ctrl-C (or SIGTERM, SIGHUP) cancels ctx: the run stops what it started
	// and removes its files. A second one stops them at once.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "\ndemo: %v: stopping everything\n", s)
		cancel()
		<-sig
		cluster.StopAll()
		os.RemoveAll(workDir)
		os.Exit(130)
	}()

	var cp *cluster.ControlPlane
	defer func() {
		if cp != nil {
			cp.Stop()
		}
		cluster.StopAll()
		switch {
		case interrupted.Load():
			os.RemoveAll(workDir)
			fmt.Fprintln(os.Stderr, "demo: stopped the control plane and the pods: nothing is left running")
			code = 130
		case code != 0 || keep:
			fmt.Fprintf(os.Stderr, "demo: control plane logs and data kept in %s\n", workDir)
		default:
			os.RemoveAll(workDir)
			fmt.Println("\nStopped the control plane and the pods: nothing is left running.")
		}
	}()

	heading := "Setup: a Kubernetes control plane and memcached pods, on this machine only"
	if isTerminal() {
		heading = "\x1b[1m" + heading + "\x1b[0m" // bold, as examples/demo's chapters
	}
	fmt.Println(heading)
	done := progress("control plane", "starting etcd, kube-apiserver, kube-controller-manager")
	start := time.Now()
	cp, err = cluster.Start(ctx, cluster.Options{BinDir: binDir, Dir: workDir})
	done()
	if err != nil {
		return fail("start the control plane: %v", err)
	}
	fmt.Printf("  %-15s etcd, kube-apiserver, kube-controller-manager: up in %.1fs, %s\n", "control plane", time.Since(start).Seconds(), cp.APIServer.URL)
	podLogs := filepath.Join(workDir, "pods")
	if err := os.MkdirAll(podLogs, 0o755); err != nil {
		return fail("%v", err)
	}
	kubelet, err := cluster.NewKubelet(ctx, cp.Client, memcached, podLogs)
	if err != nil {
		return fail("%v", err)
	}

	err = demo.Run(ctx, demo.Config{
		Client:      cp.Client,
		Kubelet:     kubelet,
		APIServer:   cp.APIServer,
		Namespace:   "demo",
		Manifests:   manifests,
		App:         app,
		Dir:         workDir,
		LogFile:     logFile,
		Short:       short,
		SummaryJSON: summary,
		Out:         os.Stdout,
	})
	if err != nil {
		return fail("%v", err)
	}
	return 0
}

// progress shows "what ... 1.2s" on a terminal while something runs, until
// the returned function is called, which erases it.
func progress(label, what string) (done func()) {
	if !isTerminal() {
		return func() {}
	}
	start := time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Printf("\r  %-15s %s ... %.1fs\x1b[K", label, what, time.Since(start).Seconds())
			select {
			case <-stop:
				fmt.Print("\r\x1b[K")
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
	}
}

func isTerminal() bool {
	fi, err := os.Stdout.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
