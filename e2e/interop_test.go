package e2e

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	selector "github.com/kubecache/k8s-memcache-selector"
	"github.com/kubecache/k8s-memcache-selector/e2e/internal/cluster"
)

var peerPHP = flag.String("e2e.peer-php", "../testdata/interop/peer.php", "the php-memcached peer of the interop checks")

// interopKeys is how many keys each side writes in TestInteropOnKubernetes.
const interopKeys = 10000

// php runs the php-memcached peer (see testdata/interop/peer.php) over
// servers, as host:port, and returns what it printed.
func php(t *testing.T, servers []string, mode, prefix string) string {
	t.Helper()
	bin, err := exec.LookPath("php")
	if err == nil {
		err = exec.Command(bin, "-r", `exit(class_exists("Memcached") ? 0 : 1);`).Run()
	}
	require.NoError(t, err, "php with php-memcached is needed (make test-deps installs php-cli and php-memcached)")
	spec := make([]string, len(servers))
	for i, s := range servers {
		spec[i] = s + ":1"
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, *peerPHP, strings.Join(spec, ","), mode, prefix, strconv.Itoa(interopKeys))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "php %s: %s", mode, errOut.String())
	return out.String()
}

// foundWhereSelectorLooks reads each key of prefix from the server ss picks
// for it, straight from that server, and returns how many hold their value.
func foundWhereSelectorLooks(t *testing.T, ss *selector.ServerList, prefix string) int {
	t.Helper()
	byServer := map[string][]string{}
	for i := range interopKeys {
		k := prefix + strconv.Itoa(i)
		byServer[pick(t, ss, k)] = append(byServer[pick(t, ss, k)], k)
	}
	found := 0
	for addr, keys := range byServer {
		c := memcache.New(addr)
		for b := range slices.Chunk(keys, 500) {
			items, err := c.GetMulti(b)
			require.NoError(t, err, addr)
			for k, it := range items {
				if string(it.Value) == k {
					found++
				}
			}
		}
	}
	return found
}

// TestInteropOnKubernetes: the hashing modes over servers that discovery
// finds, against a real peer. Four StatefulSet pods (mc-0..mc-3, with
// hostnames) run memcached.
//
//   - Ketama, discovered servers named by ip:port: php-memcached given the
//     pods' IPs writes 10,000 keys, which the library finds where it looks;
//     the library's Client writes 10,000, which php-memcached reads.
//   - Ketama with ByHostname: php-memcached given the pods' DNS names puts
//     every key on the pod the library picks (php's getServerByKey, which
//     needs no DNS).
//   - Ch3 by ordinal: the library's mapping is Ch3 over the pods in ordinal
//     order, as an mcrouter pool listing them; mc-1 NotReady moves only its
//     keys, and spreads them over the others; Ready again, the mapping is as
//     before.
func TestInteropOnKubernetes(t *testing.T) {
	e := newEnv(t)
	pods := e.runPods(0, 4, podOpts{statefulSet: true})
	ips := addrs(pods, 11211)

	t.Run("ketama by address", func(t *testing.T) {
		l := e.mustLib(serviceName+":11211", selector.WithHashing(selector.Ketama()))
		l.waitServers(t, ips, 20*time.Second)
		php(t, ips, "write", "php-")
		fromPHP := foundWhereSelectorLooks(t, l.ServerList, "php-")
		cl := e.newSelClient(l)
		for i := range interopKeys {
			k := "go-" + strconv.Itoa(i)
			require.NoError(t, cl.Set(&memcache.Item{Key: k, Value: []byte(k)}))
		}
		toPHP, err := strconv.Atoi(strings.TrimSpace(php(t, ips, "read", "go-")))
		require.NoError(t, err)
		t.Logf("ketama on Kubernetes: php-memcached -> selector %d of %d keys found; selector.Client -> php-memcached %d of %d", fromPHP, interopKeys, toPHP, interopKeys)
		assert.Equal(t, interopKeys, fromPHP, "keys php-memcached wrote, found where the library looks")
		assert.Equal(t, interopKeys, toPHP, "keys the library wrote, found by php-memcached")
	})

	t.Run("ketama by hostname", func(t *testing.T) {
		domain := fmt.Sprintf("%s.%s.svc.cluster.local", serviceName, e.ns)
		l := e.mustLib(serviceName+":11211", selector.WithHashing(selector.Ketama().ByHostname(domain)))
		l.waitServers(t, ips, 20*time.Second)
		names := make([]string, len(pods))
		byName := map[string]*cluster.Pod{}
		for i, p := range pods {
			names[i] = p.Name + "." + domain + ":11211"
			byName[names[i]] = p
		}
		agree := 0
		sc := bufio.NewScanner(strings.NewReader(php(t, names, "locate", "dns-")))
		for sc.Scan() {
			k, name, _ := strings.Cut(sc.Text(), "\t")
			p := byName[name]
			require.NotNil(t, p, "php-memcached names a server %q it was not given", name)
			if pick(t, l, k) == p.Addr(11211) {
				agree++
			}
		}
		t.Logf("ketama by hostname on Kubernetes: php-memcached (the pods' DNS names) and the selector agree on %d of %d keys", agree, interopKeys)
		assert.Equal(t, interopKeys, agree, "keys placed alike")
	})

	t.Run("ch3 by ordinal", func(t *testing.T) {
		l := e.mustLib(serviceName+":11211", selector.WithHashing(selector.Ch3()))
		l.waitServers(t, ips, 20*time.Second)
		var ref selector.ServerList // an mcrouter pool's list: the pods in ordinal order
		require.NoError(t, ref.SetHashing(selector.Ch3()))
		require.NoError(t, ref.SetServers(ips...))
		before := map[string]string{}
		agree := 0
		for i := range interopKeys {
			k := "ch3-" + strconv.Itoa(i)
			before[k] = pick(t, l, k)
			if before[k] == pick(t, &ref, k) {
				agree++
			}
		}
		require.NoError(t, pods[1].SetReady(e.ctx, false))
		l.waitServers(t, []string{ips[0], ips[2], ips[3]}, 20*time.Second)
		moved, spread := 0, map[string]int{}
		for k, was := range before {
			now := pick(t, l, k)
			switch {
			case was == ips[1]:
				spread[now]++
			case now != was:
				moved++
			}
		}
		require.NoError(t, pods[1].SetReady(e.ctx, true))
		l.waitServers(t, ips, 20*time.Second)
		back := 0
		for k, was := range before {
			if pick(t, l, k) == was {
				back++
			}
		}
		t.Logf("ch3 on Kubernetes: %d of %d keys as mcrouter's ch3 over the pods in ordinal order; mc-1 NotReady: %d other keys moved, its %d keys spread over %v; Ready again: %d of %d as before",
			agree, interopKeys, moved, spread[ips[0]]+spread[ips[2]]+spread[ips[3]], spread, back, interopKeys)
		assert.Equal(t, interopKeys, agree)
		assert.Zero(t, moved, "keys of pods that stayed moved")
		assert.Len(t, spread, 3, "mc-1's keys spread over the three others")
		assert.Equal(t, interopKeys, back)
	})
}
