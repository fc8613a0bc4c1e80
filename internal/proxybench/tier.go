// Package proxybench measures memcache.Client end to end, over real
// memcached servers on loopback, through three paths to the same servers:
// this library's ServerList (memcache.NewFromSelector), gomemcache's own
// ServerList (memcache.New), and twemproxy (nutcracker) in front of the
// servers, with gomemcache pointed at the proxy as its only server.
//
// The measurements are in the package's tests: BenchmarkProxy, which make
// bench runs and internal/benchreport summarizes in BENCHMARKS.md ("Against a
// proxy tier"), and TestPaths, a Set and a Get through each path. This file
// starts and stops the servers. The package is apart from the library's so
// that the library's own tests start no processes.
package proxybench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Servers is the number of memcached servers of a Tier.
const Servers = 3

// A Tier is memcached servers on 127.0.0.1 and, when nutcracker is
// installed and starts, a twemproxy in front of them. Close stops them.
type Tier struct {
	// Servers are the memcached addresses, host:port.
	Servers []string
	// Proxy is nutcracker's address, or "" if ProxyErr says why not.
	Proxy    string
	ProxyErr error
	// Versions are what memcached -V and nutcracker -V say, for the report.
	MemcachedVersion, NutcrackerVersion string

	dir   string
	procs []*proc
}

// Options configures StartTier.
type Options struct {
	// ServerConnections is nutcracker's server_connections: the most
	// connections it opens to each memcached server (its default is 1).
	ServerConnections int
}

// StartTier starts Servers memcached servers, each `memcached -l 127.0.0.1
// -p PORT -U 0 -m 64 -t 1` on a free port, and nutcracker in front of them,
// with their logs and nutcracker's configuration in dir.
//
// One worker thread (-t 1), not memcached's default of 4: memcached gives
// each new connection to the next thread in turn, so with 4 the paths'
// connections to a server are served by different threads, and in
// BenchmarkProxy's alternating loop one path's median latency was up to 3.5
// times another's for a whole run (on a 2-CPU VM; where the scheduler keeps
// each thread, by our reading). With one thread every path's connections to
// a server are served by the same thread, and the paths' medians agree
// within a few percent. It returns an error if
// memcached is not installed or does not start; if nutcracker is not
// installed or does not start, it returns a Tier whose ProxyErr says so. The
// caller must Close the Tier.
func StartTier(dir string, o Options) (*Tier, error) {
	t := &Tier{dir: dir}
	bin, err := exec.LookPath("memcached")
	if err != nil {
		return nil, fmt.Errorf("memcached is not installed (apt-get install memcached): %w", err)
	}
	t.MemcachedVersion = version(bin, "memcached ")
	for i := range Servers {
		addr, err := t.start(fmt.Sprintf("memcached-%d", i), func(port int) ([]string, error) {
			args := []string{bin, "-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "1"}
			if os.Geteuid() == 0 {
				args = append(args, "-u", "root") // memcached refuses root without -u
			}
			return args, nil
		})
		if err != nil {
			t.Close()
			return nil, err
		}
		t.Servers = append(t.Servers, addr)
	}
	t.Proxy, t.ProxyErr = t.startProxy(o)
	return t, nil
}

// nutcrackerConfig is the pool's configuration: ketama over the servers'
// host:port:weight strings, fnv1a_64 keys (twemproxy's defaults and its
// README's recommendation), no ejection (a fixed set of servers, like the
// other two paths), and connections to the servers opened at start.
const nutcrackerConfig = `proxybench:
  listen: 127.0.0.1:%d
  hash: fnv1a_64
  distribution: ketama
  auto_eject_hosts: false
  server_connections: %d
  preconnect: true
  servers:
%s`

func (t *Tier) startProxy(o Options) (string, error) {
	bin, err := exec.LookPath("nutcracker")
	if err != nil {
		return "", fmt.Errorf("nutcracker is not installed (apt-get install nutcracker): %w", err)
	}
	t.NutcrackerVersion = version(bin, "This is nutcracker-")
	conns := max(o.ServerConnections, 1)
	conf := filepath.Join(t.dir, "nutcracker.yml")
	return t.start("nutcracker", func(port int) ([]string, error) {
		var servers strings.Builder
		for _, s := range t.Servers {
			fmt.Fprintf(&servers, "   - %s:1\n", s)
		}
		if err := os.WriteFile(conf, fmt.Appendf(nil, nutcrackerConfig, port, conns, servers.String()), 0o644); err != nil {
			return nil, err
		}
		// The stats port defaults to 0.0.0.0:22222: keep it on loopback,
		// on a free port.
		stats, err := freePort()
		if err != nil {
			return nil, err
		}
		return []string{bin, "-c", conf, "-a", "127.0.0.1", "-s", strconv.Itoa(stats)}, nil
	})
}

// version returns what follows prefix on the first line of bin -V, or
// "unknown".
func version(bin, prefix string) string {
	out, _ := exec.Command(bin, "-V").CombinedOutput()
	line, _, _ := strings.Cut(string(out), "\n")
	if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok && v != "" {
		return v
	}
	return "unknown"
}

// Close stops the servers and the proxy and waits for them to exit.
func (t *Tier) Close() {
	for _, p := range t.procs {
		p.stop()
	}
	t.procs = nil
}

// start runs the command that args returns for a free port, until it
// accepts connections on 127.0.0.1:port, and returns that address. A port
// taken between freePort and the start is retried on another.
func (t *Tier) start(name string, args func(port int) ([]string, error)) (string, error) {
	var err error
	for range 3 {
		var port int
		if port, err = freePort(); err != nil {
			return "", err
		}
		var argv []string
		if argv, err = args(port); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var p *proc
		if p, err = startProc(filepath.Join(t.dir, name+".log"), argv); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		if err = p.waitListening(addr, 10*time.Second); err == nil {
			t.procs = append(t.procs, p)
			return addr, nil
		}
		p.stop()
		err = fmt.Errorf("%s (%s): %w", name, strings.Join(argv, " "), err)
	}
	return "", err
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is a started server process.
type proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed when the process has exited
}

func startProc(log string, argv []string) (*proc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, killed with the test binary if that dies
	// before Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// waitListening waits until addr accepts a connection, the process exits,
// or the timeout passes.
func (p *proc) waitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited (%v) before listening on %s; its log: %s", p.cmd.ProcessState, addr, p.tail())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after %v; its log: %s", addr, timeout, p.tail())
		}
	}
}

// tail returns the end of the process's log, for an error message.
func (p *proc) tail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 500 {
		s = "..." + s[len(s)-500:]
	}
	if s == "" {
		return "(empty)"
	}
	return strconv.Quote(s)
}

// stop kills the process group and waits for the process to exit.
func (p *proc) stop() {
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.cmd.Process.Kill()
	}
	<-p.exited
}
