#!/usr/bin/env bash
# The release as a user meets it (make release-test, part of make test).
# In a temporary git repository holding the work tree's files, it releases
# $RELEASE_TEST_VERSION with scripts/release.sh and scripts/tag.sh, writes
# the tagged modules as a file-based module proxy (scripts/modproxy), and
# then, in a new module outside the repository with no replace directive
# and at the oldest Go supported (the root's go line: go 1.25.0 for 1.25),
# go gets both metric adapters at the tag from that proxy and builds and
# runs a program that uses them (scripts/testdata/adapteruser). It fails
# if the go gets raise the module's go line, or resolve the root module at
# any version but the tag.
#
# Third-party modules come from the module cache's download directory,
# then the GOPROXY in use; the user's module cache is a temporary one, so
# that the release's modules never enter the real one, and the checksum
# database is not asked (CI reaches only the module proxy). The repository
# and its git state are left alone. RELEASE_TEST_KEEP=1 keeps the
# temporary directory.
set -euo pipefail

version=${RELEASE_TEST_VERSION:-v0.1.0-releasetest}
src=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "release-test: [$SECONDS s] $*"; }
die() { echo "release-test: FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d)
[ -n "${RELEASE_TEST_KEEP:-}" ] || trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
goproxy=$(go env GOPROXY)
modcache=$(go env GOMODCACHE)
goflags=$(go env GOFLAGS)
golang=$(awk '$1 == "go" { split($2, v, "."); print v[1] "." v[2] ".0"; exit }' "$src/go.mod")

# The work tree's files (tracked and untracked, less the ignored), in a new
# repository, committed with no configuration of the user's.
mkdir "$tmp/repo"
(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
	while IFS= read -r -d '' f; do [ -e "$src/$f" ] && printf '%s\0' "$f"; done |
	(cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$tmp/repo"
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME=release-test GIT_AUTHOR_EMAIL=release-test@localhost
export GIT_COMMITTER_NAME=release-test GIT_COMMITTER_EMAIL=release-test@localhost
cd "$tmp/repo"
git init -q -b main && git add -A && git commit -q -m snapshot

log "release $version in a clone of the work tree"
bash scripts/release.sh "$version" | sed 's/^/  /'
git commit -q --allow-empty -am "Release $version"
bash scripts/tag.sh "$version" | sed 's/^/  /'

log "the tagged modules as a file-based module proxy"
(cd scripts/modproxy && go build -trimpath -o "$tmp/modproxy" .)
"$tmp/modproxy" -repo . -version "$version" -o "$tmp/proxy" 2>&1 | sed 's/^/  /'

# The user: a new module, its own module cache, the release's proxy first.
mkdir "$tmp/user"
cp "$src/scripts/testdata/adapteruser/main.go" "$tmp/user/"
cd "$tmp/user"
printf 'module example.com/adapteruser\n\ngo %s\n' "$golang" >go.mod
export GOPROXY="file://$tmp/proxy,file://$modcache/cache/download,$goproxy"
# -trimpath keeps the build cache's keys free of the temporary module
# cache's path: the dependencies compile once, not on every run.
export GOMODCACHE="$tmp/modcache" GOFLAGS="$goflags -mod=mod -modcacherw -trimpath"
# No checksum database: CI reaches the module proxy only, and the
# release's modules are not in it anyway.
export GOSUMDB=off GOPRIVATE= GONOPROXY= GOWORK=off GOTOOLCHAIN=local

root=github.com/kubecache/k8s-memcache-selector
goline() { go mod edit -print | awk '$1 == "go" { print $2 }'; }
for adapter in selectorprometheus selectorotel; do
	log "go get $root/extra/$adapter@$version"
	go get "$root/extra/$adapter@$version" 2>&1 | sed '/^go: downloading/d; s/^/  /'
	[ "$(goline)" = "$golang" ] || die "go get $adapter raised the go line from $golang to $(goline)"
done
go mod tidy 2>&1 | sed '/^go: downloading/d; s/^/  /'
[ "$(goline)" = "$golang" ] || die "go mod tidy raised the go line from $golang to $(goline)"
if grep -E '^(replace|toolchain)' go.mod; then die "go.mod has the lines above"; fi
got=$(go list -m -f '{{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}' "$root")
[ "$got" = "$version" ] || die "the root module resolved to $got, not $version"

log "build and run a program that uses both adapters"
go vet .
go build -o "$tmp/adapteruser" .
"$tmp/adapteruser" | sed 's/^/  /'
log "ok: go $golang, $(go list -m all | grep -c "^$root") modules of ours at $version, no replace"
