package histcheck

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Memcached is a real memcached process on a loopback port of its own,
// which it keeps across restarts, so that a restart is what a pod's
// restart looks like to a client: the same address, empty.
type Memcached struct {
	Addr string
	bin  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	stopped bool // SIGSTOPped
}

// MemcachedPath returns the memcached binary, or an error saying how to
// install it.
func MemcachedPath() (string, error) {
	bin, err := exec.LookPath("memcached")
	if err != nil {
		return "", fmt.Errorf("memcached is not installed (make test-deps installs it): %w", err)
	}
	return bin, nil
}

// StartMemcached starts a memcached on a free port of 127.0.0.1.
func StartMemcached(bin string) (*Memcached, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	m := &Memcached{Addr: l.Addr().String(), bin: bin}
	l.Close()
	if err := m.Start(); err != nil {
		return nil, err
	}
	return m, nil
}

// Start starts the process on m's port, if it is not running, and waits
// until it accepts connections.
func (m *Memcached) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return nil
	}
	_, port, _ := net.SplitHostPort(m.Addr)
	// Loopback only, no UDP; one thread, so that a stop stops all of it.
	cmd := exec.Command(m.bin, "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1", "-c", "1024")
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "-u", "nobody")
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	m.cmd, m.stopped = cmd, false
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", m.Addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("memcached at %s did not start: %w", m.Addr, err)
		}
	}
}

// Kill SIGKILLs the process and waits for it to exit.
func (m *Memcached) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Kill()
	m.cmd.Wait()
	m.cmd, m.stopped = nil, false
}

// Restart kills the process and starts an empty one on the same port.
func (m *Memcached) Restart() error {
	m.Kill()
	return m.Start()
}

// Stop SIGSTOPs the process: it keeps its connections and its data, and
// answers nothing until Cont.
func (m *Memcached) Stop() { m.signal(syscall.SIGSTOP, true) }

// Cont SIGCONTs a stopped process.
func (m *Memcached) Cont() { m.signal(syscall.SIGCONT, false) }

func (m *Memcached) signal(s syscall.Signal, stopped bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.cmd.Process.Signal(s)
		m.stopped = stopped
	}
}

// Close kills the process for good.
func (m *Memcached) Close() { m.Kill() }

func (m *Memcached) String() string { return "memcached " + m.Addr }
