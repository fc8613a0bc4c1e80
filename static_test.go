package selector

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSetServersNormalizes: one server written two ways is one server, with
// one server's share of the keys; a TCP server's identity is its canonical
// host:port.
func TestSetServersNormalizes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		servers []string
		want    map[string]string // identity -> address
	}{
		{"a leading zero in the port",
			[]string{"127.0.0.1:11211", "127.0.0.1:011211"},
			map[string]string{"127.0.0.1:11211": "127.0.0.1:11211"}},
		{"IPv6 written three ways",
			[]string{"[::1]:11211", "[0:0::1]:11211", "[0000:0000:0000:0000:0000:0000:0000:0001]:011211"},
			map[string]string{"[::1]:11211": "[::1]:11211"}},
		{"an IPv6 address in upper case",
			[]string{"[FD00::A]:11211", "[fd00::a]:11211"},
			map[string]string{"[fd00::a]:11211": "[fd00::a]:11211"}},
		{"an IPv4-mapped IPv6 address and the IPv4 address",
			[]string{"[::ffff:127.0.0.1]:11211", "127.0.0.1:11211"},
			map[string]string{"127.0.0.1:11211": "127.0.0.1:11211"}},
		{"a host name in upper case",
			[]string{"LocalHost:11211", "localhost:11211"},
			map[string]string{"localhost:11211": "127.0.0.1:11211"}},
		{"a host name keeps its name as identity",
			[]string{"localhost:11211", "127.0.0.2:11211"},
			map[string]string{"localhost:11211": "127.0.0.1:11211", "127.0.0.2:11211": "127.0.0.2:11211"}},
		{"a host name and its address count once",
			[]string{"localhost:11211", "127.0.0.1:11211"},
			map[string]string{"127.0.0.1:11211": "127.0.0.1:11211"}},
		{"a service name as port",
			[]string{"127.0.0.1:http"},
			map[string]string{"127.0.0.1:80": "127.0.0.1:80"}},
		{"a Unix socket stays as given",
			[]string{"/tmp/memcached.sock", "/tmp/memcached.sock", "./memcached.sock"},
			map[string]string{"/tmp/memcached.sock": "/tmp/memcached.sock", "./memcached.sock": "./memcached.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ss ServerList
			require.NoError(t, ss.SetServers(tc.servers...))
			assert.Equal(t, tc.want, identities(&ss))
		})
	}
}

// TestSetServersShares: 127.0.0.1:011211 is not a second server that takes
// two thirds of the keys.
func TestSetServersShares(t *testing.T) {
	var ss ServerList
	require.NoError(t, ss.SetServers("127.0.0.1:11211", "127.0.0.1:011211", "127.0.0.2:11211"))
	require.Equal(t, []string{"127.0.0.1:11211", "127.0.0.2:11211"}, addrStrings(ss.Servers()))
	n := 0
	for i := range 10000 {
		if a, _ := ss.PickServer(fmt.Sprint("key-", i)); a.String() == "127.0.0.1:11211" {
			n++
		}
	}
	assert.InDelta(t, 5000, n, 1000, "127.0.0.1:11211 owns %d of 10000 keys, want about half", n)
}

// TestSetServersErrors: a bad entry is a clear error that names it, and
// nothing changes.
func TestSetServersErrors(t *testing.T) {
	const want = "; want host:port, such as 127.0.0.1:11211, or the path of a Unix socket"
	for _, tc := range []struct {
		name, server, err string
	}{
		{"empty", "", `selector: SetServers: "": empty` + want},
		{"blank", " ", `selector: SetServers: " ": missing port in address` + want},
		{"no port", "127.0.0.1", `selector: SetServers: "127.0.0.1": missing port in address` + want},
		{"empty port", "127.0.0.1:", `selector: SetServers: "127.0.0.1:": no port` + want},
		{"no host", ":11211", `selector: SetServers: ":11211": no host; for this machine write localhost:11211`},
		{"port 0", "127.0.0.1:0", `selector: SetServers: "127.0.0.1:0": port 0 is out of range 1-65535`},
		{"port 00000", "127.0.0.1:00000", `selector: SetServers: "127.0.0.1:00000": port 00000 is out of range 1-65535`},
		{"port 65536", "127.0.0.1:65536", `selector: SetServers: "127.0.0.1:65536": port 65536 is out of range 1-65535`},
		{"a huge port", "127.0.0.1:99999999999999999999", `selector: SetServers: "127.0.0.1:99999999999999999999": port 99999999999999999999 is out of range 1-65535`},
		{"port with a plus sign", "127.0.0.1:+1", `selector: SetServers: "127.0.0.1:+1": port "+1" is neither a number nor a service name`},
		{"port with a minus sign", "127.0.0.1:-1", `selector: SetServers: "127.0.0.1:-1": port "-1" is neither a number nor a service name`},
		{"unknown service name", "127.0.0.1:no-such-service", `selector: SetServers: "127.0.0.1:no-such-service": unknown port "no-such-service"; want a number 1-65535 or a service name from /etc/services`},
		{"port with a suffix", "256.0.0.1:11211x", `selector: SetServers: "256.0.0.1:11211x": unknown port "11211x"`},
		{"too many colons", "fd00::1:11211", `selector: SetServers: "fd00::1:11211": too many colons in address` + want},
		{"a URL", "tcp://127.0.0.1:11211", `selector: SetServers: "tcp://127.0.0.1:11211": a URL` + want},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ss ServerList
			require.NoError(t, ss.SetServers("127.0.0.1:11211"))
			err := ss.SetServers("127.0.0.2:11211", tc.server)
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), tc.err), "error %q, want it to start with %q", err, tc.err)
			require.Equal(t, []string{"127.0.0.1:11211"}, addrStrings(ss.Servers()), "a failed SetServers changed the list")
		})
	}
}
