package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADME: the README's quick start is this program, character for
// character, so that the program the README shows is one that compiles.
func TestREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, ok := strings.Cut(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no \"## Quick start\" section")
	}
	_, block, ok := strings.Cut(quick, "```go\n")
	if !ok {
		t.Fatal("the README's quick start has no ```go block")
	}
	block, _, ok = strings.Cut(block, "```\n")
	if !ok {
		t.Fatal("the README's quick start block is not closed")
	}
	if block != string(program) {
		t.Errorf("the README's quick start differs from examples/readme/main.go; make them the same.\nREADME:\n%s\nmain.go:\n%s", block, program)
	}
}
