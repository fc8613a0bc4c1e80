package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// NodeName is the Node pods run on unless their PodSpec names another
// (see CreateNode).
const NodeName = "e2e-node"

// Kubelet plays the kubelet for the pods it creates: it sets their status
// (Running, pod IPs, Ready) and runs one real memcached per pod and port on
// the pod's IP.
type Kubelet struct {
	memcached string // path of the memcached binary
	logDir    string

	mu      sync.Mutex
	client  kubernetes.Interface
	free    []netip.Addr // bindable pod IPs (on lo), reused after a pod is gone
	nextRaw netip.Addr   // next IP of pods without memcached (never bound)
}

// NewKubelet creates the Node and returns a Kubelet. Pod IPs with memcached
// come from 10.244.0.1-10.244.0.250 (run.sh puts them on lo); pods without
// processes get IPs from 10.244.1.0 upwards, which nothing ever dials.
func NewKubelet(ctx context.Context, client kubernetes.Interface, memcachedBin, logDir string) (*Kubelet, error) {
	k := &Kubelet{client: client, memcached: memcachedBin, logDir: logDir, nextRaw: netip.MustParseAddr("10.244.1.0")}
	for i := 250; i >= 1; i-- {
		k.free = append(k.free, netip.AddrFrom4([4]byte{10, 244, 0, byte(i)}))
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName, Labels: map[string]string{"kubernetes.io/hostname": NodeName}}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create node: %w", err)
	}
	return k, nil
}

// SetClient makes the Kubelet talk to another API server from now on (as a
// kubelet behind a load balancer does when one API server is down).
func (k *Kubelet) SetClient(c kubernetes.Interface) {
	k.mu.Lock()
	k.client = c
	k.mu.Unlock()
}

func (k *Kubelet) api() kubernetes.Interface {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.client
}

// PodSpec describes a pod for RunPod.
type PodSpec struct {
	Namespace, Name string
	Labels          map[string]string
	Hostname        string // spec.hostname (StatefulSet pods)
	Subdomain       string // spec.subdomain (the headless Service)
	// NodeName is the Node the pod is bound to (spec.nodeName): NodeName by
	// default, or one made with CreateNode, e.g. in a zone.
	NodeName string
	// Ports are the container ports; one memcached runs per port unless
	// NoProcess is set. Default: one port "memcache" 11211.
	Ports     []corev1.ContainerPort
	NoProcess bool // an API object only: no memcached, an IP nothing binds
	NotReady  bool // leave the Ready condition False
	MemoryMB  int  // memcached's -m, its memory for items (default 16)
}

// Pod is a pod the Kubelet runs.
type Pod struct {
	Namespace, Name string
	IP              string

	k         *Kubelet
	spec      PodSpec
	mu        sync.Mutex
	processes []*Process
	stopped   bool
}

// RunPod does what the scheduler, the container runtime and the kubelet do:
// it picks an IP, starts memcached on it, creates the pod bound to the node
// and reports it Running and Ready.
func (k *Kubelet) RunPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	if len(spec.Ports) == 0 {
		spec.Ports = []corev1.ContainerPort{{Name: "memcache", ContainerPort: 11211, Protocol: corev1.ProtocolTCP}}
	}
	if spec.NodeName == "" {
		spec.NodeName = NodeName
	}
	ip, err := k.allocIP(!spec.NoProcess)
	if err != nil {
		return nil, err
	}
	p := &Pod{Namespace: spec.Namespace, Name: spec.Name, IP: ip.String(), k: k, spec: spec}
	if !spec.NoProcess {
		for _, port := range spec.Ports {
			if err := p.startMemcached(ctx, int(port.ContainerPort)); err != nil {
				p.StopProcesses()
				return nil, err
			}
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: spec.Namespace, Labels: spec.Labels},
		Spec: corev1.PodSpec{
			NodeName:                      spec.NodeName,
			Hostname:                      spec.Hostname,
			Subdomain:                     spec.Subdomain,
			AutomountServiceAccountToken:  new(bool),
			TerminationGracePeriodSeconds: new(int64(30)),
			Containers: []corev1.Container{{
				Name:  "memcached",
				Image: "memcached:1.6",
				Ports: spec.Ports,
			}},
		},
	}
	if _, err := k.api().CoreV1().Pods(spec.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		p.StopProcesses()
		return nil, fmt.Errorf("create pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	if err := p.SetReady(ctx, !spec.NotReady); err != nil {
		return nil, err
	}
	return p, nil
}

