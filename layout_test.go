package selector

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLayout: the layers call down only (docs/architecture.md). No library
// file of an internal package imports the root, which imports them; their
// tests may, to drive the Client.
func TestLayout(t *testing.T) {
	const root = "github.com/kubecache/k8s-memcache-selector"
	files := 0
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			require.NotEqual(t, root, p, "%s imports the root package: internal packages call down only", path)
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 50, "the internal packages' library files were read")
}
