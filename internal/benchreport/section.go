package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"time"
)

// rewriteSection replaces one section of the report at path with a new
// one made from its input, leaving the rest as it was: the history
// checker's long run takes half an hour, the whole report hours. The e2e
// section is rewritten by its scenarios: each of the -e2e file's replaces
// the one of the same heading, or is added, and the others stay (the
// moves at a million keys a pod take half an hour alone).
func rewriteSection(path, name string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-section rewrites a report that exists (make bench writes it): %w", err)
	}
	var sec bytes.Buffer
	switch name {
	case "histcheck":
		if *histFile == "" {
			return fmt.Errorf("-section histcheck needs -histcheck, the output of make histcheck-long")
		}
		if err := histcheckSection(&sec, *histFile); err != nil {
			return err
		}
		doc = replaceSection(doc, sec.Bytes())
	case "moves":
		if *movesFile == "" {
			return fmt.Errorf("-section moves needs -moves, the output of BenchmarkMoves")
		}
		gs, err := movesSection(&sec, *movesFile)
		if err != nil {
			return err
		}
		if start, _ := sectionBounds(doc, []byte("## Moves\n")); start < 0 {
			doc = insertBefore(doc, []byte("## Routing quality\n"), sec.Bytes())
		} else {
			doc = replaceSection(doc, sec.Bytes())
		}
		doc = replaceGoals(doc, gs)
	case "e2e":
		b, err := os.ReadFile(*e2eFile)
		if err != nil {
			return fmt.Errorf("-section e2e needs -e2e, the report of the e2e scenarios run (e2e/run.sh -e2e.report): %w", err)
		}
		from := fmt.Sprintf("(From `%s` on %s, apart from the rest of this section.)", *command, time.Now().UTC().Format("2006-01-02 15:04 MST"))
		if doc, err = replaceScenarios(doc, b, from); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-section %q: the sections that can be rewritten alone are: histcheck, moves, e2e", name)
	}
	return os.WriteFile(path, doc, 0o644)
}

// e2eHeading heads the report's section of e2e scenarios.
const e2eHeading = "## On a real control plane\n"

// replaceScenarios returns doc with each level-3 section of e2e (a
// scenario's figures), and from as its last paragraph, in place of the one
// of the same heading in doc's e2e section, or added at that section's end.
func replaceScenarios(doc, e2e []byte, from string) ([]byte, error) {
	start, end := sectionBounds(doc, []byte(e2eHeading), "\n## ")
	if start < 0 {
		return nil, fmt.Errorf("the report has no section %q: make bench-e2e writes it first", bytes.TrimSpace([]byte(e2eHeading)))
	}
	part := bytes.Clone(doc[start:end])
	scenarios := bytes.Split(e2e, []byte("\n### "))
	for i, sc := range scenarios {
		if i > 0 {
			sc = append([]byte("### "), sc...)
		}
		if !bytes.HasPrefix(sc, []byte("### ")) {
			continue // what comes before the first scenario
		}
		sc = append(bytes.TrimRight(sc, "\n"), "\n\n"...)
		if from != "" {
			sc = append(append(sc, from...), "\n\n"...)
		}
		part = replaceHeaded(part, sc, "\n### ", "\n## ")
	}
	return splice(doc, start, end, part), nil
}

// splice returns a new slice: doc with its bytes start to end replaced by mid.
func splice(doc []byte, start, end int, mid []byte) []byte {
	return slices.Concat(doc[:start], mid, doc[end:])
}

// insertBefore returns doc with sec before the section that heading
// heads, or at its end if it has none.
func insertBefore(doc, heading, sec []byte) []byte {
	start, _ := sectionBounds(doc, heading)
	if start < 0 {
		return replaceSection(doc, sec)
	}
	return splice(doc, start, start, sec)
}

// replaceSection returns doc with the level-2 section that sec's first
// line heads replaced by sec; where doc has no such section, sec is
// appended.
func replaceSection(doc, sec []byte) []byte { return replaceHeaded(doc, sec, "\n## ") }

// sectionBounds returns where the section that heading (a line, with its
// newline) starts in doc and where it ends: at the first of ends (the
// next heading of its level or above), or doc's end. start is -1 if doc
// has no such section.
func sectionBounds(doc, heading []byte, ends ...string) (start, end int) {
	start = -1
	if bytes.HasPrefix(doc, heading) {
		start = 0
	} else if i := bytes.Index(doc, append([]byte("\n"), heading...)); i >= 0 {
		start = i + 1
	}
	if start < 0 {
		return -1, -1
	}
	end = len(doc)
	for _, e := range ends {
		if i := bytes.Index(doc[start+len(heading):], []byte(e)); i >= 0 {
			end = min(end, start+len(heading)+i+1)
		}
	}
	return start, end
}

// replaceHeaded returns doc with the section that sec's first line heads,
// which ends at the first of ends, replaced by sec; where doc has no such
// section, sec is appended.
func replaceHeaded(doc, sec []byte, ends ...string) []byte {
	heading, _, _ := bytes.Cut(sec, []byte("\n"))
	heading = append(heading, '\n')
	start, end := sectionBounds(doc, heading, ends...)
	if start < 0 {
		out := bytes.Clone(bytes.TrimRight(doc, "\n")) // doc may be a part of a longer one
		return append(append(out, "\n\n"...), sec...)
	}
	if end < len(doc) && !bytes.HasSuffix(sec, []byte("\n\n")) {
		sec = append(slices.Clip(sec), '\n')
	}
	return splice(doc, start, end, sec)
}
