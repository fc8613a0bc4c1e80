// Package testmc is what the tests that start memcached processes share:
// a wait for a process to listen that makes sure it is that process, not
// another one (another test package's, run at the same time) that took
// the port between the test's pick of a free port and the start.
package testmc

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// StartWait is how long a test waits for a memcached it started to answer:
// long, since a machine loaded by tests run at once (load average 30 on 2
// cores) took more than 5 s to answer one restarted by the history checker.
const StartWait = 30 * time.Second

// ErrPortTaken is Wait's error when another process listens on the port.
var ErrPortTaken = errors.New("port taken by another process")

// Wait waits, up to timeout, until the memcached at addr answers and
// says it is the process pid. If another process answers there, the
// process pid could not bind the port: Wait returns ErrPortTaken at once,
// and the caller picks another port.
func Wait(addr string, pid int, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		got, err := PIDAt(addr)
		switch {
		case err == nil && got == pid:
			return nil
		case err == nil:
			return fmt.Errorf("memcached at %s: %w (pid %d)", addr, ErrPortTaken, got)
		case time.Now().After(deadline):
			return fmt.Errorf("memcached at %s did not start: %w", addr, err)
		}
	}
}

// PIDAt asks the memcached at addr for its pid (stats).
func PIDAt(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if pid, ok := strings.CutPrefix(sc.Text(), "STAT pid "); ok {
			return strconv.Atoi(strings.TrimSpace(pid))
		}
		if sc.Text() == "END" {
			break
		}
	}
	return 0, fmt.Errorf("no pid in stats: %v", sc.Err())
}
