#!/usr/bin/env bash
# Builds the newest memcached release for the tests (make test-deps calls
# this), and prints the directory that holds its binary.
#
# Debian's stable archive has 1.6.18, the oldest release the library
# supports; unstable has the newest as a source package, whose binary
# needs a newer libc than stable's. This fetches its upstream tarball
# through a temporary source list (nothing of the system's apt setup is
# changed; the mirror is the one the system already uses), checks it
# against the archive's signed index as apt does, and builds memcached
# with libevent (about a minute on 2 cores). The build is cached in
# $MEMCACHED_CACHE (default ~/.cache/k8s-memcache-selector), one
# directory a version.
set -euo pipefail

cache="${MEMCACHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/k8s-memcache-selector}"
log() { echo "memcached-newest: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# The mirror the system uses, from deb822 or one-line sources.
uri=""
for f in /etc/apt/sources.list.d/*.sources; do
	[ -e "$f" ] || continue
	uri=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' "$f")
	[ -n "$uri" ] && break
done
if [ -z "$uri" ] && [ -e /etc/apt/sources.list ]; then
	uri=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$uri" ] || die "no Debian mirror in /etc/apt/sources.list{,.d}: cannot fetch memcached's source"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri sid main" >"$tmp/sid.list"
apt_opts=(-o Dir::Etc::sourcelist="$tmp/sid.list" -o Dir::Etc::sourceparts=/dev/null -o Dir::State::Lists="$tmp/lists" -o APT::Sandbox::User=root)
apt-get -qq "${apt_opts[@]}" update >/dev/null || die "apt-get update of unstable's source index failed"
version=$(apt-cache "${apt_opts[@]}" showsrc memcached | awk '/^Version:/ {print $2}' | sort -V | tail -1)
version="${version#*:}"
version="${version%-*}"
[ -n "$version" ] || die "no memcached source package in unstable's index"
dir="$cache/memcached-$version"
if [ -x "$dir/memcached" ] && "$dir/memcached" -V 2>/dev/null | grep -qx "memcached $version"; then
	echo "$dir"
	exit 0
fi

log "building memcached $version from unstable's source package"
if ! [ -e /usr/include/event2/event.h ]; then
	[ "$(id -u)" = 0 ] || die "libevent-dev is missing; install it (apt-get install libevent-dev), or run as root"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libevent-dev >/dev/null
fi
(cd "$tmp" && apt-get -qq "${apt_opts[@]}" source --download-only memcached >/dev/null 2>&1) || true
orig=$(ls "$tmp"/memcached_"$version".orig.tar.* 2>/dev/null | head -1)
[ -n "$orig" ] || die "memcached_$version.orig.tar.* was not fetched"
tar -C "$tmp" -xf "$orig"
src="$tmp/memcached-$version"
(cd "$src" && ./configure -q >/dev/null && make -s -j"$(nproc)" memcached >/dev/null 2>&1) || die "building memcached $version failed"
mkdir -p "$dir"
cp "$src/memcached" "$dir/memcached"
"$dir/memcached" -V | grep -qx "memcached $version" || die "the memcached built does not say it is $version"
log "memcached $version in $dir"
echo "$dir"
