package histcheck

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/testmc"
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

// ports are the ports of this process's memcacheds, so that two runs side
// by side never get the same one (a port closed after Listen may be given
// out again at once).
var ports struct {
	sync.Mutex
	used map[string]bool
}

// StartMemcached starts a memcached on a free port of 127.0.0.1.
func StartMemcached(bin string) (*Memcached, error) {
	var err error
	for range 5 {
		var addr string
		if addr, err = freePort(); err != nil {
			return nil, err
		}
		m := &Memcached{Addr: addr, bin: bin}
		if err = m.Start(); err == nil {
			return m, nil
		}
		m.Close()
	}
	return nil, err
}

func freePort() (string, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.used == nil {
		ports.used = map[string]bool{}
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := l.Addr().String()
		l.Close()
		if !ports.used[addr] {
			ports.used[addr] = true
			return addr, nil
		}
	}
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
	if err := testmc.Wait(m.Addr, cmd.Process.Pid, testmc.StartWait); err != nil {
		m.killLocked()
		return err
	}
	return nil
}

// Kill SIGKILLs the process and waits for it to exit.
func (m *Memcached) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.killLocked()
}

func (m *Memcached) killLocked() {
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

// Close kills the process for good, and frees its port.
func (m *Memcached) Close() {
	m.Kill()
	ports.Lock()
	delete(ports.used, m.Addr)
	ports.Unlock()
}

func (m *Memcached) String() string { return "memcached " + m.Addr }

// TTLs asks the process, by meta get (mg <key> t), for the seconds each
// key has left: -1 for none; a key it does not hold is not in the map.
func (m *Memcached) TTLs(keys []string) (map[string]int, error) {
	c, err := net.DialTimeout("tcp", m.Addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	ttls := map[string]int{}
	for _, k := range keys {
		if _, err := fmt.Fprintf(c, "mg %s t\r\n", k); err != nil {
			return nil, err
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == "EN":
		case len(f) == 2 && f[0] == "HD" && strings.HasPrefix(f[1], "t"):
			if ttls[k], err = strconv.Atoi(f[1][1:]); err != nil {
				return nil, fmt.Errorf("mg %s: %q", k, line)
			}
		default:
			return nil, fmt.Errorf("mg %s: %q", k, line)
		}
	}
	return ttls, nil
}

// fillerKey is the key Pump stores: outside the workload's key space.
const fillerKey = "hc:filler"

// CAS returns the CAS id that key has at m (mg <key> c), of its value or
// of a lease's placeholder; 0 if m holds neither.
func (m *Memcached) CAS(key string) (uint64, error) {
	return m.meta("mg " + key + " c\r\n")
}

// Pump makes n stores (at least one) of fillerKey at m, pipelined and
// quiet, and returns the CAS id of the last: m's counter, of which each
// store takes the next number.
func (m *Memcached) Pump(n int) (uint64, error) {
	return m.meta(strings.Repeat("ms "+fillerKey+" 1 q\r\nf\r\n", max(n, 1)) + "mg " + fillerKey + " c\r\n")
}

// meta sends req, which ends with a meta get (mg <key> c), and returns the
// CAS id of its answer; 0 for a miss (EN).
func (m *Memcached) meta(req string) (uint64, error) {
	c, err := net.DialTimeout("tcp", m.Addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	f := strings.Fields(line)
	if len(f) == 1 && f[0] == "EN" {
		return 0, nil
	}
	for i := 1; len(f) > 0 && f[0] == "HD" && i < len(f); i++ {
		if id, ok := strings.CutPrefix(f[i], "c"); ok {
			return strconv.ParseUint(id, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: %q", m.Addr, line) // a quiet store's error comes first
}
