package selector

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTarget(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name, addr string
		podNS      string // POD_NAMESPACE
		file       string // the namespace file's content, if not ""
		want       target
		err        string // in the error; an address error also says what to write
		notAddr    bool   // the error is not about the address
	}{
		{name: "service", addr: "memcache:11211", want: target{service: "memcache", namespace: "default", port: 11211}},
		{name: "service in pod namespace", addr: "memcache:11211", podNS: "prod", want: target{service: "memcache", namespace: "prod", port: 11211}},
		{name: "service in the namespace file's namespace", addr: "memcache:11211", file: " team-c\n", want: target{service: "memcache", namespace: "team-c", port: 11211}},
		{name: "POD_NAMESPACE before the namespace file", addr: "memcache:11211", podNS: "prod", file: "team-c", want: target{service: "memcache", namespace: "prod", port: 11211}},
		{name: "service.namespace", addr: "memcache.cache:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "service.namespace.svc", addr: "memcache.cache.svc:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "FQDN", addr: "memcache.cache.svc.cluster.local:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "FQDN with root dot", addr: "memcache.cache.svc.k8s.example.:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "named port", addr: "memcache-headless:memcache", want: target{service: "memcache-headless", namespace: "default", portName: "memcache"}},
		{name: "port name of 15 characters", addr: "memcache:memcache-metric", want: target{service: "memcache", namespace: "default", portName: "memcache-metric"}},
		{name: "port name with digits", addr: "memcache:mc-11211", want: target{service: "memcache", namespace: "default", portName: "mc-11211"}},
		{name: "port 65535", addr: "memcache:65535", want: target{service: "memcache", namespace: "default", port: 65535}},
		{name: "port 1", addr: "memcache:1", want: target{service: "memcache", namespace: "default", port: 1}},

		{name: "no port", addr: "memcache", err: "missing port"},
		{name: "empty", addr: "", err: "missing port"},
		{name: "no service", addr: ":11211", err: "no service name"},
		{name: "URL", addr: "http://memcache:11211", err: "is a URL"},
		{name: "IP", addr: "10.0.0.1:11211", err: `"10" is not a Service name`},
		{name: "upper case", addr: "Memcache:11211", err: "not a Service name"},
		{name: "bracketed host", addr: "[memcache]:11211", err: `"[memcache]" is in brackets, which are for IPv6 addresses; write memcache without them`},
		{name: "bracketed IPv6", addr: "[fd00::1]:11211", err: `"[fd00::1]" is in brackets, which are for IPv6 addresses`},
		{name: "bad namespace", addr: "memcache.Cache:11211", err: `"Cache" is not a namespace name`},
		{name: "empty namespace", addr: "memcache..svc:11211", err: `"" is not a namespace name`},
		{name: "not svc", addr: "memcache.cache.pod.cluster.local:11211", err: "not svc"},
		{name: "cluster domain with underscore", addr: "memcache.cache.svc.cluster_local:11211", err: `"cluster_local" in the cluster domain is not a DNS label (at most 63 lowercase letters, digits and '-')`},
		{name: "cluster domain with empty label", addr: "memcache.cache.svc..local:11211", err: `"" in the cluster domain is not a DNS label`},
		{name: "cluster domain in upper case", addr: "memcache.cache.svc.cluster.LOCAL:11211", err: `"LOCAL" in the cluster domain is not a DNS label`},
		{name: "cluster domain label too long", addr: "memcache.cache.svc." + long + ":11211", err: "in the cluster domain is not a DNS label"},
		{name: "host name too long", addr: "memcache.cache.svc" + strings.Repeat(".cluster", 30) + ":11211", err: "the name is 258 characters, more than the 253 of a DNS name"},
		{name: "port 0", addr: "memcache:0", err: "port 0 is out of range 1-65535"},
		{name: "port too big", addr: "memcache:65536", err: "port 65536 is out of range 1-65535"},
		{name: "port far too big", addr: "memcache:99999999999999999999", err: "port 99999999999999999999 is out of range 1-65535"},
		{name: "port with a plus sign", addr: "memcache:+1", err: `port "+1" is neither a number nor a Service port name`},
		{name: "port with a minus sign", addr: "memcache:-1", err: `port name "-1" has no letter; a port number has only digits`},
		{name: "port with a leading zero", addr: "memcache:011211", err: `port "011211" has a leading zero; write 11211`},
		{name: "port 00", addr: "memcache:00", err: "port 00 is out of range 1-65535"},
		{name: "bad port name", addr: "memcache:mem_cache", err: `port "mem_cache" is neither a number nor a Service port name (at most 15 lowercase letters, digits and '-', with a letter)`},
		{name: "port name too long", addr: "memcache:memcache-metrics", err: `port name "memcache-metrics" is 16 characters, more than the 15 of a Service port name`},
		{name: "port name with upper case", addr: "memcache:Memcache", err: `port "Memcache" is neither a number nor a Service port name`},
		{name: "port name without a letter", addr: "memcache:11-211", err: `port name "11-211" has no letter`},
		{name: "port name with --", addr: "memcache:mem--cache", err: `port name "mem--cache" has "--"`},
		{name: "port name starting with -", addr: "memcache:-memcache", err: `port name "-memcache" starts or ends with '-'`},
		{name: "port name ending with -", addr: "memcache:memcache-", err: `port name "memcache-" starts or ends with '-'`},

		{name: "bad POD_NAMESPACE", addr: "memcache:11211", podNS: "Prod", notAddr: true,
			err: `namespace from POD_NAMESPACE: "Prod" is not a namespace name (a DNS label: at most 63 lowercase letters, digits and '-'); fix POD_NAMESPACE or name the namespace in the address, such as memcache.my-namespace:11211`},
		{name: "POD_NAMESPACE with a path", addr: "memcache:11211", podNS: "../kube-system", notAddr: true, err: `namespace from POD_NAMESPACE: "../kube-system" is not a namespace name`},
		{name: "POD_NAMESPACE too long", addr: "memcache:11211", podNS: long, notAddr: true, err: `namespace from POD_NAMESPACE: "` + long + `" is not a namespace name`},
		{name: "bad namespace file", addr: "memcache:11211", file: "team/a\n", notAddr: true, err: `namespace from FILE: "team/a" is not a namespace name (a DNS label: at most 63 lowercase letters, digits and '-'); name the namespace in the address`},
		{name: "namespace file with two lines", addr: "memcache:11211", file: "team-a\nteam-b\n", notAddr: true, err: `namespace from FILE: "team-a\nteam-b" is not a namespace name`},
		{name: "a namespace in the address beats a bad POD_NAMESPACE", addr: "memcache.cache:11211", podNS: "Prod", want: target{service: "memcache", namespace: "cache", port: 11211}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saDir := t.TempDir()
			file := filepath.Join(saDir, "namespace")
			if tc.file != "" {
				require.NoError(t, os.WriteFile(file, []byte(tc.file), 0o600))
			}
			getenv := func(k string) string {
				if k == "POD_NAMESPACE" {
					return tc.podNS
				}
				return ""
			}
			got, err := parseTarget(tc.addr, getenv, saDir)
			if tc.err != "" {
				require.ErrorContains(t, err, strings.ReplaceAll(tc.err, "FILE", file))
				if tc.notAddr {
					require.NotContains(t, err.Error(), "bad address")
				} else {
					require.ErrorContains(t, err, `bad address "`+tc.addr+`"`)
					require.ErrorContains(t, err, "want service:port")
				}
				return
			}
			require.NoError(t, err)
			tc.want.addr = tc.addr
			require.Equal(t, tc.want, got)
		})
	}
}

