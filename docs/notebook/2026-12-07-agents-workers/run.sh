#!/bin/sh
# One acceptance run: precise, agent, agent with session admission off
# (agent-noadm.yaml) and llm-d-router's EPP (built as bench/README.md
# says; LLMD_EPP names the binary), each on a fresh fleet, in one process
# run; the load average before and after goes in OUT/$1.load.
# $1: output name (OUT/$1.txt, .json, .html); the rest: extra bench flags.
set -e
name=$1; shift
cd "$(dirname "$0")/../../.."
out=${OUT:-out/agents-workers}
mkdir -p "$out"
uptime > "$out/$name.load"
${BENCH:-bin/bench} -scenario agents -policies precise,agent,docs/notebook/2026-12-07-agents-workers/agent-noadm.yaml \
  -policies "exec:llmd=${LLMD_EPP:-llmd-epp} --config-file {file:docs/notebook/2026-12-07-agents-workers/llmd-epp.yaml} --pool-name bench --grpc-port {grpc_port} --grpc-health-port {health_port} --metrics-port {metrics_port} --secure-serving=false --health-checking --drain-timeout 1s --tracing=false" \
  -epp-dir "$out/epp-$name" -html "$out/$name.html" -json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1
uptime >> "$out/$name.load"
