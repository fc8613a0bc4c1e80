// Package cluster runs a real Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager) and a fake kubelet whose pods are real memcached
// processes, for the e2e tests. It must run inside the private network
// namespace that e2e/run.sh creates.
package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process in its own process group, with its output
// appended to a log file. The group is killed if the test binary dies
// (Pdeathsig) and by StopAll.
type Process struct {
	Name    string
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done is closed
}

var (
	runningMu sync.Mutex
	running   = map[*Process]bool{}
)

// StartProcess starts bin with args; stdout and stderr go to logPath (appended,
// so a restarted component keeps one log).
func StartProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	runningMu.Lock()
	running[p] = true
	runningMu.Unlock()
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		runningMu.Lock()
		delete(running, p)
		runningMu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id (and process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group and SIGKILL after timeout; it
// returns once the process has exited.
func (p *Process) Stop(timeout time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
	// Children of the leader may outlive it; the group goes in any case.
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
}

// Kill sends SIGKILL to the process group and waits for the process to exit.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

func (p *Process) signal(sig syscall.Signal) {
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.cmd.Process.Signal(sig)
	}
}

// StopAll kills every process started by StartProcess that is still running.
// It is safe to call from a signal handler goroutine.
func StopAll() {
	runningMu.Lock()
	ps := make([]*Process, 0, len(running))
	for p := range running {
		ps = append(ps, p)
	}
	runningMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(5 * time.Second)
		}()
	}
	wg.Wait()
}

// Tail returns the last n lines of the file at path.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	b = bytes.TrimRight(b, "\n")
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
