package selector

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/testmc"
	"github.com/stretchr/testify/require"
)

// memcached is a real memcached process on loopback, for the Client's
// tests: its faults are real (SIGKILL, SIGSTOP), and it can be restarted on
// the same port, empty.
type memcached struct {
	t     testing.TB
	addr  string
	cmd   *exec.Cmd
	extra []string // memcached's arguments beyond the test's own
}

// startMemcached starts n memcached servers, which the test stops.
func startMemcached(t testing.TB, n int) []*memcached {
	t.Helper()
	return startMemcachedWith(t, n)
}

// startMemcachedWith is startMemcached with memcached's arguments extra
// beyond the test's own.
func startMemcachedWith(t testing.TB, n int, extra ...string) []*memcached {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
			t.Fatalf("memcached is not installed (make test-deps installs it): %v", err)
		}
		t.Skipf("memcached is not installed (make test-deps installs it): %v", err)
	}
	ms := make([]*memcached, n)
	for i := range ms {
		// A port picked free may be taken before memcached binds it, by
		// another test package's process: then another is picked.
		for try := 0; ; try++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			ms[i] = &memcached{t: t, addr: addr, extra: extra}
			err = ms[i].tryStart(bin)
			if err == nil {
				break
			}
			if !errors.Is(err, testmc.ErrPortTaken) || try == 4 {
				t.Fatal(err)
			}
		}
		t.Cleanup(ms[i].kill)
	}
	return ms
}

func (m *memcached) start(bin string) {
	m.t.Helper()
	if err := m.tryStart(bin); err != nil {
		m.t.Fatal(err)
	}
}

// tryStart starts memcached on m's port and waits until it, not another
// process, answers there.
func (m *memcached) tryStart(bin string) error {
	directs.Delete(m.addr) // its connections are to the process before
	_, port, _ := net.SplitHostPort(m.addr)
	m.cmd = exec.Command(bin, append([]string{"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "16", "-t", "1"}, m.extra...)...)
	if os.Getuid() == 0 {
		m.cmd.Args = append(m.cmd.Args, "-u", "nobody")
	}
	if err := m.cmd.Start(); err != nil {
		return err
	}
	if err := testmc.Wait(m.addr, m.cmd.Process.Pid, testmc.StartWait); err != nil {
		m.kill()
		return err
	}
	return nil
}

// kill SIGKILLs the server and waits for it to exit.
func (m *memcached) kill() {
	directs.Delete(m.addr)
	if m.cmd != nil && m.cmd.Process != nil {
		m.cmd.Process.Signal(syscall.SIGCONT)
		m.cmd.Process.Kill()
		m.cmd.Wait()
		m.cmd = nil
	}
}

// restartWith restarts the server with extra arguments.
func (m *memcached) restartWith(extra ...string) {
	m.t.Helper()
	m.extra = extra
	m.restart()
}

// restart kills the server and starts a new, empty one on its port.
func (m *memcached) restart() {
	m.t.Helper()
	m.kill()
	bin, _ := exec.LookPath("memcached")
	m.start(bin)
}

func (m *memcached) signal(s syscall.Signal) {
	m.t.Helper()
	if err := m.cmd.Process.Signal(s); err != nil {
		m.t.Fatal(err)
	}
	if s == syscall.SIGSTOP {
		m.waitStopped()
	}
}

// waitStopped waits until every thread of the process is stopped: a
// SIGSTOP is only queued when Signal returns, and a thread still running
// answers a request or two.
func (m *memcached) waitStopped() {
	m.t.Helper()
	pid := m.cmd.Process.Pid
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(stats) > 0
		for _, f := range stats {
			b, err := os.ReadFile(f)
			// pid (comm) state ...: the state follows the last ')'.
			i := bytes.LastIndexByte(b, ')')
			if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s did not stop after SIGSTOP", m)
		}
	}
}

func addrsOf(ms []*memcached) []string {
	as := make([]string, len(ms))
	for i, m := range ms {
		as[i] = m.addr
	}
	return as
}

func (m *memcached) String() string { return fmt.Sprintf("memcached %s", m.addr) }

// statOf returns a numeric stat of the memcached at addr.
func statOf(tb testing.TB, addr, name string) int64 {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(tb, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	_, err = conn.Write([]byte("stats\r\n"))
	require.NoError(tb, err)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		require.NoError(tb, err)
		if strings.HasPrefix(line, "END") {
			tb.Fatalf("no stat %s", name)
		}
		if f := strings.Fields(line); len(f) == 3 && f[1] == name {
			n, err := strconv.ParseInt(f[2], 10, 64)
			require.NoError(tb, err)
			return n
		}
	}
}
