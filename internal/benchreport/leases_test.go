package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLeasesSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.json")
	in := `[{"scenario":"hot-key-invalidated","mode":"GetOrLoad","loads":1,"p50_us":1838,"p99_us":7840,"reads":610971,"errors":0}]`
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := leasesSection(&b, path); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Cache-aside with leases", "| hot-key-invalidated | GetOrLoad | 1.0 | 1.84 ms | 7.84 ms | 610971 | 0 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("section lacks %q:\n%s", want, b.String())
		}
	}
	if err := os.WriteFile(path, []byte("[]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := leasesSection(&b, path); err == nil {
		t.Error("no rows: no error")
	}
}
