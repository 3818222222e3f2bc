#!/bin/sh
# The capacity proof at the notebook's loose objectives (3 s / 300 ms, its
# first calibration's), 20 s steps; writes loose-* into this directory.
# Usage: run-loose.sh BENCH URL0 URL1
set -eu
bench=$1 u0=$2 u1=$3
exec /usr/bin/time -f "wall %e s" "$bench" capacity -urls "$u0,$u1" \
  -slo-ttft-p95 3s -slo-itl-p95 300ms -stage 20s \
  -system-len 192 -question-len 64 -output-len 32 \
  -quote-checks-only -dir loose-state -json loose-proof.json -log-level info \
  > loose-stdout.txt 2> loose-stderr.txt
