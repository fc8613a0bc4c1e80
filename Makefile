# make test   unit tests (with -race), the release test and the e2e suite on a real control plane
# make demo   the demo on a local control plane
# make bench  benchmarks and the routing-quality report (BENCHMARKS.md)

GO ?= go

.PHONY: test unit release-test test-deps e2e demo bench bench-deps bench-e2e bench-moves vet histcheck histcheck-long histcheck-report

test: unit release-test e2e

# The unit tests check the proxy-tier paths (internal/proxybench) against
# real memcached and nutcracker, and Ketama against live peers
# (interop_test.go): php-memcached under php-cli, nutcracker, and
# libmemcached through a C program the test compiles (libmemcached-dev,
# and gcc and libc6-dev, which -race needs anyway). test-deps installs
# what is missing, and SELECTOR_REQUIRE_PEERS makes their absence a failure, not a skip.
#
# The metrics adapters in extra/ are modules of their own, which go test
# ./... at the root skips: each is vetted and tested in its directory. The
# race detector makes allocation counts vary (sync.Pool drops items at
# random), so TestMetricsAllocs, TestClientAllocs and internal/meta's
# allocation tests count them in a run without it.
EXTRA_MODULES = extra/selectorotel extra/selectorprometheus

# Every package that talks to memcached runs twice: on the memcached on
# PATH (Debian's 1.6.18, the oldest release supported) and on the newest
# release, which scripts/memcached-newest.sh builds from Debian unstable's
# source package (cached; make test-deps builds it first).
MEMCACHED_PACKAGES = . ./internal/meta/ ./internal/histcheck/

unit: vet test-deps
	SELECTOR_REQUIRE_PEERS=1 $(GO) test -race -count=1 -timeout 30m ./...
	newest="$$(bash scripts/memcached-newest.sh)" && echo "unit: again on $$($$newest/memcached -V)" && \
		PATH="$$newest:$$PATH" SELECTOR_REQUIRE_PEERS=1 $(GO) test -race -count=1 -timeout 30m $(MEMCACHED_PACKAGES)
	$(GO) test -count=1 -run '^Test(Metrics|Client)Allocs$$' .
	SELECTOR_REQUIRE_PEERS=1 $(GO) test -count=1 -run 'Allocs$$' ./internal/meta/
	for m in $(EXTRA_MODULES); do (cd $$m && SELECTOR_REQUIRE_PEERS=1 $(GO) test -race -count=1 ./...) || exit 1; done
	cd examples && $(GO) build ./...

# make release-test: the metric adapters installed as a user installs them
# (scripts/release-test.sh): a release tagged in a temporary clone of the
# work tree, served by a file-based module proxy, go got by a new module
# with no replace directive, and a program run that uses both. About 15
# seconds once the build cache holds the dependencies.
release-test:
	bash scripts/release-test.sh

