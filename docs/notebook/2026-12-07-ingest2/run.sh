#!/bin/sh
# BenchmarkIngest before and after, alternated: the receiver at BEFORE
# (default 3dae1d7, this notebook's starting point) and at AFTER (default:
# the working tree), each built once as a test binary, then ROUNDS rounds
# (default 3) of one process a case: 1,024 engines (which also runs
# 1,024 x 5/s) and 256 engines at 20 batches a second. Both binaries have
# the same publishers (pubfleet_test.go and ingest_timing_test.go did not
# change between the two commits). Every block starts with `uptime`; the
# lines go to stdout and to OUT (default ingest2-<UTC time>.txt).
#
# From the repository root:
#   docs/notebook/2026-12-07-ingest2/run.sh            # 3 rounds
#   ROUNDS=5 AFTER=HEAD docs/notebook/2026-12-07-ingest2/run.sh
set -eu
rounds=${ROUNDS:-3}
before=${BEFORE:-3dae1d7}
after=${AFTER:-}
out=${OUT:-ingest2-$(date -u +%Y%m%dT%H%M%SZ).txt}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

build() { # build NAME COMMIT: a test binary of kvindex/ingest at COMMIT ("" is the working tree)
	if [ -z "$2" ]; then
		(cd "$root" && go test -c -o "$tmp/$1.test" ./kvindex/ingest)
		echo "$1: working tree at $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . || echo ' (modified)')"
		return
	fi
	mkdir "$tmp/$1-src"
	git -C "$root" archive "$2" | tar -x -C "$tmp/$1-src"
	(cd "$tmp/$1-src" && go test -c -o "$tmp/$1.test" ./kvindex/ingest)
	echo "$1: $(git -C "$root" rev-parse --short "$2")"
}

{
	build before "$before"
	build after "$after"
	echo "host: $(nproc) CPUs, $(go version)"
	for r in $(seq "$rounds"); do
		for v in before after; do
			for n in 1024 256; do
				echo "== round $r $v replicas=$n $(uptime)"
				(cd "$root/kvindex/ingest" && "$tmp/$v.test" -test.run '^$' -test.bench "Ingest/replicas=$n\$" \
					-test.benchtime 100000x -test.count 1) 2>&1 | grep -E '^Benchmark|each child|FAIL|panic' || true
			done
		done
	done
	echo "== end $(uptime)"
} | tee "$out"
