# make test   unit tests (with -race) and the e2e suite on a real control plane
# make demo   the demo on a local control plane
# make bench  benchmarks and the routing-quality report (BENCHMARKS.md)

GO ?= go

.PHONY: test unit e2e demo bench vet

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
