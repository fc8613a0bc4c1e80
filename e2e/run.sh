#!/usr/bin/env bash
# Runs the e2e suite against a real control plane (`make e2e` calls this),
# or the demo (`make demo`).
#
#   bash e2e/run.sh [test binary flags, e.g. -test.run TestDiscovery]
#   bash e2e/run.sh demo [demo flags, e.g. -short]
#
# 1. installs what a fresh Debian machine lacks (memcached, ip, unshare);
# 2. builds etcd, kube-apiserver and kube-controller-manager from the Go
#    module proxy into e2e/.bin (the first build takes minutes, later ones hit
#    the Go build cache), CoreDNS (e2e/coredns, its own module) into
#    e2e/.bin/coredns, examples/demo into e2e/.bin/demo-app, and the suite
#    into e2e/.bin/e2e.test (or the demo's orchestrator, e2e/cmd/demo, into
#    e2e/.bin/demo);
# 3. runs the suite (or the demo) as root in a private network namespace
#    (unshare -n) with lo up and the pod and API server addresses on it:
#    nothing it starts can reach, or be reached from, any other network.
#
# Environment: E2E_TIMEOUT (default 20m) bounds the test run.
set -euo pipefail

cd "$(dirname "$0")"
timeout="${E2E_TIMEOUT:-20m}"
mode=e2e
if [ "${1:-}" = demo ]; then
	mode=demo
	shift
fi

log() { echo "$mode: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: the $mode creates a network namespace (unshare -n)"
command -v go >/dev/null 2>&1 || die "go is not on PATH"

# --- 1. system packages ------------------------------------------------------
missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]} (apt-get)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Fail early, and clearly, where namespaces are not allowed (e.g. an
# unprivileged container): the suite never skips silently.
unshare -n true 2>/dev/null || die "cannot create a network namespace (unshare -n): the $mode needs root with CAP_SYS_ADMIN (in a container: --privileged)"

# --- 2. build ------------------------------------------------------------------
# Print a line every 30s so a long first build does not look stuck.
build() {
	local what="$1"
	shift
	local start=$SECONDS
	(
		trap 'kill "$s" 2>/dev/null; exit 0' TERM
		while :; do
			sleep 30 &
			s=$!
			wait "$s"
			log "  ... still building $what ($((SECONDS - start))s)"
		done
	) &
	local ticker=$!
	local rc=0
	"$@" || rc=$?
	kill "$ticker" 2>/dev/null || true
	wait "$ticker" 2>/dev/null || true
	[ "$rc" = 0 ] || die "building $what failed"
	log "built $what in $((SECONDS - start))s"
}

mkdir -p .bin
if [ -x .bin/kube-apiserver ] && [ -x .bin/kube-controller-manager ] && [ -x .bin/etcd ]; then
	log "building etcd, kube-apiserver, kube-controller-manager (seconds when the Go build cache is warm)"
else
	log "building etcd, kube-apiserver, kube-controller-manager from source (first run only, about 8 minutes on 2 cores)"
fi
build "the control plane" go build -o .bin/ ./cmd/etcd ./cmd/kube-apiserver ./cmd/kube-controller-manager
# CoreDNS, with its kubernetes plugin, for the tests of discovery by DNS (the
# demo does not use it). A module of its own: its dependencies do not move
# the control plane's.
if [ "$mode" = e2e ]; then
	if [ -x .bin/coredns ]; then
		log "building CoreDNS (seconds when the Go build cache is warm)"
	else
		log "building CoreDNS from source (first run only, about 5 minutes on 2 cores)"
	fi
	build "CoreDNS" go -C coredns build -o "$PWD/.bin/coredns" .
fi
# examples/demo is in the root module; the demo and TestDemo run it.
build "examples/demo" go -C .. build -o "$PWD/.bin/demo-app" ./examples/demo
if [ "$mode" = demo ]; then
	build "the demo" go build -o .bin/demo ./cmd/demo
	run=(./.bin/demo)
else
	build "the test binary" go test -c -o .bin/e2e.test .
	run=(./.bin/e2e.test -test.v -test.timeout="$timeout")
fi

# --- 3. run in a private network namespace ------------------------------------
# Pods get 10.244.0.1-250, the API servers 10.244.255.254, CoreDNS
# 10.244.255.253; all on lo.
if [ "$mode" = demo ]; then
	log "running the demo in a private network namespace (unshare -n): nothing it starts can reach another network"
else
	log "running the suite in a private network namespace (timeout $timeout)"
fi
netns() {
	unshare -n -- bash -c '
set -euo pipefail
ip link set lo up
{
	for i in $(seq 1 250); do echo "addr add 10.244.0.$i/32 dev lo"; done
	echo "addr add 10.244.255.254/32 dev lo"
	echo "addr add 10.244.255.253/32 dev lo"
} | ip -batch -
exec "$@"
' netns "$@"
}
if [ "$mode" = demo ]; then
	netns "${run[@]}" "$@"
	exit
fi
# The suite's verdict ends the output, counted from go test's own lines.
rc=0
netns "${run[@]}" "$@" 2>&1 | tee .bin/e2e.log || rc=$?
# A failure's line can follow other output on the same line (a test's
# goroutine still logging), so FAIL is counted anywhere; a failing run
# never says "0 failed".
failed=$(grep -c -- '--- FAIL' .bin/e2e.log || true)
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then failed="the test binary exited $rc: 1 or more"; fi
# A failing test prints the control plane's logs after its assertions, and
# a CI excerpt of the output's end shows only those: the assertions' own
# lines (testify's blocks, and the file:line that heads each) and the FAIL
# lines come again last.
if [ "$failed" != 0 ]; then
	echo "e2e: the failures again, without the control plane's logs:"
	grep -E -- '^ +[A-Za-z0-9_]+_test\.go:[0-9]+: *$|^ +'$'\t''|--- FAIL' .bin/e2e.log | tail -n 120 || true
fi
echo "e2e: $(grep -c '^--- PASS' .bin/e2e.log || true) passed, $failed failed"
exit "$rc"