test-deps: SHELL := /bin/bash
test-deps:
	@missing=(); \
	command -v memcached >/dev/null 2>&1 || missing+=(memcached); \
	command -v nutcracker >/dev/null 2>&1 || missing+=(nutcracker); \
	command -v php >/dev/null 2>&1 || missing+=(php-cli); \
	php -r 'exit(class_exists("Memcached") ? 0 : 1);' >/dev/null 2>&1 || missing+=(php-memcached); \
	[ -e /usr/include/libmemcached/memcached.h ] || missing+=(libmemcached-dev); \
	command -v memcping >/dev/null 2>&1 || missing+=(libmemcached-tools); \
	command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev); \
	[ -e /usr/include/event2/event.h ] || missing+=(libevent-dev); \
	if [ $${#missing[@]} -gt 0 ]; then \
		[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || { echo "test-deps: $${missing[*]} missing; install them (Debian: apt-get install $${missing[*]}), or run as root"; exit 1; }; \
		echo "test-deps: installing $${missing[*]} (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$${missing[@]}" >/dev/null; \
	fi; \
	bash scripts/memcached-newest.sh >/dev/null

# make histcheck: the history checker's bounded run (internal/histcheck,
# also part of make unit): every fault schedule over real memcached, the
# Client and gomemcache's client side by side; it fails on any stale read
# by the Client. HISTCHECK_SEED reruns a seed it printed. make
# histcheck-long runs each schedule for HISTCHECK_DURATION (make bench-e2e
# runs it, and goes on to the benchmarks if it fails), on Debian's
# memcached and on the newest release at once: its outputs are in
# histcheck-long.out and histcheck-long-newest.out. make histcheck-report
# runs the long run and rewrites BENCHMARKS.md's history section alone
# from them.
HISTCHECK_DURATION ?= 60s
HISTCHECK_LONG = $(GO) test -count=1 -timeout 120m -run '^TestHistory$$' -v ./internal/histcheck/ \
	-histcheck.duration $(HISTCHECK_DURATION) -histcheck.workers 16
histcheck: test-deps
	$(GO) test -race -count=1 -run '^(TestHistory|TestStaleSet)$$' -v ./internal/histcheck/

histcheck-long: SHELL := /bin/bash
histcheck-long: .SHELLFLAGS := -o pipefail -c
histcheck-long: test-deps
	newest="$$(bash scripts/memcached-newest.sh)"; \
	PATH="$$newest:$$PATH" $(HISTCHECK_LONG) > histcheck-long-newest.out 2>&1 & pid=$$!; \
	$(HISTCHECK_LONG) 2>&1 | tee histcheck-long.out; debian=$$?; \
	wait $$pid; newest=$$?; tail -40 histcheck-long-newest.out; test $$debian = 0 -a $$newest = 0

histcheck-report: SHELL := /bin/bash
histcheck-report: test-deps
	-$(MAKE) histcheck-long
	$(GO) run ./internal/benchreport -section histcheck -histcheck histcheck-long.out,histcheck-long-newest.out -o BENCHMARKS.md

# bench-moves runs BenchmarkMoves and the e2e moves at scale with pods of
# 200,000 and of 1,000,000 keys (about ten minutes on the 2-core VM), and rewrites their sections of
# BENCHMARKS.md alone (make bench and make bench-e2e run them with the
# rest).
bench-moves: SHELL := /bin/bash
bench-moves: .SHELLFLAGS := -o pipefail -c
bench-moves: test-deps
	rm -f bench-moves.md bench-moves.out
	$(GO) test -run '^$$' -bench '^BenchmarkMoves$$' -benchtime $(MOVES_TIME) -timeout 60m . | tee bench-moves.out
	$(GO) run ./internal/benchreport -section moves -moves bench-moves.out -o BENCHMARKS.md -command 'make bench-moves'
	bash e2e/run.sh -test.run '^TestClientMovesAtScale$$' -e2e.report $(CURDIR)/bench-moves.md
	E2E_MOVES_PER_POD=1000000 E2E_TIMEOUT=40m bash e2e/run.sh -test.run '^TestClientMovesAtScale$$' -e2e.report $(CURDIR)/bench-moves.md
	$(GO) run ./internal/benchreport -section e2e -e2e bench-moves.md -o BENCHMARKS.md -command 'make bench-moves'

vet:
	$(GO) mod download
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	for m in $(EXTRA_MODULES); do (cd $$m && $(GO) mod download && $(GO) vet ./...) || exit 1; done

# The e2e moves tests run again with the newest memcached in the pods.
E2E_NEWEST_TESTS = ^(TestClientMovesAtScale|TestClientMovesManyClients|TestClientSharedServers)$$

e2e: test-deps
	bash e2e/run.sh
	newest="$$(bash scripts/memcached-newest.sh)" && echo "e2e: again on $$($$newest/memcached -V)" && \
		PATH="$$newest:$$PATH" bash e2e/run.sh -test.run '$(E2E_NEWEST_TESTS)'

demo:
	bash e2e/run.sh demo

# make bench: PickServer and rebuild benchmarks, and Get, Set and GetMulti
# end to end over real memcached through ours, gomemcache and twemproxy
# (internal/proxybench, BenchmarkProxy), the Client against gomemcache's own
# Client at its best (MaxIdleConns 64) and default configurations, 1 and 64
# goroutines over 3 memcached (BenchmarkClientVsGomemcache, at the machine's
# GOMAXPROCS), then the ring's routing-quality figures (TestQualityMeasure
# -quality-json), the leases' (TestLeaseMeasure) and the mover's against a
# plain pipelined copy (BenchmarkMoves), from which and the benchmark output internal/benchreport
# writes BENCHMARKS.md, then prints it, and last the PASS or MISS of each of
# the Client-against-gomemcache goals (bench-goals.out).
# BENCH_COUNT rounds each run every benchmark once, so that ours and
# gomemcache are measured seconds apart and a burst of other work on the
# machine slows both alike. BENCH_COUNT and BENCH_TIME trade time for
# precision. benchstat, fetched through the module proxy, adds confidence
# intervals when it is available; the report does not need it.
# bench-deps installs memcached and nutcracker where they are missing (as
# root, with apt-get); where it cannot, the report says what was not
# measured and why.
BENCH_COUNT ?= 6
BENCH_TIME ?= 300ms
# MOVES_TIME: scale-ups a case of BenchmarkMoves (each its own memcached).
MOVES_TIME ?= 3x
BENCHSTAT ?= golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
BENCH_FLAGS = -test.run '^$$' -test.benchmem -test.count 1 -test.benchtime $(BENCH_TIME)

bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -o pipefail -c
bench: bench-deps
	cat /proc/loadavg > bench-loadavg.out
	$(GO) test -c -o bench.test .
	$(GO) test -c -o proxybench.test ./internal/proxybench
	rm -f bench-pick.out bench-rebuild.out bench-proxy.out bench-client.out bench-goals.out bench-quality.out bench-leases.out bench-moves.out
	for round in $$(seq $(BENCH_COUNT)); do \
		echo "round $$round of $(BENCH_COUNT)"; \
		./bench.test $(BENCH_FLAGS) -test.cpu 1 -test.bench '^BenchmarkPickServer$$' | tee -a bench-pick.out && \
		./bench.test $(BENCH_FLAGS) -test.cpu 1,2 -test.bench '^BenchmarkPickServerParallel$$' | tee -a bench-pick.out && \
		./bench.test $(BENCH_FLAGS) -test.bench '^BenchmarkRebuild' | tee -a bench-rebuild.out && \
		./proxybench.test $(BENCH_FLAGS) -test.cpu 1,2 -test.bench '^Benchmark(Proxy|Pool)$$' | tee -a bench-proxy.out && \
		./proxybench.test $(BENCH_FLAGS) -test.bench '^BenchmarkClientVsGomemcache$$' -proxy.vs-rotate $$round | tee -a bench-client.out || exit 1; \
	done
	./bench.test -test.run '^TestQualityMeasure$$' -test.count 1 -test.timeout 30m -test.v -quality-json bench-quality.out
	./bench.test -test.run '^TestLeaseMeasure$$' -test.count 1 -test.timeout 10m -test.v -lease.measure -lease.json bench-leases.out
	./bench.test -test.run '^$$' -test.bench '^BenchmarkMoves$$' -test.benchtime $(MOVES_TIME) | tee bench-moves.out
	rm -f bench.test proxybench.test
	@rm -f benchstat.out; \
	if { $(GO) run $(BENCHSTAT) -col /impl -filter '.unit:sec/op' bench-pick.out && $(GO) run $(BENCHSTAT) bench-rebuild.out && \
		$(GO) run $(BENCHSTAT) -col '/impl@(ours gomemcache twemproxy)' -filter '.unit:(sec/op OR p50-ns OR p99-ns)' bench-proxy.out && \
		$(GO) run $(BENCHSTAT) -col '/impl@(gomemcache-best client gomemcache-default)' -filter '.unit:(sec/op OR ops/s OR p99-ns OR allocs/op)' bench-client.out; } >benchstat.tmp 2>benchstat-err.out; \
	then mv benchstat.tmp benchstat.out; \
	else rm -f benchstat.tmp; echo "benchstat is unavailable (benchstat-err.out); the report computes its own medians"; fi
	$(GO) run ./internal/benchreport -o BENCHMARKS.md -quality bench-quality.out \
		-bench bench-pick.out,bench-rebuild.out -proxy bench-proxy.out -client bench-client.out -benchstat benchstat.out -loadavg bench-loadavg.out -histcheck histcheck-long.out,histcheck-long-newest.out -leases bench-leases.out -moves bench-moves.out \
		-e2e bench-e2e.md -command "make bench BENCH_COUNT=$(BENCH_COUNT) BENCH_TIME=$(BENCH_TIME)" >bench-goals.out
	@cat BENCHMARKS.md
	@echo; echo "The Client against gomemcache (BenchmarkClientVsGomemcache; BENCHMARKS.md has the tables):"; cat bench-goals.out

# bench-deps: memcached and nutcracker (twemproxy) for BenchmarkProxy, from
# apt-get where they are missing and this is root on Debian. It never fails
# the bench: a path it could not provide is reported as not measured.
bench-deps: SHELL := /bin/bash
bench-deps:
	@missing=(); \
	command -v memcached >/dev/null 2>&1 || missing+=(memcached); \
	command -v nutcracker >/dev/null 2>&1 || missing+=(nutcracker); \
	if [ $${#missing[@]} -eq 0 ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "bench-deps: $${missing[*]} missing and not installable here (needs root and apt-get); the report will say what was not measured"; exit 0; fi; \
	echo "bench-deps: installing $${missing[*]} (apt-get)"; \
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$${missing[@]}" >/dev/null; } || \
		echo "bench-deps: apt-get install $${missing[*]} failed; the report will say what was not measured"

# make bench-e2e: the convergence, rolling-restart, scale and Client figures of the e2e suite
# on the real control plane (the moves at scale also with pods of 1,000,000 keys), then make
# bench, whose report includes them.
bench-e2e:
	rm -f bench-e2e.md
	bash e2e/run.sh -test.run '^(TestConvergence|TestDNSConvergence|TestRollingRestart|TestRollingRestartAtScale|TestManyClients|TestClientKill|TestClientHung|TestClientRollingRestart|TestClientMovesAtScale|TestClientMovesManyClients|TestClientSockets|TestPoolReplicated|TestPoolZones|TestPoolAcrossServices)$$' -e2e.report $(CURDIR)/bench-e2e.md
	E2E_MOVES_PER_POD=1000000 E2E_TIMEOUT=40m bash e2e/run.sh -test.run '^TestClientMovesAtScale$$' -e2e.report $(CURDIR)/bench-e2e.md
	-$(MAKE) histcheck-long
	$(MAKE) bench
