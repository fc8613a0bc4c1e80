package selector

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTarget(t *testing.T) {
	env := map[string]string{}
	o := options{getenv: func(k string) string { return env[k] }, saDir: t.TempDir()}
	for _, tc := range []struct {
		name, addr, podNS string
		want              target
		err               string
	}{
		{name: "service", addr: "memcache:11211", want: target{service: "memcache", namespace: "default", port: 11211}},
		{name: "service in pod namespace", addr: "memcache:11211", podNS: "prod", want: target{service: "memcache", namespace: "prod", port: 11211}},
		{name: "service.namespace", addr: "memcache.cache:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "service.namespace.svc", addr: "memcache.cache.svc:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "FQDN", addr: "memcache.cache.svc.cluster.local:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "FQDN with root dot", addr: "memcache.cache.svc.k8s.example.:11211", want: target{service: "memcache", namespace: "cache", port: 11211}},
		{name: "named port", addr: "memcache-headless:memcache", want: target{service: "memcache-headless", namespace: "default", portName: "memcache"}},
		{name: "no port", addr: "memcache", err: "missing port"},
		{name: "empty", addr: "", err: "missing port"},
		{name: "no service", addr: ":11211", err: "no service name"},
		{name: "URL", addr: "http://memcache:11211", err: "is a URL"},
		{name: "IP", addr: "10.0.0.1:11211", err: `"10" is not a Service name`},
		{name: "upper case", addr: "Memcache:11211", err: "not a Service name"},
		{name: "bad namespace", addr: "memcache.Cache:11211", err: "not a namespace name"},
		{name: "not svc", addr: "memcache.cache.pod.cluster.local:11211", err: "not svc"},
		{name: "port 0", addr: "memcache:0", err: "out of range"},
		{name: "port too big", addr: "memcache:65536", err: "out of range"},
		{name: "bad port name", addr: "memcache:mem_cache", err: "neither a number nor a Service port name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env["POD_NAMESPACE"] = tc.podNS
			got, err := parseTarget(tc.addr, o.getenv, o.saDir)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "want service:port")
				return
			}
			require.NoError(t, err)
			tc.want.addr = tc.addr
			require.Equal(t, tc.want, got)
		})
	}
}
