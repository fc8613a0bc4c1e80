package cluster

import "context"

// Crash kills the pod's memcached processes with SIGKILL, as when a
// container dies without warning. The pod object does not change: it stays
// Ready until the caller reports otherwise with SetReady, as a failing
// readiness probe would.
func (p *Pod) Crash() {
	p.mu.Lock()
	procs := p.processes
	p.processes = nil
	p.mu.Unlock()
	for _, proc := range procs {
		proc.Kill()
	}
}

// RestartProcesses starts the pod's memcached processes again, on the same
// IP and ports and empty, as the kubelet restarts a container that died.
func (p *Pod) RestartProcesses(ctx context.Context) error {
	for _, port := range p.spec.Ports {
		if err := p.startMemcached(ctx, int(port.ContainerPort)); err != nil {
			return err
		}
	}
	return nil
}
