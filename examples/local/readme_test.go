package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADME: the README's code for a fixed list of servers, in "Try it
// without Kubernetes" and in "Choices", is this program's, line for line
// (the second with its own addresses), so that what the README shows
// compiles and checks every error. The root package's TestExampleLocal
// runs the program.
func TestREADME(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	b, err = os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	program := string(b)

	_, quick, _ := strings.Cut(readme, "\n## Quick start\n")
	if intro, _, _ := strings.Cut(quick, "```go\n"); !strings.Contains(intro, "](#try-it-without-kubernetes)") {
		t.Error("the README's quick start does not point to \"Try it without Kubernetes\" before its program")
	}
	for _, tc := range []struct {
		name   string
		after  string            // the README's text before the block
		indent string            // the block's, in the README
		subst  map[string]string // README text -> main.go's
	}{
		{"Try it without Kubernetes", "\n## Try it without Kubernetes\n", "", nil},
		{"Choices", "- **A fixed list of servers**", "  ", map[string]string{`"10.0.0.1:11211", "10.0.0.2:11211"`: "servers..."}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rest, ok := strings.Cut(readme, tc.after)
			if !ok {
				t.Fatalf("README.md has no %q", tc.after)
			}
			_, block, ok := strings.Cut(rest, "```go\n")
			if !ok {
				t.Fatal("no ```go block after it")
			}
			block, _, ok = strings.Cut(block, tc.indent+"```\n")
			if !ok {
				t.Fatal("the block is not closed")
			}
			var want strings.Builder // the block as main.go has it: in main, one tab in
			for _, line := range strings.SplitAfter(block, "\n") {
				line = strings.TrimPrefix(line, tc.indent)
				for from, to := range tc.subst {
					line = strings.ReplaceAll(line, from, to)
				}
				if line != "" {
					want.WriteString("\t" + line)
				}
			}
			if !strings.Contains(program, want.String()) {
				t.Errorf("the README's block is not in examples/local/main.go; make them the same.\nREADME, as main.go would have it:\n%s", want.String())
			}
		})
	}
}
