package dns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, in string
		want     Config
		wantErr  string
	}{
		{
			name: "a pod's",
			in:   "search cache.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
			want: Config{Servers: []string{"10.96.0.10:53"}, Search: []string{"cache.svc.cluster.local", "svc.cluster.local", "cluster.local"}, Ndots: 5},
		},
		{
			name: "two servers, IPv6 first, comments, and the default ndots",
			in:   "# generated\nnameserver ::1\n; other\nnameserver 127.0.0.53\n",
			want: Config{Servers: []string{"[::1]:53", "127.0.0.53:53"}, Ndots: 1},
		},
		{
			name: "the last search line wins, and a bad nameserver is skipped",
			in:   "domain example.com\nsearch a.example\nnameserver not-an-ip\nnameserver 192.0.2.1\noptions ndots:99 timeout:1\n",
			want: Config{Servers: []string{"192.0.2.1:53"}, Search: []string{"a.example"}, Ndots: 15},
		},
		{name: "no nameserver", in: "search example.com\n", wantErr: "no nameserver line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadConfig(filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "read the DNS configuration")

	p := filepath.Join(dir, "resolv.conf")
	require.NoError(t, os.WriteFile(p, []byte("nameserver 10.96.0.10\n"), 0o600))
	c, err := ReadConfig(p)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.96.0.10:53"}, c.Servers)
}

func TestCandidates(t *testing.T) {
	search := []string{"cache.svc.cluster.local", "svc.cluster.local."}
	tests := []struct {
		name, in string
		ndots    int
		search   []string
		want     []string
	}{
		{"a short name tries the search list first", "memcache", 5, search,
			[]string{"memcache.cache.svc.cluster.local", "memcache.svc.cluster.local", "memcache"}},
		{"a name with ndots dots is tried as given first", "a.b.c", 2, search,
			[]string{"a.b.c", "a.b.c.cache.svc.cluster.local", "a.b.c.svc.cluster.local"}},
		{"a name ending in a dot is absolute", "memcache.cache.svc.cluster.local.", 5, search,
			[]string{"memcache.cache.svc.cluster.local"}},
		{"no search list", "memcache", 5, nil, []string{"memcache"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Client{Search: tt.search, Ndots: tt.ndots}
			assert.Equal(t, tt.want, c.candidates(tt.in))
		})
	}
}
