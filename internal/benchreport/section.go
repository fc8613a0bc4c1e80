package main

import (
	"bytes"
	"fmt"
	"os"
)

// rewriteSection replaces one section of the report at path with a new
// one made from its input, leaving the rest as it was: the history
// checker's long run takes half an hour, the whole report hours.
func rewriteSection(path, name string) error {
	var sec bytes.Buffer
	switch name {
	case "histcheck":
		if *histFile == "" {
			return fmt.Errorf("-section histcheck needs -histcheck, the output of make histcheck-long")
		}
		if err := histcheckSection(&sec, *histFile); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-section %q: the sections that can be rewritten alone are: histcheck", name)
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-section rewrites a report that exists (make bench writes it): %w", err)
	}
	return os.WriteFile(path, replaceSection(doc, sec.Bytes()), 0o644)
}

// replaceSection returns doc with the level-2 section that sec's first
// line heads replaced by sec; where doc has no such section, sec is
// appended.
func replaceSection(doc, sec []byte) []byte {
	heading, _, _ := bytes.Cut(sec, []byte("\n"))
	heading = append(heading, '\n')
	start := -1
	if bytes.HasPrefix(doc, heading) {
		start = 0
	} else if i := bytes.Index(doc, append([]byte("\n"), heading...)); i >= 0 {
		start = i + 1
	}
	if start < 0 {
		out := bytes.TrimRight(doc, "\n")
		return append(append(out, "\n\n"...), sec...)
	}
	end := len(doc)
	if i := bytes.Index(doc[start+len(heading):], []byte("\n## ")); i >= 0 {
		end = start + len(heading) + i + 1
	}
	out := append([]byte(nil), doc[:start]...)
	out = append(out, sec...)
	if end < len(doc) && !bytes.HasSuffix(sec, []byte("\n\n")) {
		out = append(out, '\n')
	}
	return append(out, doc[end:]...)
}
