package cluster

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"syscall"
)

// StartProcessOutput is StartProcess with the process's stdout and stderr
// going to the given writers instead of a log file, for a program whose
// output is for the user. Like StartProcess, it runs in its own process
// group, dies with this process and is stopped by StopAll.
func StartProcessOutput(name string, stdout, stderr io.Writer, bin string, args ...string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	runningMu.Lock()
	running[p] = true
	runningMu.Unlock()
	go func() {
		p.err = cmd.Wait()
		runningMu.Lock()
		delete(running, p)
		runningMu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Wait waits until the process exits and returns its error, like
// exec.Cmd.Wait; or returns ctx's error first.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
