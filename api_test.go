package selector

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite testdata/api.txt with the package's exported identifiers")

// TestExportedSurface holds the exported API to testdata/api.txt, the list
// that docs/api.md judges: an identifier added, removed or renamed fails it
// until the file is rewritten (go test -run TestExportedSurface -update-api .)
// and docs/api.md and CHANGELOG.md say why.
func TestExportedSurface(t *testing.T) {
	got := strings.Join(exportedSurface(t, "."), "\n") + "\n"
	if *updateAPI {
		if err := os.WriteFile("testdata/api.txt", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile("testdata/api.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		g, w := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for _, l := range g {
			if !slices.Contains(w, l) {
				t.Errorf("exported, not in testdata/api.txt: %s", l)
			}
		}
		for _, l := range w {
			if !slices.Contains(g, l) {
				t.Errorf("in testdata/api.txt, no longer exported: %s", l)
			}
		}
		t.Error("the exported surface changed: judge it in docs/api.md, then rewrite the list with -update-api")
	}
}

// exportedSurface lists the exported identifiers of the package in dir, as
// go doc -all shows them: consts, vars, funcs, types, methods (of exported
// types, and of exported interfaces) and the exported fields of exported
// structs, one a line, sorted.
func exportedSurface(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				out = append(out, exportedOf(d)...)
			}
		}
	}
	slices.Sort(out)
	return out
}

func exportedOf(d ast.Decl) []string {
	var out []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			break
		}
		if d.Recv == nil {
			return []string{"func " + d.Name.Name}
		}
		typ, star := d.Recv.List[0].Type, ""
		if s, ok := typ.(*ast.StarExpr); ok {
			typ, star = s.X, "*"
		}
		if id, ok := typ.(*ast.Ident); ok && id.IsExported() {
			out = append(out, fmt.Sprintf("method (%s%s) %s", star, id.Name, d.Name.Name))
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						out = append(out, d.Tok.String()+" "+n.Name)
					}
				}
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					continue
				}
				out = append(out, "type "+s.Name.Name)
				switch typ := s.Type.(type) {
				case *ast.StructType:
					for _, fl := range typ.Fields.List {
						for _, n := range fl.Names {
							if n.IsExported() {
								out = append(out, "field "+s.Name.Name+"."+n.Name)
							}
						}
					}
				case *ast.InterfaceType:
					for _, fl := range typ.Methods.List {
						for _, n := range fl.Names {
							if n.IsExported() {
								out = append(out, "method "+s.Name.Name+"."+n.Name)
							}
						}
					}
				}
			}
		}
	}
	return out
}
