// Package demo runs examples/demo against a control plane, for `make demo`
// (e2e/cmd/demo) and its test (e2e/demo_test.go).
//
// In a namespace of its own it applies examples/kubernetes/rbac.yaml and
// service.yaml, starts memcached pods, and runs the examples/demo program as
// the example ServiceAccount. The program has only that account's RBAC, so it
// cannot change the cluster; it asks the control, a small HTTP server on
// 127.0.0.1 that plays the Deployment controller and the kubelet:
//
//	POST /scale?replicas=N  start (or stop) pods until N are ready; answers when done
//	POST /roll-next         replace the oldest pod, as a rolling update does; answers when done
//	POST /kill              SIGKILL the memcached of one pod; answers at once, and the pod
//	                        turns NotReady after a readiness-probe period, then restarts
//	POST /kill-zone?zone=Z  the same for every pod of zone Z at once
//
// Each answers 200 with one line of text saying what it did, or an error
// status with the reason.
//
// The pods run on three Nodes, one per zone (zone-a, zone-b, zone-c), in
// turn: the EndpointSlice controller copies each Node's zone label into its
// endpoints, which a zoned pool (selector.ByZone) splits by.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

// Config is one run of the demo.
type Config struct {
	Client    kubernetes.Interface // an admin client of the control plane
	Kubelet   *cluster.Kubelet
	APIServer *cluster.APIServer // the program talks to it: its URL and CA
	Namespace string
	Manifests string // the folder of rbac.yaml and service.yaml
	App       string // the examples/demo binary
	Dir       string // a folder for the ServiceAccount token
	LogFile   string // where the program writes the library's logs

	Pods        int    // memcached pods at the start; default 5
	Short       bool   // fewer keys and shorter waits, for the e2e test
	SummaryJSON string // if set, the program writes its summary there

	Out io.Writer // the setup lines and the program's output
}

// timing is how the control plays Kubernetes.
type timing struct {
	surge   time.Duration // a new pod serves this long before the old one is deleted
	preStop time.Duration // a deleted pod's memcached serves this long before it stops
	probe   time.Duration // a killed memcached's pod turns NotReady after this
	restart time.Duration // and the kubelet restarts the container this long after that
}

// A deleted pod serves through its preStop sleep: 3 s (-short: 2 s) is
// enough for the Client to move the keys out of it, a few thousand at up
// to 5000 a second, without a read; before moves, 6 s was what the read
// handoff needed.
var (
	normalTiming = timing{surge: time.Second, preStop: 3 * time.Second, probe: 2 * time.Second, restart: 3 * time.Second}
	shortTiming  = timing{surge: 500 * time.Millisecond, preStop: 2 * time.Second, probe: time.Second, restart: 2 * time.Second}
)

const port = 11211 // the memcached port, service.yaml's targetPort

// Run sets up the namespace and the pods, runs the program until it exits,
// and removes the pods. It returns the program's error, if any.
func Run(ctx context.Context, c Config) error {
	if c.Pods == 0 {
		c.Pods = 5
	}
	s := &control{c: c, t: normalTiming}
	if c.Short {
		s.t = shortTiming
	}
	bg, stopBackground := context.WithCancel(ctx)
	s.bg = bg
	defer s.removePods()
	defer s.background.Wait()
	defer stopBackground()

	sa, err := s.setup(ctx)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /scale", s.handle(s.scale))
	mux.HandleFunc("POST /roll-next", s.handle(s.rollNext))
	mux.HandleFunc("POST /kill", s.handle(s.kill))
	mux.HandleFunc("POST /kill-zone", s.handle(s.killZone))
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	args := []string{
		"-service", fmt.Sprintf("%s.%s:%d", s.service, c.Namespace, port),
		"-api", c.APIServer.URL,
		"-token", filepath.Join(c.Dir, "token"),
		"-ca", c.APIServer.CAFile,
		"-control", "http://" + ln.Addr().String(),
		"-log", c.LogFile,
	}
	if c.Short {
		args = append(args, "-short")
	}
	if c.SummaryJSON != "" {
		args = append(args, "-summary-json", c.SummaryJSON)
	}
	fmt.Fprintf(c.Out, "  %-15s runs as ServiceAccount %s: a token from the TokenRequest API, and the CA\n", "examples/demo", sa)

	p, err := cluster.StartProcessOutput("examples/demo", c.Out, c.Out, c.App, args...)
	if err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		p.Stop(5 * time.Second)
		return fmt.Errorf("examples/demo: %w", err)
	}
	return nil
}

