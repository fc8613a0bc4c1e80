package meta

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memcached is a real memcached process on loopback.
type memcached struct {
	addr   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

// startMemcached starts a memcached 1.6 on a free loopback port, which the
// test kills. It skips the test if memcached is not installed, unless
// SELECTOR_REQUIRE_PEERS is set.
func startMemcached(t testing.TB, extra ...string) *memcached {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatalf("memcached is not installed: %v", err)
		}
		t.Skipf("memcached is not installed: %v", err)
	}
	// A free port can be taken by another process between our probe and
	// memcached's bind (other tests run memcached on this machine too), so
	// a start counts only if the server answering is our process.
	for attempt := 0; ; attempt++ {
		m, err := tryMemcached(bin, extra)
		if err == nil {
			t.Cleanup(m.kill)
			return m
		}
		if attempt == 4 {
			t.Fatal(err)
		}
	}
}

func tryMemcached(bin string, extra []string) (*memcached, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	m := &memcached{addr: addr}
	m.cmd = exec.Command(bin, append([]string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1"}, extra...)...)
	if os.Getuid() == 0 {
		m.cmd.Args = append(m.cmd.Args, "-u", "nobody")
	}
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { m.cmd.Wait(); close(exited) }()
	m.exited = exited
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			return nil, fmt.Errorf("memcached on %s exited at start", addr)
		default:
		}
		pid, err := serverPid(addr)
		if err == nil && pid == m.cmd.Process.Pid {
			return m, nil
		}
		if err == nil || time.Now().After(deadline) {
			m.kill()
			return nil, fmt.Errorf("memcached at %s did not start as pid %d (pid %d answered): %v", addr, m.cmd.Process.Pid, pid, err)
		}
	}
}

// serverPid asks the server at addr for its pid (stats).
func serverPid(addr string) (int, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := nc.Write([]byte("stats\r\n")); err != nil {
		return 0, err
	}
	br := bufio.NewReader(nc)
	pid := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, err
		}
		line = strings.TrimSpace(line)
		if line == "END" {
			return pid, nil
		}
		if p, ok := strings.CutPrefix(line, "STAT pid "); ok {
			pid, _ = strconv.Atoi(p)
		}
	}
}

func (m *memcached) kill() {
	m.cmd.Process.Signal(syscall.SIGCONT)
	m.cmd.Process.Kill()
	<-m.exited
}

func (m *memcached) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", m.addr)
}

// conn dials a Conn to m, closed when the test ends.
func (m *memcached) conn(t testing.TB, o Options) *Conn {
	t.Helper()
	nc, err := m.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc, o)
	t.Cleanup(func() { c.Close() })
	return c
}

// pool returns a Pool to m, closed when the test ends.
func (m *memcached) pool(t testing.TB, o Options) *Pool {
	p := NewPool(m.dial, o)
	t.Cleanup(func() { p.Close() })
	return p
}

// checkGoroutines fails the test if, once it has ended and its cleanups
// have run, more goroutines run than when it began.
func checkGoroutines(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(2 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("%d goroutines left behind (%d before, %d after):\n%s", n-before, before, n, buf)
		}
	})
}
