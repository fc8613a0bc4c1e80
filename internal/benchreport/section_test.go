package main

import "testing"

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
