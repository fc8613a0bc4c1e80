package cluster

import "syscall"

// Pause stops the pod's memcached processes with SIGSTOP: a hung server.
// The kernel still completes connections to it (its listen backlog) and
// takes the requests into its socket buffers, but nothing answers until
// Resume. The pod object does not change, as a kubelet whose readiness
// probe has not failed yet would leave it.
func (p *Pod) Pause() { p.signalProcesses(syscall.SIGSTOP) }

// Resume continues the processes that Pause stopped (SIGCONT): they answer
// what queued up meanwhile, and serve with the data they had.
func (p *Pod) Resume() { p.signalProcesses(syscall.SIGCONT) }

func (p *Pod) signalProcesses(sig syscall.Signal) {
	p.mu.Lock()
	procs := p.processes
	p.mu.Unlock()
	for _, proc := range procs {
		proc.signal(sig)
	}
}
