package selector

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// target is a parsed NewServerList address.
type target struct {
	service, namespace string
	port               int    // the target port number, or 0 if portName is set
	portName           string // the Service port name
	addr               string // as given, for messages
}

func (t target) String() string { return t.addr }

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

var (
	dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	digits       = regexp.MustCompile(`^[0-9]+$`)
	portNameChar = regexp.MustCompile(`^[-a-z0-9]+$`)
)

// maxDNSName is the length of the longest DNS name (RFC 1035's 255 octets
// on the wire, less the first length octet and the root).
const maxDNSName = 253

// parseTarget parses a NewServerList address. The namespace is the host's
// second label; the third, if any, must be "svc" and the rest is the cluster
// domain. Without a namespace it is POD_NAMESPACE (from getenv), then the
// namespace file in the service account directory saDir, then "default".
func parseTarget(addr string, getenv func(string) string, saDir string) (target, error) {
	t := target{addr: addr}
	bad := func(why string) error {
		return fmt.Errorf("bad address %q: %s; want service:port, service.namespace:port or service.namespace.svc.cluster.local:port, such as memcache-headless:11211", addr, why)
	}
	if strings.Contains(addr, "://") {
		return t, bad("it is a URL")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return t, bad(strings.TrimPrefix(err.Error(), "address "+addr+": "))
	}
	if strings.HasPrefix(addr, "[") {
		// SplitHostPort takes the brackets off.
		return t, bad(fmt.Sprintf("%q is in brackets, which are for IPv6 addresses; write %s without them", "["+host+"]", host))
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	t.service = labels[0]
	switch {
	case host == "":
		return t, bad("no service name")
	case !dns1035Label.MatchString(t.service):
		return t, bad(fmt.Sprintf("%q is not a Service name (lowercase letters, digits and '-', starting with a letter); for a fixed list of servers use SetServers", t.service))
	case len(labels) > 1 && !dns1123Label.MatchString(labels[1]):
		return t, bad(fmt.Sprintf("%q is not a namespace name", labels[1]))
	case len(labels) > 2 && labels[2] != "svc":
		return t, bad(fmt.Sprintf("the third label is %q, not svc", labels[2]))
	case len(strings.TrimSuffix(host, ".")) > maxDNSName:
		return t, bad(fmt.Sprintf("the name is %d characters, more than the %d of a DNS name", len(strings.TrimSuffix(host, ".")), maxDNSName))
	}
	if len(labels) > 3 {
		for _, l := range labels[3:] {
			if !dns1123Label.MatchString(l) {
				return t, bad(fmt.Sprintf("%q in the cluster domain is not a DNS label (at most 63 lowercase letters, digits and '-')", l))
			}
		}
	}

	if digits.MatchString(port) {
		n, err := strconv.Atoi(port)
		switch {
		case err != nil || n < 1 || n > 65535:
			return t, bad(fmt.Sprintf("port %s is out of range 1-65535", port))
		case port[0] == '0':
			return t, bad(fmt.Sprintf("port %q has a leading zero; write %d", port, n))
		}
		t.port = n
	} else if why := portNameProblem(port); why != "" {
		return t, bad(why)
	} else {
		t.portName = port
	}

	ns, err := namespace(labels, getenv, saDir)
	if err != nil {
		return t, err
	}
	t.namespace = ns
	return t, nil
}

// portNameProblem says why p is not a Service port name, or returns "". A
// port name is an IANA service name: at most 15 lowercase letters, digits
// and '-', with at least one letter, no '-' at either end and no "--".
func portNameProblem(p string) string {
	switch {
	case !portNameChar.MatchString(p):
		return fmt.Sprintf("port %q is neither a number nor a Service port name (at most 15 lowercase letters, digits and '-', with a letter)", p)
	case len(p) > 15:
		return fmt.Sprintf("port name %q is %d characters, more than the 15 of a Service port name", p, len(p))
	case !strings.ContainsAny(p, "abcdefghijklmnopqrstuvwxyz"):
		return fmt.Sprintf("port name %q has no letter; a port number has only digits", p)
	case strings.Contains(p, "--"):
		return fmt.Sprintf("port name %q has \"--\", which a Service port name cannot have", p)
	case p[0] == '-' || p[len(p)-1] == '-':
		return fmt.Sprintf("port name %q starts or ends with '-', which a Service port name cannot", p)
	}
	return ""
}

// namespace returns the namespace of a target whose host has the given
// labels: the second label, else POD_NAMESPACE, else the namespace file in
// saDir, trimmed, else "default". A namespace from the environment or the
// file goes into the request path, so it must be a namespace name.
func namespace(labels []string, getenv func(string) string, saDir string) (string, error) {
	if len(labels) > 1 {
		return labels[1], nil // checked by parseTarget
	}
	ns, from := getenv("POD_NAMESPACE"), "POD_NAMESPACE"
	fix := "fix POD_NAMESPACE or name the namespace in the address"
	if ns == "" {
		from = filepath.Join(saDir, "namespace")
		fix = "name the namespace in the address"
		b, err := os.ReadFile(from)
		if ns = strings.TrimSpace(string(b)); err != nil || ns == "" {
			return "default", nil
		}
	}
	if !dns1123Label.MatchString(ns) {
		return "", fmt.Errorf("namespace from %s: %q is not a namespace name (a DNS label: at most 63 lowercase letters, digits and '-'); %s, such as %s.my-namespace:11211",
			from, ns, fix, labels[0])
	}
	return ns, nil
}
