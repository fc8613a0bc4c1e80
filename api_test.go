package selector

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
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

// TestDocNamesExported: the doc comments of the exported API name only
// exported identifiers. A user reads them in go doc, where an unexported
// name (invalLog, metaWire.missed) leads nowhere. It flags, in the package
// comment and the docs of exported declarations, fields and interface
// methods, an unexported identifier of the package written in camel case
// or as type.member, and "see x" of an unexported x.
func TestDocNamesExported(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	unexported := map[string]bool{} // top-level names, and type.member
	var docs []*ast.CommentGroup
	for _, p := range pkgs {
		for _, f := range p.Files {
			docs = append(docs, f.Doc)
			for _, d := range f.Decls {
				unexportedOf(d, unexported)
				docs = append(docs, exportedDocs(d)...)
			}
		}
	}
	camel := regexp.MustCompile(`\b[a-z]+[A-Z0-9]\w*\b`)
	member := regexp.MustCompile(`\b([a-z]\w*)\.([a-z]\w*)\b`)
	see := regexp.MustCompile(`\bsee ([a-z]\w*)\b`)
	for _, g := range docs {
		if g == nil {
			continue
		}
		text, at := g.Text(), fset.Position(g.Pos())
		for _, w := range camel.FindAllString(text, -1) {
			if unexported[w] {
				t.Errorf("%s: doc names the unexported %s", at, w)
			}
		}
		for _, m := range member.FindAllStringSubmatch(text, -1) {
			if unexported[m[1]+"."+m[2]] {
				t.Errorf("%s: doc names the unexported %s", at, m[0])
			}
		}
		for _, m := range see.FindAllStringSubmatch(text, -1) {
			if unexported[m[1]] {
				t.Errorf("%s: doc says %q, which is unexported", at, m[0])
			}
		}
	}
}

// unexportedOf adds the unexported names d declares to names: funcs, types,
// vars and consts, and methods and fields as type.name.
func unexportedOf(d ast.Decl, names map[string]bool) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			names[d.Name.Name] = !d.Name.IsExported()
			return
		}
		typ := d.Recv.List[0].Type
		if s, ok := typ.(*ast.StarExpr); ok {
			typ = s.X
		}
		if id, ok := typ.(*ast.Ident); ok && !d.Name.IsExported() {
			names[id.Name+"."+d.Name.Name] = true
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.ValueSpec:
				for _, n := range s.Names {
					names[n.Name] = !n.IsExported()
				}
			case *ast.TypeSpec:
				names[s.Name.Name] = !s.Name.IsExported()
				if st, ok := s.Type.(*ast.StructType); ok {
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							names[s.Name.Name+"."+n.Name] = !n.IsExported()
						}
					}
				}
			}
		}
	}
}

// exportedDocs returns the doc comments of d's exported declarations, their
// exported fields and interface methods.
func exportedDocs(d ast.Decl) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	switch d := d.(type) {
	case *ast.FuncDecl:
		if len(exportedOf(d)) > 0 {
			docs = append(docs, d.Doc)
		}
	case *ast.GenDecl:
		if len(exportedOf(d)) == 0 {
			break
		}
		docs = append(docs, d.Doc)
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.ValueSpec:
				if s.Names[0].IsExported() {
					docs = append(docs, s.Doc, s.Comment)
				}
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					continue
				}
				docs = append(docs, s.Doc, s.Comment)
				var fields *ast.FieldList
				switch typ := s.Type.(type) {
				case *ast.StructType:
					fields = typ.Fields
				case *ast.InterfaceType:
					fields = typ.Methods
				}
				if fields != nil {
					for _, fl := range fields.List {
						if len(fl.Names) > 0 && fl.Names[0].IsExported() {
							docs = append(docs, fl.Doc, fl.Comment)
						}
					}
				}
			}
		}
	}
	return docs
}
