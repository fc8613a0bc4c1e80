#!/usr/bin/env bash
# Tags the release vX.Y.Z at HEAD (docs/development.md, "Releasing"): the
# root module as vX.Y.Z and each metric adapter as extra/NAME/vX.Y.Z, the
# tags by which the go command finds a module in a subdirectory. It checks
# first that the work tree is clean and that every adapter requires the
# root at vX.Y.Z (scripts/release.sh vX.Y.Z sets that). It pushes nothing:
# it prints the push, which sends all the tags at once.
set -euo pipefail

die() { echo "tag: $*" >&2; exit 1; }
source "$(dirname "$0")/version.sh"
[ -z "$(git status --porcelain)" ] || die "the work tree has changes: commit them first"

tags=("$version")
for mod in extra/*/go.mod; do
	dir=$(dirname "$mod")
	# The root's version in the require, whether in a block or on one line.
	have=$(awk -v m="$root" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$mod")
	[ "$have" = "$version" ] || die "$dir requires $root ${have:-(not at all)}, not $version: run scripts/release.sh $version and commit"
	tags+=("$dir/$version")
done
for tag in "${tags[@]}"; do
	[ -z "$(git tag --list "$tag")" ] || die "tag $tag exists"
done

for tag in "${tags[@]}"; do
	git tag -a -m "$(basename "$root") $tag" "$tag"
	echo "tag: $tag at $(git rev-parse --short HEAD)"
done
echo "tag: push them together with: git push --atomic origin ${tags[*]}"
