# make test   unit tests (with -race) and the e2e suite on a real control plane
# make demo   the demo on a local control plane
# make bench  benchmarks and the routing-quality report (BENCHMARKS.md)

GO ?= go

.PHONY: test unit e2e demo bench bench-e2e vet

test: unit e2e

unit: vet
	$(GO) test -race -count=1 ./...
	cd examples && $(GO) build ./...

vet:
	$(GO) mod download
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...

e2e:
	bash e2e/run.sh

demo:
	bash e2e/run.sh demo

# make bench: PickServer and rebuild benchmarks, then the ring's
# routing-quality figures (TestQualityMeasure -quality-json), from which and
# the benchmark output internal/benchreport writes BENCHMARKS.md, then prints
# it. BENCH_COUNT rounds each run every benchmark once, so that ours and
# gomemcache are measured seconds apart and a burst of other work on the
# machine slows both alike. BENCH_COUNT and BENCH_TIME trade time for
# precision. benchstat, fetched through the module proxy, adds confidence
# intervals when it is available; the report does not need it.
BENCH_COUNT ?= 6
BENCH_TIME ?= 300ms
BENCHSTAT ?= golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
BENCH_FLAGS = -test.run '^$$' -test.benchmem -test.count 1 -test.benchtime $(BENCH_TIME)

bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -o pipefail -c
bench:
	cat /proc/loadavg > bench-loadavg.out
	$(GO) test -c -o bench.test .
	rm -f bench-pick.out bench-rebuild.out bench-quality.out
	for round in $$(seq $(BENCH_COUNT)); do \
		echo "round $$round of $(BENCH_COUNT)"; \
		./bench.test $(BENCH_FLAGS) -test.cpu 1 -test.bench '^BenchmarkPickServer$$' | tee -a bench-pick.out && \
		./bench.test $(BENCH_FLAGS) -test.cpu 1,2 -test.bench '^BenchmarkPickServerParallel$$' | tee -a bench-pick.out && \
		./bench.test $(BENCH_FLAGS) -test.bench '^BenchmarkRebuild' | tee -a bench-rebuild.out || exit 1; \
	done
	./bench.test -test.run '^TestQualityMeasure$$' -test.count 1 -test.timeout 30m -test.v -quality-json bench-quality.out
	rm -f bench.test
	@rm -f benchstat.out; \
	if { $(GO) run $(BENCHSTAT) -col /impl -filter '.unit:sec/op' bench-pick.out && $(GO) run $(BENCHSTAT) bench-rebuild.out; } >benchstat.tmp 2>benchstat-err.out; \
	then mv benchstat.tmp benchstat.out; \
	else rm -f benchstat.tmp; echo "benchstat is unavailable (benchstat-err.out); the report computes its own medians"; fi
	$(GO) run ./internal/benchreport -o BENCHMARKS.md -quality bench-quality.out \
		-bench bench-pick.out,bench-rebuild.out -benchstat benchstat.out -loadavg bench-loadavg.out \
		-e2e bench-e2e.md -command "make bench BENCH_COUNT=$(BENCH_COUNT) BENCH_TIME=$(BENCH_TIME)"
	@cat BENCHMARKS.md

# make bench-e2e: the convergence, rolling-restart and scale figures of the e2e suite
# on the real control plane, then make bench, whose report includes them.
bench-e2e:
	rm -f bench-e2e.md
	bash e2e/run.sh -test.run '^(TestConvergence|TestRollingRestart|TestRollingRestartAtScale|TestManyClients)$$' -e2e.report $(CURDIR)/bench-e2e.md
	$(MAKE) bench
