package main

import (
	"strings"
	"testing"
)

func TestReplaceSection(t *testing.T) {
	sec := "## B\n\nnew\n\n"
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"middle", "# R\n\n## A\n\na\n\n## B\n\nold\nold\n\n## C\n\nc\n", "# R\n\n## A\n\na\n\n## B\n\nnew\n\n## C\n\nc\n"},
		{"last", "# R\n\n## A\n\na\n\n## B\n\nold\n", "# R\n\n## A\n\na\n\n## B\n\nnew\n\n"},
		{"first", "## B\n\nold\n\n## C\n\nc\n", "## B\n\nnew\n\n## C\n\nc\n"},
		{"absent", "# R\n\n## A\n\na\n\n", "# R\n\n## A\n\na\n\n## B\n\nnew\n\n"},
		{"a heading that only starts the same", "# R\n\n## Bx\n\nbx\n", "# R\n\n## Bx\n\nbx\n\n## B\n\nnew\n\n"},
		{"a level-3 heading inside", "## B\n\nold\n\n### B.1\n\nold\n\n## C\n", "## B\n\nnew\n\n## C\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(replaceSection([]byte(tc.doc), []byte(sec))); got != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestReplaceScenarios(t *testing.T) {
	doc := "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nold a\n\n### B\n\nold b\n\n## History\n\nh\n"
	for _, tc := range []struct {
		name, e2e, want string
	}{
		{"one replaced", "### B\n\nnew b\n", "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nold a\n\n### B\n\nnew b\n\n## History\n\nh\n"},
		{"first replaced", "### A\n\nnew a\n\n", "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nnew a\n\n### B\n\nold b\n\n## History\n\nh\n"},
		{"one added", "### C\n\nc\n", "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nold a\n\n### B\n\nold b\n\n### C\n\nc\n\n## History\n\nh\n"},
		{"both kinds", "### A\n\nnew a\n\n### C\n\nc\n", "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nnew a\n\n### B\n\nold b\n\n### C\n\nc\n\n## History\n\nh\n"},
		{"a heading that only starts the same", "### B 2\n\nb2\n", "# R\n\n## On a real control plane\n\nFrom make bench-e2e.\n\n### A\n\nold a\n\n### B\n\nold b\n\n### B 2\n\nb2\n\n## History\n\nh\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := replaceScenarios([]byte(doc), []byte(tc.e2e), "")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	got, err := replaceScenarios([]byte(doc), []byte("### B\n\nnew b\n"), "(From make x.)")
	if want := "### B\n\nnew b\n\n(From make x.)\n\n## History"; err != nil || !strings.Contains(string(got), want) {
		t.Errorf("with a note: got %q, %v; want it to contain %q", got, err, want)
	}
	if _, err := replaceScenarios([]byte("# R\n\n## History\n"), []byte("### A\n"), ""); err == nil {
		t.Error("a report without the e2e section: no error")
	}
}
