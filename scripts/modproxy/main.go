// Command modproxy writes the modules of a git repository at a release
// version as a file-based module proxy, the layout GOPROXY=file://DIR
// reads: for each module, DIR/<module path>/@v/list, <version>.info,
// <version>.mod and <version>.zip, as proxy.golang.org would serve them.
// scripts/release-test.sh uses it to install the metric adapters the way a
// user does, from a release tagged in a temporary clone.
//
//	go run ./scripts/modproxy -repo DIR -version vX.Y.Z -o PROXYDIR
//
// The modules are those the go command finds at the version's tags: the
// tag vX.Y.Z is the module at the repository's root, and a tag
// SUBDIR/vX.Y.Z the module in SUBDIR. The zips are made as the go command
// makes them from git (golang.org/x/mod/zip.CreateFromVCS): the files git
// archives at the tag, less nested modules and vendor directories.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the git repository's root")
	version := flag.String("version", "", "the release version, vX.Y.Z, whose tags to write")
	out := flag.String("o", "", "the proxy's directory (created if missing)")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("modproxy: ")
	if *version == "" || *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*repo, *version, *out); err != nil {
		log.Fatal(err)
	}
}

func run(repo, version, out string) error {
	if semver.Canonical(version) != version || module.IsPseudoVersion(version) {
		return fmt.Errorf("%q is not a canonical release version (vX.Y.Z[-pre])", version)
	}
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	tags, err := git(repo, "tag", "--list", version, "*/"+version)
	if err != nil {
		return err
	}
	var n int
	for _, tag := range strings.Fields(string(tags)) {
		subdir := strings.TrimSuffix(strings.TrimSuffix(tag, version), "/")
		path, err := write(repo, tag, subdir, version, out)
		if err != nil {
			return fmt.Errorf("%s: %w", tag, err)
		}
		log.Printf("%s@%s (tag %s)", path, version, tag)
		n++
	}
	if n == 0 {
		return fmt.Errorf("no tag %s or */%s in %s", version, version, repo)
	}
	return nil
}

// write adds the module in subdir at tag to the proxy in out, and returns
// its path.
func write(repo, tag, subdir, version, out string) (string, error) {
	gomod, err := git(repo, "show", tag+":"+filepath.ToSlash(filepath.Join(subdir, "go.mod")))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", fmt.Errorf("%s/go.mod names no module", subdir)
	}
	if err := module.Check(path, version); err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := filepath.Join(dir, version)

	when, err := git(repo, "log", "-1", "--format=%cI", tag)
	if err != nil {
		return "", err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(when)))
	if err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t.UTC()})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return "", err
	}

	f, err := os.Create(base + ".zip")
	if err != nil {
		return "", err
	}
	err = zip.CreateFromVCS(f, module.Version{Path: path, Version: version}, repo, tag, subdir)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}

	list, err := os.ReadFile(filepath.Join(dir, "list"))
	if err != nil && !os.IsNotExist(err) {
		return "", err
	}
	versions := strings.Fields(string(list))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return path, os.WriteFile(filepath.Join(dir, "list"), []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// git runs git in repo and returns its standard output.
func git(repo string, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout, nil
}
