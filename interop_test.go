package selector

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The live-peer interop checks: Ketama must place every key where
// php-memcached (OPT_LIBKETAMA_COMPATIBLE), libmemcached
// (MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED) and twemproxy (distribution: ketama,
// hash: md5) do, given the same servers. Each peer is the real client,
// installed from Debian packages (make test-deps), talking to real
// memcached on loopback; nothing here reimplements their hashing, so a
// disagreement cannot be a shared mistake. TestInteropPeersAgree checks the
// peers against each other, which proves the harness without our code.

// interopKeys is how many keys each check writes and reads.
const interopKeys = 10000

// An interopPeer is another client of the pool, configured for ketama.
type interopPeer struct {
	name string
	// write sets prefix0 .. prefix(interopKeys-1), each to its own key as
	// the value, through the peer's client over servers.
	write func(t *testing.T, servers []string, prefix string)
	// read gets those keys through the peer and returns how many it found
	// with the right value.
	read func(t *testing.T, servers []string, prefix string) int
	// locate, where the peer can tell a key's server without a connection
	// (php-memcached, libmemcached), returns the server of each of prefix0
	// .. prefix(count-1) as the peer names it (host:port, a host bare);
	// env is added to the peer's environment.
	locate func(t *testing.T, servers []string, prefix string, count int, env ...string) map[string]string
}

