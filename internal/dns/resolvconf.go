package dns

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// ResolvConf is the default resolver's configuration file.
const ResolvConf = "/etc/resolv.conf"

// Config is what this package reads of resolv.conf: the servers, the search
// list and ndots. Other options (timeout, attempts, rotate) are not read.
type Config struct {
	Servers []string // host:port, port 53
	Search  []string
	Ndots   int // 1 when the file does not say, as glibc's default
}

// ReadConfig reads resolv.conf at path. A file without a nameserver is an
// error: this client does not fall back to a server of its own choosing.
func ReadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("read the DNS configuration: %w", err)
	}
	defer f.Close()
	c, err := ParseConfig(io.LimitReader(f, 64<<10))
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses resolv.conf's text (see ReadConfig). The last search
// (or domain) line wins, as in glibc.
func ParseConfig(r io.Reader) (Config, error) {
	c := Config{Ndots: 1}
	s := bufio.NewScanner(r)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			// A zone in an IPv6 address ("fe80::1%eth0") is kept.
			host, _, _ := strings.Cut(f[1], "%")
			if _, err := netip.ParseAddr(host); err == nil {
				c.Servers = append(c.Servers, net.JoinHostPort(f[1], "53"))
			}
		case "search", "domain":
			c.Search = append([]string(nil), f[1:]...)
		case "options":
			for _, o := range f[1:] {
				if v, ok := strings.CutPrefix(o, "ndots:"); ok {
					if n, err := strconv.Atoi(v); err == nil && n >= 0 {
						c.Ndots = min(n, 15) // glibc's cap
					}
				}
			}
		}
	}
	if err := s.Err(); err != nil {
		return c, err
	}
	if len(c.Servers) == 0 {
		return c, fmt.Errorf("no nameserver line")
	}
	return c, nil
}
