#!/bin/bash
# Alternates test binaries of e2e/envoy, each built once with
#   go test -c -o /tmp/e200f/envoy-SIDE.test ./e2e/envoy/
# from the tree named in README.md, run from e2e/envoy:
#   SIDES="base dec head" ROUNDS="1 2 3 4 5 6" BENCH=EPPInEnvoy ./run.sh > bench-roundN.txt
# Rounds 1, 3, 4 and 5 ran BENCH=EPPInEnvoy/200KB and 3 or 4 rounds.
set -u
for round in ${ROUNDS:-1 2 3 4 5 6}; do
  for side in ${SIDES:-base head}; do
    echo "# $side $round $(date -u +%T) $(uptime)"
    (cd /work/main/e2e/envoy && /tmp/e200f/envoy-$side.test -test.run '^$' -test.bench ${BENCH:-EPPInEnvoy} -test.count 3 2>&1 | grep Bench)
  done
done
