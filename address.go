package selector

import (
	"fmt"
	"net"
	"os"
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
)

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
	}

	if n, err := strconv.Atoi(port); err == nil {
		if n < 1 || n > 65535 {
			return t, bad(fmt.Sprintf("port %d is out of range 1-65535", n))
		}
		t.port = n
	} else if dns1123Label.MatchString(port) {
		t.portName = port
	} else {
		return t, bad(fmt.Sprintf("port %q is neither a number nor a Service port name", port))
	}

	switch {
	case len(labels) > 1:
		t.namespace = labels[1]
	case getenv("POD_NAMESPACE") != "":
		t.namespace = getenv("POD_NAMESPACE")
	default:
		t.namespace = "default"
		if b, err := os.ReadFile(saDir + "/namespace"); err == nil && strings.TrimSpace(string(b)) != "" {
			t.namespace = strings.TrimSpace(string(b))
		}
	}
	return t, nil
}
