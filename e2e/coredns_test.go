package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// CoreDNS for the tests of discovery by DNS: e2e/coredns (its own module,
// built by run.sh into .bin/coredns) with the kubernetes plugin, serving the
// control plane's Services as a cluster's DNS does, on an address that
// run.sh adds to lo in the private network namespace.
const coreDNSIP = "10.244.255.253"

// coreDNSSeq gives each CoreDNS its own ports, so that one a test stops
// never answers the next test's queries.
var coreDNSSeq atomic.Int32

// coreDNS is one CoreDNS process.
type coreDNS struct {
	Addr string // host:port of its DNS service (UDP and TCP)
	proc *cluster.Process
}

// startCoreDNS starts a CoreDNS for t, reading the API as an admin (as the
// controller manager does; a cluster's CoreDNS has a ClusterRole to list
// and watch Services, EndpointSlices, Namespaces), waits until its
// kubernetes plugin has synced and it answers, and stops it when t ends. Its answers have
// TTL 0 and it has no cache, so that a client's DNS.Interval alone says how
// stale an answer can be. The tail of its log (one line per query) is
// printed if t fails.
func startCoreDNS(t *testing.T) *coreDNS {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join(*binDir, "coredns"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("CoreDNS is not built (%v): run the suite through e2e/run.sh, which builds e2e/coredns into %s", err, *binDir)
	}
	n := int(coreDNSSeq.Add(1))
	dnsPort, readyPort := 5300+n, 8300+n
	dir := filepath.Join(workDir, "coredns-"+strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig, cp.APIServer.URL, cp.APIServer.CAFile, cp.Config.BearerToken); err != nil {
		t.Fatal(err)
	}
	corefile := filepath.Join(dir, "Corefile")
	conf := fmt.Sprintf(`cluster.local:%d {
	bind %s
	ready %s:%d
	errors
	log
	kubernetes cluster.local {
		kubeconfig %s
		ttl 0
	}
}
`, dnsPort, coreDNSIP, coreDNSIP, readyPort, kubeconfig)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	proc, err := cluster.StartProcess("coredns", filepath.Join(dir, "coredns.log"), bin, "-conf", corefile)
	if err != nil {
		t.Fatal(err)
	}
	c := &coreDNS{Addr: net.JoinHostPort(coreDNSIP, strconv.Itoa(dnsPort)), proc: proc}
	t.Cleanup(func() {
		proc.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("---- tail of coredns (%s) ----\n%s", proc.LogPath, cluster.Tail(proc.LogPath, 40))
		}
	})
	// The ready plugin answers 200 once the kubernetes plugin has listed
	// the API's objects; before, CoreDNS would answer from an empty cache.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	readyURL := fmt.Sprintf("http://%s:%d/ready", coreDNSIP, readyPort)
	for {
		if err := httpOK(ctx, readyURL); err == nil {
			break
		} else if exited, perr := proc.Exited(); exited {
			t.Fatalf("coredns exited (%v) before it was ready; its log:\n%s", perr, cluster.Tail(proc.LogPath, 40))
		} else if ctx.Err() != nil {
			t.Fatalf("coredns not ready after a minute: %v; its log:\n%s", err, cluster.Tail(proc.LogPath, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The ready plugin may answer before the DNS listener is bound: wait
	// for an answer to a query too (NXDOMAIN is one).
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, c.Addr)
	}}
	for {
		_, err := r.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		var de *net.DNSError
		if err == nil || errors.As(err, &de) && de.IsNotFound {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("coredns does not answer on %s after a minute: %v; its log:\n%s", c.Addr, err, cluster.Tail(proc.LogPath, 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("CoreDNS on %s ready in %v", c.Addr, time.Since(start).Round(time.Millisecond))
	return c
}

// httpOK checks that a GET of url answers 200.
func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