// control plays Kubernetes for the program: the Deployment controller that
// scales and rolls pods, and the kubelet that runs them.
type control struct {
	c       Config
	t       timing
	service string            // the Service's name
	labels  map[string]string // its selector, the pods' labels

	bg         context.Context // for work that outlives a request; done when Run ends
	background sync.WaitGroup

	mu    sync.Mutex     // one change at a time
	pods  []*cluster.Pod // every pod not yet removed, oldest first
	seq   int            // pods started so far; they are named memcache-1, memcache-2, ...
	nodes []string       // a Node per zone, in zones' order
}

// The zones of the demo's Nodes, and the prefix of their names: demo-node-zone-a
// and so on. Nodes are cluster-wide and outlive a run; TestDemo shares its
// control plane with e2e/pools_test.go, whose Nodes are e2e-pool-node-*.
var zones = []string{"zone-a", "zone-b", "zone-c"}

const nodePrefix = "demo-node"

// setup creates the namespace, applies the example manifests, writes a
// token of their ServiceAccount and starts the first pods. It returns the
// ServiceAccount's name.
func (s *control) setup(ctx context.Context) (string, error) {
	c := s.c
	if err := cluster.CreateNamespace(ctx, c.Client, c.Namespace); err != nil {
		return "", err
	}
	m, err := cluster.LoadManifests(c.Manifests)
	if err != nil {
		return "", err
	}
	if err := m.Apply(ctx, c.Client, c.Namespace); err != nil {
		return "", err
	}
	sa := m.ServiceAccount.Name
	s.service, s.labels = m.Service.Name, m.Service.Spec.Selector
	fmt.Fprintf(c.Out, "  %-15s examples/kubernetes/rbac.yaml: %s\n", "namespace "+c.Namespace,
		describe("ServiceAccount/"+sa, "Role/"+m.Role.Name, "RoleBinding/"+m.RoleBinding.Name))
	fmt.Fprintf(c.Out, "  %-15s examples/kubernetes/service.yaml: %s\n", "", describe("Service/"+s.service))
	if err := cluster.WriteToken(ctx, c.Client, c.Namespace, sa, filepath.Join(c.Dir, "token")); err != nil {
		return "", err
	}

	if s.nodes, err = c.Kubelet.CreateZonedNodes(ctx, nodePrefix, zones...); err != nil {
		return "", err
	}
	others := slices.Clone(zones[1:])
	for i := range others {
		others[i] = "-" + others[i]
	}
	fmt.Fprintf(c.Out, "  %-15s %s, %s: one per zone, and the pods on them in turn\n", "nodes", s.nodes[0], strings.Join(others, ", "))
	start := time.Now()
	if _, err := s.scaleTo(ctx, c.Pods); err != nil {
		return "", err
	}
	fmt.Fprintf(c.Out, "  %-15s %s to %s ready in %v, each a memcached on an IP of its own\n", "pods",
		s.pods[0].Name, s.pods[len(s.pods)-1].Name, time.Since(start).Round(10*time.Millisecond))
	return sa, nil
}

// describe lists objects ("Kind/name") as "Kind, Kind name" when they
// share a name, as the ServiceAccount, Role and RoleBinding of rbac.yaml do.
func describe(objs ...string) string {
	var kinds []string
	names := map[string]bool{}
	var name string
	for _, o := range objs {
		kind, n, _ := strings.Cut(o, "/")
		kinds = append(kinds, kind)
		names[n], name = true, n
	}
	if len(names) != 1 {
		return strings.Join(objs, ", ")
	}
	return strings.Join(kinds, ", ") + " " + name
}

// handle serves one control request: one change at a time, answered with a
// line of text or an error.
func (s *control) handle(f func(ctx context.Context, r *http.Request) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		msg, err := f(r.Context(), r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, msg)
	}
}

// scale serves POST /scale?replicas=N.
func (s *control) scale(ctx context.Context, r *http.Request) (string, error) {
	n, err := strconv.Atoi(r.URL.Query().Get("replicas"))
	if err != nil || n < 1 || n > 50 {
		return "", fmt.Errorf("replicas=%q: want a number of pods from 1 to 50", r.URL.Query().Get("replicas"))
	}
	return s.scaleTo(ctx, n)
}