// FuzzParseTarget: parseTarget never panics, and a target it accepts has a
// valid Service name, namespace and port, and parses back from its parts.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []struct{ addr, podNS string }{
		{"memcache:11211", ""},
		{"memcache-headless:memcache", "prod"},
		{"memcache.cache.svc.cluster.local.:11211", ""},
		{"memcache:011211", "Prod"},
		{"[memcache]:+1", "../x"},
		{"memcache.cache.svc.cluster_local:memcache-metrics", ""},
		{"http://memcache:11211", ""},
	} {
		f.Add(s.addr, s.podNS)
	}
	saDir := f.TempDir()
	f.Fuzz(func(t *testing.T, addr, podNS string) {
		getenv := func(k string) string {
			if k == "POD_NAMESPACE" {
				return podNS
			}
			return ""
		}
		got, err := parseTarget(addr, getenv, saDir)
		if err != nil {
			return
		}
		require.Regexp(t, dns1035Label, got.service)
		require.Regexp(t, dns1123Label, got.namespace)
		port := got.portName
		if got.portName == "" {
			require.True(t, got.port >= 1 && got.port <= 65535, "port %d", got.port)
			port = strconv.Itoa(got.port)
		} else {
			require.Zero(t, got.port)
			require.Empty(t, portNameProblem(got.portName))
		}
		again, err := parseTarget(got.service+"."+got.namespace+":"+port, getenv, saDir)
		require.NoError(t, err)
		require.Equal(t, [4]any{got.service, got.namespace, got.port, got.portName}, [4]any{again.service, again.namespace, again.port, again.portName})
	})
}
