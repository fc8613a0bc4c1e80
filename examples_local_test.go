package selector

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExampleLocal runs examples/local, as the README's "Try it without
// Kubernetes" does, against two memcached servers: the servers from
// -servers, then from MEMCACHE_SERVERS, where the second run finds the
// value that the first one's GetOrLoad cached; and against no memcached,
// where it fails with the address it tried.
func TestExampleLocal(t *testing.T) {
	goBin, err := exec.LookPath("go") // go test puts its own first on PATH
	if err != nil {
		t.Skipf("no go command to build examples/local: %v", err)
	}
	ms := startMemcached(t, 2)
	bin := filepath.Join(t.TempDir(), "local")
	build := exec.Command(goBin, "build", "-o", bin, "./examples/local")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./examples/local: %s", out)

	run := func(env []string, args ...string) (stdout, stderr string, err error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	servers := strings.Join(addrsOf(ms), ",")
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		loads string
	}{
		{"-servers", []string{"MEMCACHE_SERVERS="}, []string{"-servers", servers}, "loaded 1 time(s)"},
		{"MEMCACHE_SERVERS, a second run", []string{"MEMCACHE_SERVERS=" + servers}, nil, "loaded 0 time(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(tc.env, tc.args...)
			require.NoError(t, err, "stderr: %s", stderr)
			for _, want := range []string{
				`Get greeting: "hello", held by 127.0.0.1:`,
				`GetMulti greeting, color, size: 2 found (color "blue", held by 127.0.0.1:`,
				`GetOrLoad price:42 twice: "12.50", ` + tc.loads,
				`Get of a malformed key: selector: malformed key "a key with spaces": a space at byte 1`,
				"Stats:\n",
				"\n  " + ms[0].addr + " up\n",
				"\n  " + ms[1].addr + " up\n",
			} {
				require.Contains(t, stdout, want)
			}
		})
	}

	t.Run("no memcached", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		l.Close()
		_, stderr, err := run([]string{"MEMCACHE_SERVERS="}, "-servers", addr)
		require.Error(t, err)
		require.Contains(t, stderr, "connection refused (is memcached running at "+addr+"?)")
	})
}
