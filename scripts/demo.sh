#!/usr/bin/env bash
# make demo: starts a small simulated fleet (three vLLM-flavoured ranks of
# one enginesim process, on 127.0.0.1 only), sends it chat, streaming and
# tool-calling requests, and prints what each replica's own metrics report.
# The bench issue turns this into the routing comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
HTTP_PORT=${DEMO_HTTP_PORT:-18100}
ZMQ_PORT=${DEMO_ZMQ_PORT:-18557}
MODEL=Qwen/Qwen3-32B
log=$(mktemp -t enginesim-demo.XXXXXX.log)

"$BIN/enginesim" -listen "127.0.0.1:$HTTP_PORT" -data-parallel-size 3 -time-scale 20 \
  -kv-events-endpoint "tcp://127.0.0.1:$ZMQ_PORT" -seed 1 -log-level warn >"$log" 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null; wait $sim 2>/dev/null || true' EXIT

for rank in 0 1 2; do
  for _ in $(seq 100); do
    curl -sf "127.0.0.1:$((HTTP_PORT + rank))/health" >/dev/null && break
    sleep 0.05
  done
done

system="You are a concise assistant for a GPU provider. $(printf 'Answer with care. %.0s' $(seq 60))"
echo "== 12 chat requests sharing a long system prompt, spread over 3 replicas"
for i in $(seq 0 11); do
  port=$((HTTP_PORT + i % 3))
  curl -sf "127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d @- >/dev/null <<JSON
{"model":"$MODEL","max_tokens":24,"messages":[{"role":"system","content":"$system"},{"role":"user","content":"Question $i about prefix caching?"}]}
JSON
done

echo "== one streamed tool call (tool_choice auto), as a client sees it"
curl -sfN "127.0.0.1:$HTTP_PORT/v1/chat/completions" -H 'Content-Type: application/json' -d @- <<JSON | grep -o '"tool_calls":\[[^]]*\]' | head -4
{"model":"$MODEL","stream":true,"stream_options":{"include_usage":true},"tool_choice":"auto",
 "messages":[{"role":"user","content":"Weather in Paris?"}],
 "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}
JSON

echo
echo "== per-replica view from each engine's own /metrics"
printf '%-8s %10s %14s %14s %10s\n' replica requests prefix_queries prefix_hits hit_rate
for rank in 0 1 2; do
  curl -sf "127.0.0.1:$((HTTP_PORT + rank))/metrics" | awk -v r="127.0.0.1:$((HTTP_PORT + rank))" '
    /^vllm:request_success_total/ {req += $NF}
    /^vllm:prefix_cache_queries_total/ {q = $NF}
    /^vllm:prefix_cache_hits_total/ {h = $NF}
    END {printf "%-8s %10d %14d %14d %9.1f%%\n", substr(r, length(r)-4), req, q, h, (q > 0 ? 100*h/q : 0)}'
done
echo "(enginesim log: $log)"
