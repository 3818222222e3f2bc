#!/bin/sh
# The capacity proof of run.sh, routed precise: the engines from an
# endpoint file naming their KV-event and replay ports (serve.sh with
# KVPORT), the Qwen3 test model's tokenizer, the block size read from
# vllm:cache_config_info.
# Usage: run-precise.sh BENCH ENDPOINTS_FILE TOKENIZER_DIR; writes into the
# current directory.
set -eu
bench=$1 eps=$2 tok=$3
exec /usr/bin/time -f "wall %e s" "$bench" capacity -endpoints-file "$eps" -tokenizer "$tok" \
  -slo-ttft-p95 2s -slo-itl-p95 50ms \
  -system-len 192 -question-len 64 -output-len 32 \
  -quote-checks-only -dir state -json proof.json -log-level info \
  > proof-stdout.txt 2> proof-stderr.txt
