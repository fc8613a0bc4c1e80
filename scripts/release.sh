#!/usr/bin/env bash
# Prepares the release vX.Y.Z of the module and its metric adapters
# (docs/development.md, "Releasing"): sets each adapter's requirement of the
# root module to vX.Y.Z, tidies the adapters' go.mod and go.sum, and checks
# that no adapter's go line is above the root's (the oldest Go the README
# promises). It changes files only: review them, commit, then tag the
# commit with scripts/tag.sh vX.Y.Z.
#
# The adapters keep their replace of the root by ../..: the go command
# obeys replace directives only in the main module, so a user who go gets
# an adapter gets the root at the version its require names, while in the
# repository the adapters build and test against the root in the work tree.
set -euo pipefail

die() { echo "release: $*" >&2; exit 1; }
source "$(dirname "$0")/version.sh"
[ -z "$(git tag --list "$version")" ] || die "tag $version exists"

# The go line: Go's major and minor version (1.25 of "go 1.25.0").
goline() { awk '$1 == "go" { split($2, v, "."); print v[1] "." v[2]; exit }' "$1"; }
supported=$(goline go.mod)

for mod in extra/*/go.mod; do
	dir=$(dirname "$mod")
	echo "release: $dir requires $root $version"
	(cd "$dir" && go mod edit -require="$root@$version" && go mod tidy)
	have=$(goline "$mod")
	if [ "$(printf '%s\n%s\n' "$supported" "$have" | sort -V | tail -1)" != "$supported" ]; then
		echo "release: $dir needs go $have, above the supported go $supported; the modules that ask for it:" >&2
		(cd "$dir" && go list -m -f '{{.Path}} {{.Version}} go {{.GoVersion}}' all |
			awk -v s="$supported" '$4 != "" { split($4, v, "."); split(s, w, ".")
				if (v[1] > w[1] || (v[1] == w[1] && v[2] > w[2])) print "  " $0 }') >&2
		exit 1
	fi
done

echo "release: done; review git diff, update CHANGELOG.md, commit, then: scripts/tag.sh $version"