// scaleTo starts pods, or stops the newest, until n run; it returns when
// the Service's EndpointSlices list exactly those as ready.
func (s *control) scaleTo(ctx context.Context, n int) (string, error) {
	var did []string
	var started []*cluster.Pod
	if grow := n - len(s.pods); grow > 0 {
		var wg sync.WaitGroup
		errs := make([]error, grow)
		started = make([]*cluster.Pod, grow)
		for i := range grow {
			name, node := s.next()
			wg.Go(func() { started[i], errs[i] = s.runPod(ctx, name, node) })
		}
		wg.Wait()
		for _, p := range started {
			if p != nil {
				s.pods = append(s.pods, p)
				did = append(did, fmt.Sprintf("started %s (%s)", p.Name, p.IP))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return "", err
		}
	}
	for len(s.pods) > n {
		p := s.pods[len(s.pods)-1]
		if err := s.terminate(ctx, p); err != nil {
			return "", err
		}
		did = append(did, fmt.Sprintf("stopped %s (%s)", p.Name, p.IP))
	}
	if err := s.waitEndpoints(ctx, s.pods); err != nil {
		return "", err
	}
	if did == nil {
		return fmt.Sprintf("%d pods run already", n), nil
	}
	return strings.Join(did, ", "), nil
}

// rollNext serves POST /roll-next: what a Deployment's rolling update
// (maxSurge 1, maxUnavailable 0) does for one pod. A new pod starts and turns
// ready; a moment later the oldest pod is deleted: Kubernetes marks it
// terminating (not ready, so it leaves the EndpointSlices), its preStop sleep
// keeps memcached serving, then memcached stops and the pod goes.
func (s *control) rollNext(ctx context.Context, _ *http.Request) (string, error) {
	if len(s.pods) == 0 {
		return "", errors.New("no pods to roll")
	}
	old := s.pods[0]
	name, node := s.next()
	p, err := s.runPod(ctx, name, node)
	if err != nil {
		return "", err
	}
	s.pods = append(s.pods, p)
	if err := s.waitEndpoints(ctx, s.pods); err != nil {
		return "", err
	}
	if err := sleep(ctx, s.t.surge); err != nil {
		return "", err
	}
	if err := s.terminate(ctx, old); err != nil {
		return "", err
	}
	if err := s.waitEndpoints(ctx, s.pods); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s -> %s", old.Name, p.Name), nil
}

// terminate deletes p as Kubernetes does: a graceful delete (the pod turns
// Terminating), the preStop delay, memcached stopped (SIGTERM), the pod
// object removed.
func (s *control) terminate(ctx context.Context, p *cluster.Pod) error {
	if err := p.Terminate(ctx, s.t.preStop); err != nil {
		return err
	}
	s.pods = slices.DeleteFunc(s.pods, func(q *cluster.Pod) bool { return q == p })
	return nil
}

// next names the next pod and picks its Node: the zones in turn, as a
// topology spread constraint spreads a Deployment's pods. A rolling update
// replaces the oldest pod with one in the same zone, as long as the pods
// are a multiple of the zones (6, after the scale-up, in 3), so every zone
// keeps its share throughout.
func (s *control) next() (name, node string) {
	s.seq++
	return fmt.Sprintf("memcache-%d", s.seq), s.nodes[(s.seq-1)%len(s.nodes)]
}

func (s *control) runPod(ctx context.Context, name, node string) (*cluster.Pod, error) {
	return s.c.Kubelet.RunPod(ctx, cluster.PodSpec{Namespace: s.c.Namespace, Name: name, Labels: s.labels, NodeName: node})
}

// zoneOf is the zone of p's Node.
func (s *control) zoneOf(p *cluster.Pod) string {
	return zones[slices.Index(s.nodes, p.Node())]
}

// waitEndpoints waits until the Service's EndpointSlices list exactly pods
// as ready, as the EndpointSlice controller writes them.
func (s *control) waitEndpoints(ctx context.Context, pods []*cluster.Pod) error {
	var want []string
	for _, p := range pods {
		want = append(want, p.IP)
	}
	slices.Sort(want)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []string
	for {
		list, err := s.c.Client.DiscoveryV1().EndpointSlices(s.c.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + s.service,
		})
		if err == nil {
			got = got[:0]
			for _, sl := range list.Items {
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
						got = append(got, ep.Addresses...)
					}
				}
			}
			slices.Sort(got)
			if slices.Equal(got, want) {
				return nil
			}
		}
		if sleep(ctx, 20*time.Millisecond) != nil {
			return fmt.Errorf("EndpointSlices of %s: ready %v, want %v", s.service, got, want)
		}
	}
}

// removePods removes every pod the control started and has not removed.
func (s *control) removePods() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range s.pods {
		wg.Go(func() { _ = p.ForceDelete(context.Background()) })
	}
	wg.Wait()
	s.pods = nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
