# Sourced by release.sh and tag.sh: checks their one argument, a release
# version vX.Y.Z or vX.Y.Z-pre, sets version to it and root to the module's
# path, and moves to the repository's top. die, set by the caller, names it.
usage() { echo "usage: $0 vX.Y.Z" >&2; exit 2; }
[ $# -eq 1 ] || usage
version=$1
[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
	die "$version is not a release version (vX.Y.Z or vX.Y.Z-pre)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(go list -m)