func (k *Kubelet) allocIP(bindable bool) (netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !bindable {
		ip := k.nextRaw.Next()
		if ip.As4()[3] == 0 || ip.As4()[3] == 255 {
			ip = ip.Next()
		}
		k.nextRaw = ip
		return ip, nil
	}
	if len(k.free) == 0 {
		return netip.Addr{}, fmt.Errorf("no free pod IP in 10.244.0.1-250")
	}
	ip := k.free[len(k.free)-1]
	k.free = k.free[:len(k.free)-1]
	return ip, nil
}

func (k *Kubelet) releaseIP(ip string) {
	a := netip.MustParseAddr(ip)
	if a.As4()[2] != 0 {
		return // not a bindable IP
	}
	k.mu.Lock()
	// Reuse IPs last: a fresh IP makes a restarted pod's new address obvious.
	k.free = append([]netip.Addr{a}, k.free...)
	k.mu.Unlock()
}

func (p *Pod) startMemcached(ctx context.Context, port int) error {
	addr := net.JoinHostPort(p.IP, strconv.Itoa(port))
	logPath := filepath.Join(p.k.logDir, fmt.Sprintf("memcached-%s-%s-%d.log", p.Namespace, p.Name, port))
	mem := p.spec.MemoryMB
	if mem == 0 {
		mem = 16
	}
	proc, err := StartProcess("memcached "+addr, logPath, p.k.memcached,
		"-l", p.IP, "-p", strconv.Itoa(port), "-U", "0", "-m", strconv.Itoa(mem), "-t", "1", "-u", "root")
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.processes = append(p.processes, proc)
	p.mu.Unlock()
	return waitFor(ctx, 10*time.Second, proc, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// Node is the name of the Node the pod is bound to.
func (p *Pod) Node() string { return p.spec.NodeName }

// Addr is the pod's address for port.
func (p *Pod) Addr(port int) string { return net.JoinHostPort(p.IP, strconv.Itoa(port)) }

// SetReady reports the pod Running with its IP and the Ready condition set
// to ready, as the kubelet does after a readiness probe.
func (p *Pod) SetReady(ctx context.Context, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	patch := map[string]any{"status": corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "10.244.255.1",
		PodIP:     p.IP,
		PodIPs:    []corev1.PodIP{{IP: p.IP}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		},
	}}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = p.k.api().CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// Delete deletes the pod gracefully: it stays, Terminating, until ForceDelete.
func (p *Pod) Delete(ctx context.Context) error {
	grace := int64(30)
	return p.k.api().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
}

// ForceDelete removes the pod object at once (what the kubelet does when the
// containers have stopped), stops its processes and frees its IP.
func (p *Pod) ForceDelete(ctx context.Context) error {
	p.StopProcesses()
	grace := int64(0)
	err := p.k.api().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	if err == nil {
		p.k.releaseIP(p.IP)
	}
	return err
}

// Terminate shuts the pod down the way Kubernetes does: graceful delete
// (the pod turns Terminating, not ready), a preStop-like delay during which
// memcached still serves, memcached stopped, then the pod object removed.
func (p *Pod) Terminate(ctx context.Context, preStop time.Duration) error {
	if err := p.Delete(ctx); err != nil {
		return err
	}
	select {
	case <-time.After(preStop):
	case <-ctx.Done():
		return ctx.Err()
	}
	p.StopProcesses()
	return p.ForceDelete(ctx)
}

// StopProcesses stops the pod's memcached processes (SIGTERM, as the
// container runtime does); idempotent.
func (p *Pod) StopProcesses() {
	p.mu.Lock()
	procs := p.processes
	p.processes = nil
	p.stopped = true
	p.mu.Unlock()
	for _, proc := range procs {
		proc.Stop(5 * time.Second)
	}
}

// Stopped reports whether the pod's processes have been stopped.
func (p *Pod) Stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}
