#!/bin/sh
# The capacity proof against two running vLLM replicas (serve.sh).
# Usage: run.sh BENCH URL0 URL1; writes into this directory.
set -eu
bench=$1 u0=$2 u1=$3
exec /usr/bin/time -f "wall %e s" "$bench" capacity -urls "$u0,$u1" \
  -slo-ttft-p95 2s -slo-itl-p95 50ms \
  -system-len 192 -question-len 64 -output-len 32 \
  -quote-checks-only -dir state -json proof.json -log-level info \
  > proof-stdout.txt 2> proof-stderr.txt
