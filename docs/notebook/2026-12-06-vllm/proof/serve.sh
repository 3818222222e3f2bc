#!/bin/sh
# Starts one vLLM replica as e2e/vllm's harness does (harness_test.go:
# replica.args and replica.env), on 127.0.0.1 only, in the background.
# Usage: serve.sh ROOT RUNDIR PORT REPLAYPORT; prints the PID.
set -eu
root=$1 dir=$2 port=$3 replay=$4
mkdir -p "$dir"
model=$(ls -d "$root"/.cache/e2e-vllm/model-* | head -1)
kv='{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"ipc://'"$dir"'/kv.sock","replay_endpoint":"tcp://127.0.0.1:'"$replay"'"}'
cd "$dir"
env -u VLLM_CPU_KVCACHE_SPACE OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_SERVER_DEV_MODE=1 \
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  setsid "$root/.cache/py/vllm/bin/python" "$root/e2e/vllm/serve.py" "$model" \
  --host 127.0.0.1 --port "$port" --served-model-name qwen3-test --dtype float32 \
  --block-size 32 --enable-prefix-caching --kv-cache-memory-bytes 4194304 \
  --max-model-len 2048 --max-num-seqs 16 --enforce-eager \
  --enable-auto-tool-choice --tool-call-parser hermes --tool-strict-level parameter \
  --enable-prompt-tokens-details --kv-events-config "$kv" --seed 0 \
  > "$dir/vllm.log" 2>&1 < /dev/null &
echo $!