// needPeer skips t for a missing peer, or fails it where
// SELECTOR_REQUIRE_PEERS is set (make test, after make test-deps).
func needPeer(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("SELECTOR_REQUIRE_PEERS") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// interopKeyNames returns the keys of prefix, as the peers write them.
func interopKeyNames(prefix string) []string {
	keys := make([]string, interopKeys)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// peerSpec is servers as the peer programs take them: host:port:weight,
// weight 1 (every peer's and Ketama's default).
func peerSpec(servers []string) string {
	spec := make([]string, len(servers))
	for i, s := range servers {
		spec[i] = peerServer(s) + ":1"
	}
	return strings.Join(spec, ",")
}

// peerServer is a server as its users give it to the peers: host:port with
// an IPv6 host bare, for libmemcached and php-memcached take the host and
// the port apart (memcached_server_add("::1", 11212)), and twemproxy reads
// host:port:weight from the end ("::1:11212:1"); "[::1]" is no host to any
// of them.
func peerServer(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return s
	}
	return host + ":" + port
}

// programPeer is a peer run as a program, argv followed by the servers,
// write or read, the prefix and the count; a read prints its hits.
func programPeer(name string, argv ...string) interopPeer {
	run := func(t *testing.T, servers []string, mode, prefix string, count int, env ...string) string {
		t.Helper()
		args := slices.Concat(argv[1:], []string{peerSpec(servers), mode, prefix, strconv.Itoa(count)})
		var stderr bytes.Buffer
		cmd := exec.Command(argv[0], args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s: %v: %s", name, mode, err, stderr.Bytes())
		}
		return strings.TrimSpace(string(out))
	}
	return interopPeer{
		name:  name,
		write: func(t *testing.T, servers []string, prefix string) { run(t, servers, "write", prefix, interopKeys) },
		read: func(t *testing.T, servers []string, prefix string) int {
			out := run(t, servers, "read", prefix, interopKeys)
			n, err := strconv.Atoi(out)
			if err != nil {
				t.Fatalf("%s read printed %q, not a count", name, out)
			}
			return n
		},
		locate: func(t *testing.T, servers []string, prefix string, count int, env ...string) map[string]string {
			at := make(map[string]string, count)
			for line := range strings.Lines(run(t, servers, "locate", prefix, count, env...)) {
				key, server, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
				if !ok {
					t.Fatalf("%s locate printed %q, not key TAB server", name, line)
				}
				at[key] = server
			}
			if len(at) != count {
				t.Fatalf("%s located %d keys of %d", name, len(at), count)
			}
			return at
		},
	}
}

// phpPeer is php-memcached, through testdata/interop/peer.php: see there
// for its options.
func phpPeer(t *testing.T) interopPeer {
	t.Helper()
	php, err := exec.LookPath("php")
	if err != nil {
		needPeer(t, "php (php-cli) is not installed (make test-deps installs it): %v", err)
	}
	if out, err := exec.Command(php, "-r", `exit(class_exists("Memcached") ? 0 : 1);`).CombinedOutput(); err != nil {
		needPeer(t, "php has no Memcached class: php-memcached is not installed (make test-deps installs it): %v %s", err, out)
	}
	return programPeer("php-memcached", php, filepath.Join("testdata", "interop", "peer.php"))
}

// libmemcachedPeer is libmemcached itself, through testdata/interop/peer.c,
// compiled here with $CC (default cc).
func libmemcachedPeer(t *testing.T) interopPeer {
	t.Helper()
	cc, err := exec.LookPath(cmp.Or(os.Getenv("CC"), "cc"))
	if err != nil {
		needPeer(t, "no C compiler for the libmemcached peer (make test-deps installs gcc and libc6-dev): %v", err)
	}
	// The headers apart from the build, so that a missing package is a
	// skip and a program that does not compile is a failure.
	probe := exec.Command(cc, "-E", "-x", "c", "-o", os.DevNull, "-")
	probe.Stdin = strings.NewReader("#include <libmemcached/memcached.h>\n")
	if out, err := probe.CombinedOutput(); err != nil {
		needPeer(t, "libmemcached's headers are not installed (make test-deps installs libmemcached-dev): %v %s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "peer")
	if out, err := exec.Command(cc, "-O1", "-Wall", "-o", bin, filepath.Join("testdata", "interop", "peer.c"), "-lmemcached").CombinedOutput(); err != nil {
		t.Fatalf("building the libmemcached peer: %v\n%s", err, out)
	}
	return programPeer("libmemcached", bin)
}

// twemproxyPeer is nutcracker in front of the servers, one proxy per server
// list (a new list is a new proxy, as a restart with a new configuration
// would be), with gomemcache writing and reading through it.
func twemproxyPeer(t *testing.T) interopPeer {
	t.Helper()
	bin, err := exec.LookPath("nutcracker")
	if err != nil {
		needPeer(t, "nutcracker (twemproxy) is not installed (make test-deps installs it): %v", err)
	}
	dir := t.TempDir()
	proxies := map[string]*memcache.Client{}
	proxy := func(t *testing.T, servers []string) *memcache.Client {
		t.Helper()
		if c := proxies[peerSpec(servers)]; c != nil {
			return c
		}
		addr := startNutcracker(t, bin, filepath.Join(dir, strconv.Itoa(len(proxies))), servers)
		c := memcache.New(addr)
		c.Timeout, c.MaxIdleConns = 5*time.Second, 8
		proxies[peerSpec(servers)] = c
		return c
	}
	return interopPeer{
		name: "twemproxy",
		write: func(t *testing.T, servers []string, prefix string) {
			setAll(t, proxy(t, servers).Set, interopKeyNames(prefix))
		},
		read: func(t *testing.T, servers []string, prefix string) int {
			return countHits(t, proxy(t, servers).GetMulti, interopKeyNames(prefix))
		},
	}
}

// nutcrackerConfig is the pool in twemproxy's ketama with md5 keys (its
// default hash is fnv1a_64), servers host:port:weight, which it names
// host:port as libmemcached does (the weight is not hashed), and no
// ejection: a server that is slow for a moment must not change the ring.
const nutcrackerConfig = `interop:
  listen: %s
  hash: md5
  distribution: ketama
  auto_eject_hosts: false
  preconnect: true
  servers:
%s`

// startNutcracker starts nutcracker over servers, its files named base.*,
// and returns its address once it listens; the test stops it.
func startNutcracker(t *testing.T, bin, base string, servers []string) string {
	t.Helper()
	var list strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&list, "   - %s:1\n", peerServer(s))
	}
	var err error
	for range 3 { // a free port can be taken before nutcracker binds it
		addr, stats := freeLoopback(t), freeLoopback(t)
		_, statsPort, _ := net.SplitHostPort(stats)
		if err := os.WriteFile(base+".yml", fmt.Appendf(nil, nutcrackerConfig, addr, list.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		// The stats port defaults to 0.0.0.0:22222: keep it on loopback, free.
		cmd := exec.Command(bin, "-c", base+".yml", "-o", base+".log", "-a", "127.0.0.1", "-s", statsPort, "-p", base+".pid")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop := func() { cmd.Process.Kill(); <-exited }
		if err = waitListening(addr, exited); err == nil {
			t.Cleanup(stop)
			return addr
		}
		stop()
		log, _ := os.ReadFile(base + ".log")
		err = fmt.Errorf("%v; its log:\n%s", err, log)
	}
	t.Fatalf("nutcracker did not start: %v", err)
	return ""
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitListening(addr string, exited <-chan struct{}) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			return errors.New("it exited")
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// setAll sets each key to itself with flags 0, eight at a time.
func setAll(t *testing.T, set func(*memcache.Item) error, keys []string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for w := range errs {
		wg.Go(func() {
			for i := w; i < len(keys) && errs[w] == nil; i += len(errs) {
				errs[w] = set(&memcache.Item{Key: keys[i], Value: []byte(keys[i])})
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "setting the keys")
	}
}

// countHits gets keys in batches and returns how many have their own key
// as the value.
func countHits(t *testing.T, getMulti func([]string) (map[string]*memcache.Item, error), keys []string) int {
	t.Helper()
	hits := 0
	for i := 0; i < len(keys); i += 100 {
		items, err := getMulti(keys[i:min(i+100, len(keys))])
		require.NoError(t, err, "getting the keys")
		for k, it := range items {
			if string(it.Value) == k {
				hits++
			}
		}
	}
	return hits
}

// locate looks for keys in every server, straight, and returns where each
// is (absent: nowhere). A key in two places, or with a value or flags that
// are not what every writer here sets (its own key, 0), fails t: the peers
// would not be speaking plain memcached to each other.
func locate(t *testing.T, direct map[string]*memcache.Client, keys []string) map[string]string {
	t.Helper()
	at := make(map[string]string, len(keys))
	for addr, c := range direct {
		for i := 0; i < len(keys); i += 500 {
			items, err := c.GetMulti(keys[i:min(i+500, len(keys))])
			require.NoError(t, err, "reading %s", addr)
			for k, it := range items {
				if string(it.Value) != k || it.Flags != 0 {
					t.Fatalf("%q at %s has value %q flags %d, want its key and 0", k, addr, it.Value, it.Flags)
				}
				if at[k] != "" {
					t.Fatalf("%q is at both %s and %s", k, at[k], addr)
				}
				at[k] = addr
			}
		}
	}
	return at
}

// interopRig is memcached servers for the checks and the two server lists
// that every side is given in turn: 4 servers, then one added and one
// removed.
type interopRig struct {
	lists  [][]string
	phases []string
	direct map[string]*memcache.Client // to each server, by address
}

// newInteropRig starts the rig's servers on loopback: 127.0.0.1, or with
// ipv6 [::1], where the third server takes port 11211 if it is free, which
// the peers leave out of the names they hash.
func newInteropRig(t *testing.T, ipv6 bool) *interopRig {
	var all []string
	if ipv6 {
		all = startMemcached6(t, 5)
	} else {
		all = addrsOf(startMemcached(t, 5))
	}
	r := &interopRig{
		lists:  [][]string{all[:4], all[1:]},
		phases: []string{"4 servers", "a 5th added and the 1st removed"},
		direct: map[string]*memcache.Client{},
	}
	for _, a := range all {
		c := memcache.New(a)
		c.Timeout = 5 * time.Second
		r.direct[a] = c
	}
	return r
}

// startMemcached6 starts n memcached servers on [::1] and returns their
// addresses, the third at [::1]:11211 if that port is free; the test stops
// them. It skips t where the machine has no IPv6 loopback.
func startMemcached6(t *testing.T, n int) []string {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		needPeer(t, "memcached is not installed (make test-deps installs it): %v", err)
	}
	if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
		needPeer(t, "no IPv6 loopback here: %v", err)
	} else {
		l.Close()
	}
	addrs := make([]string, n)
	for i := range addrs {
		if i == 2 && serveMemcached(t, bin, "[::1]:11211") == nil {
			addrs[i] = "[::1]:11211"
			continue
		}
		for try := 0; ; try++ {
			addrs[i] = freeAddr(t, "[::1]:0")
			if err := serveMemcached(t, bin, addrs[i]); err == nil {
				break
			} else if try == 3 {
				t.Fatal(err)
			}
		}
	}
	if addrs[2] != "[::1]:11211" {
		t.Logf("[::1]:11211 is taken: every IPv6 server has another port")
	}
	return addrs
}

// freeAddr returns an address that a listener on addr (port 0) was given,
// closed again.
func freeAddr(t *testing.T, addr string) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serveMemcached starts memcached at addr, a free host:port on loopback,
// and returns once it listens there, or an error if it does not (the port
// was taken, or is); the test stops it.
func serveMemcached(t *testing.T, bin, addr string) error {
	t.Helper()
	if l, err := net.Listen("tcp", addr); err != nil {
		return err
	} else {
		l.Close()
	}
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "-l", host, "-p", port, "-U", "0", "-m", "16", "-t", "1")
	if os.Getuid() == 0 {
		cmd.Args = append(cmd.Args, "-u", "nobody")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() { cmd.Process.Kill(); <-exited }
	err := waitListening(addr, exited)
	if err == nil {
		// memcached that cannot bind exits at once: if it is still up, the
		// listener that answered is its own.
		select {
		case <-exited:
			err = errors.New("it exited")
		case <-time.After(50 * time.Millisecond):
			t.Cleanup(stop)
			return nil
		}
	}
	stop()
	return fmt.Errorf("memcached at %s: %v: %s", addr, err, stderr.Bytes())
}

// The peers take IPv6 hosts bare, and hash them so: "::1:11212-0", and
// "::1-0" on port 11211 as for any host.
func TestInteropPHP(t *testing.T)          { testInteropFamilies(t, phpPeer(t)) }
func TestInteropLibmemcached(t *testing.T) { testInteropFamilies(t, libmemcachedPeer(t)) }
func TestInteropTwemproxy(t *testing.T)    { testInteropFamilies(t, twemproxyPeer(t)) }

func testInteropFamilies(t *testing.T, p interopPeer) {
	t.Run("IPv4", func(t *testing.T) { testInterop(t, p, false) })
	t.Run("IPv6", func(t *testing.T) { testInterop(t, p, true) })
}

// testInterop checks Ketama against p both ways, over each server list:
// (a) every key p writes is on the server PickServer picks, where a plain
// gomemcache client reads it; (b) p finds every key our Client writes.
func testInterop(t *testing.T, p interopPeer, ipv6 bool) {
	start := time.Now()
	rig := newInteropRig(t, ipv6)
	var ss ServerList
	require.NoError(t, ss.SetHashing(Ketama()))
	require.NoError(t, ss.SetServers(rig.lists[0]...))
	c, err := NewClientFromList(&ss, WithTimeout(5*time.Second))
	require.NoError(t, err)
	defer c.Close()

	for phase, list := range rig.lists {
		if phase > 0 {
			require.NoError(t, ss.SetServers(list...))
			// The Client follows the list in the background: write by the new one.
			eventually(t, "the Client to follow the new list", func() bool { return c.rt.Load().base == ss.ring.Load() })
		}
		at := rig.phases[phase]

		prefix := fmt.Sprintf("interop:%s:%d:", p.name, phase)
		keys := interopKeyNames(prefix)
		p.write(t, list, prefix)
		where := locate(t, rig.direct, keys)
		found, elsewhere, missing, example := 0, 0, 0, ""
		for _, k := range keys {
			a, err := ss.PickServer(k)
			require.NoError(t, err)
			switch where[k] {
			case a.String():
				found++
			case "":
				missing++
			default:
				elsewhere++
				if example == "" {
					example = fmt.Sprintf("; e.g. %q is on %s, selector picks %s", k, where[k], a)
				}
			}
		}
		t.Logf("%s -> selector (%s): %d of %d keys found", p.name, at, found, len(keys))
		if found != len(keys) {
			t.Errorf("%s -> selector (%s): only %d of %d keys on the server Ketama picks: %d on another, %d written nowhere%s",
				p.name, at, found, len(keys), elsewhere, missing, example)
		}

		prefix = fmt.Sprintf("interop:selector-%s:%d:", p.name, phase)
		keys = interopKeyNames(prefix)
		setAll(t, c.Set, keys)
		hits := p.read(t, list, prefix)
		t.Logf("selector -> %s (%s): %d of %d keys found", p.name, at, hits, len(keys))
		if hits != len(keys) {
			t.Errorf("selector -> %s (%s): %s found only %d of the %d keys our Client wrote with Ketama", p.name, at, p.name, hits, len(keys))
		}
	}
	t.Logf("%s: %v", p.name, time.Since(start).Round(time.Millisecond))
}

// TestInteropPeersAgree checks the harness without our code: php-memcached,
// libmemcached and twemproxy, configured as the checks above configure
// them, must place every key on the same server over each server list,
// which each proves by finding all of every other one's keys. It also
// checks that every writer spread its keys over exactly the list's servers.
func TestInteropPeersAgree(t *testing.T) {
	peers := []interopPeer{phpPeer(t), libmemcachedPeer(t), twemproxyPeer(t)}
	t.Run("IPv4", func(t *testing.T) { testPeersAgree(t, peers, false) })
	t.Run("IPv6", func(t *testing.T) { testPeersAgree(t, peers, true) })
}

func testPeersAgree(t *testing.T, peers []interopPeer, ipv6 bool) {
	start := time.Now()
	rig := newInteropRig(t, ipv6)
	for phase, list := range rig.lists {
		at := rig.phases[phase]
		prefix := func(p interopPeer) string { return fmt.Sprintf("interop:agree:%s:%d:", p.name, phase) }
		for _, w := range peers {
			w.write(t, list, prefix(w))
			where := locate(t, rig.direct, interopKeyNames(prefix(w)))
			perServer := map[string]int{}
			for _, a := range where {
				perServer[a]++
			}
			t.Logf("%s (%s): its %d keys are on %d servers: %v", w.name, at, len(where), len(perServer), perServer)
			require.Len(t, where, interopKeys, "%s wrote only %d of its keys anywhere", w.name, len(where))
			for _, a := range list {
				require.NotZero(t, perServer[a], "%s put none of its keys on %s", w.name, a)
			}
			require.Len(t, perServer, len(list), "%s put keys on a server not in its list", w.name)
		}
		for _, w := range peers {
			for _, r := range peers {
				if r.name == w.name {
					continue
				}
				hits := r.read(t, list, prefix(w))
				t.Logf("%s -> %s (%s): %d of %d keys found", w.name, r.name, at, hits, interopKeys)
				if hits != interopKeys {
					t.Errorf("%s -> %s (%s): %s found only %d of the %d keys %s wrote", w.name, r.name, at, r.name, hits, interopKeys, w.name)
				}
			}
		}
	}
	t.Logf("peers agree: %v", time.Since(start).Round(time.Millisecond))
}

// TestInteropNames checks the names Ketama hashes against php-memcached's
// and libmemcached's own placement (getServerByKey, memcached_server_by_key,
// which connect to nothing, so the servers need not exist): IPv6 servers,
// whose hosts the peers take bare ("::1-i", "::1:11212-i"), on port 11211,
// which they leave out, as for IPv4, and on others.
func TestInteropNames(t *testing.T) {
	peers := []interopPeer{phpPeer(t), libmemcachedPeer(t)}
	for _, list := range [][]string{
		{"[::1]:11211", "[::1]:11212", "[fd00::2]:11211", "[fd00::3]:11311", "[2001:db8::1:5]:11211"},
		{"10.0.0.1:11211", "10.0.0.2:11212", "[fd00::2]:11211", "[fd00::2]:11212"},
	} {
		var ss ServerList
		require.NoError(t, ss.SetHashing(Ketama()))
		require.NoError(t, ss.SetServers(list...))
		for _, p := range peers {
			at := p.locate(t, list, "names:", interopKeys)
			same, example := 0, ""
			for k, server := range at {
				a, err := ss.PickServer(k)
				require.NoError(t, err)
				if peerServer(a.String()) == server {
					same++
				} else if example == "" {
					example = fmt.Sprintf("; e.g. %q: %s has %s, selector %s", k, p.name, server, a)
				}
			}
			t.Logf("%s, %v: %d of %d keys on the same server", p.name, list, same, len(at))
			if same != len(at) {
				t.Errorf("%s, %v: only %d of %d keys on the same server%s", p.name, list, same, len(at), example)
			}
		}
	}
}

// TestInteropKetamaTies: two servers with a point in common (see
// findKetamaTies), one on a 4-digit port and one on a 5-digit one, and a
// key of that point. libmemcached and php-memcached put it on the server
// listed first (continuum_item_cmp sorts equal points by the servers'
// list position), as Ketama does over SetServers' list. twemproxy puts it
// on the same server whatever its configuration's order: it sorts its
// servers by name, the shorter first (conf_validate_server), and its
// qsort of the points by value alone keeps them in that order (glibc's
// qsort is a merge sort); Ketama ranks discovered servers so.
func TestInteropKetamaTies(t *testing.T) {
	peers := []interopPeer{phpPeer(t), libmemcachedPeer(t), twemproxyPeer(t)}
	bin, err := exec.LookPath("memcached")
	if err != nil {
		needPeer(t, "memcached is not installed (make test-deps installs it): %v", err)
	}
	// The peers write prefix0 .. prefix(interopKeys-1): a tie whose key is
	// among them, where the shorter name is the higher one byte by byte
	// (9xxx and 1xxxx), on two free ports.
	var tie ketamaTie
	for _, c := range findKetamaTies("127.0.0.1", 8000, 14000, 100) {
		n, _ := strconv.Atoi(strings.TrimPrefix(c.key, "tie:"))
		if n < interopKeys && len(c.a) < len(c.b) && c.a > c.b &&
			serveMemcached(t, bin, c.a) == nil && serveMemcached(t, bin, c.b) == nil {
			tie = c
			break
		}
	}
	if tie.key == "" {
		t.Fatal("no tie of a 9xxx port and a 1xxxx one with its key among the keys written and its ports free")
	}
	t.Logf("%s and %s share a point; %q goes to it", tie.a, tie.b, tie.key)
	direct := map[string]*memcache.Client{}
	for _, a := range []string{tie.a, tie.b} {
		direct[a] = memcache.New(a)
		direct[a].Timeout = 5 * time.Second
	}
	for _, list := range [][]string{{tie.a, tie.b}, {tie.b, tie.a}} {
		var ss ServerList
		require.NoError(t, ss.SetHashing(Ketama()))
		require.NoError(t, ss.SetServers(list...))
		a, err := ss.PickServer(tie.key)
		require.NoError(t, err)
		assert.Equal(t, list[0], a.String(), "Ketama over %v: %q", list, tie.key)
		for _, p := range peers {
			for _, c := range direct {
				require.NoError(t, c.DeleteAll())
			}
			p.write(t, list, "tie:")
			got := locate(t, direct, []string{tie.key})[tie.key]
			t.Logf("%s over %v: %q on %s", p.name, list, tie.key, got)
			want := list[0]
			if p.name == "twemproxy" {
				want = tie.a // the shorter name
			}
			assert.Equal(t, want, got, "%s over %v: %q", p.name, list, tie.key)
		}
	}
	// Discovered, the servers rank as twemproxy's.
	ms := []member{{id: "memcache-0:11211", addr: &staticAddr{"tcp", tie.b}}, {id: "memcache-1:11211", addr: &staticAddr{"tcp", tie.a}}}
	r, err := newAltRing(Ketama(), ms)
	require.NoError(t, err)
	assert.Equal(t, tie.a, r.addrs[r.owner(uint64(md5Key(tie.key)))].str, "discovered: %q", tie.key)
}
