// Package ringtest is the test data that internal/ring's tests and the
// root package's share: libmemcached's Ketama test, which both check, one
// on the continuum and one through PickServer.
package ringtest

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// LibmemcachedServers are the servers and weights of libmemcached's Ketama
// test (testdata/ketama_libmemcached.tsv at the root).
var LibmemcachedServers = []struct {
	Addr   string
	Weight uint32
}{
	{"10.0.1.1:11211", 600}, {"10.0.1.2:11211", 300}, {"10.0.1.3:11211", 200}, {"10.0.1.4:11211", 350},
	{"10.0.1.5:11211", 1000}, {"10.0.1.6:11211", 800}, {"10.0.1.7:11211", 950}, {"10.0.1.8:11211", 100},
}

// KetamaCase is one of the test's keys: its md5 hash, the continuum point
// it hits and its server's host.
type KetamaCase struct {
	Key         string
	Hash, Point uint32
	Server      string
}

// ReadKetamaCases reads the test's 99 keys from path, which each test
// package names relative to its own directory.
func ReadKetamaCases(t testing.TB, path string) []KetamaCase {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var cs []KetamaCase
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		fs := strings.Split(sc.Text(), "\t")
		require.Len(t, fs, 4, sc.Text())
		h1, err1 := strconv.ParseUint(fs[1], 10, 32)
		h2, err2 := strconv.ParseUint(fs[2], 10, 32)
		require.NoError(t, err1)
		require.NoError(t, err2)
		cs = append(cs, KetamaCase{fs[0], uint32(h1), uint32(h2), fs[3]})
	}
	require.NoError(t, sc.Err())
	require.Len(t, cs, 99)
	return cs
}
