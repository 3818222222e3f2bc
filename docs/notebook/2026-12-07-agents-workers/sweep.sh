#!/bin/sh
# One point of the offered-agents sweep: precise, agent and agent with
# session admission off (agent-noadm.yaml) on one fleet, each on a fresh
# fleet, in one process run. $1: output name; the rest: extra bench flags
# (-agent-concurrency N).
set -e
name=$1; shift
cd "$(dirname "$0")/../../.."
out=${OUT:-out/agents-workers}
mkdir -p "$out"
uptime > "$out/$name.load"
${BENCH:-bin/bench} -scenario agents -policies precise,agent,docs/notebook/2026-12-07-agents-workers/agent-noadm.yaml \
  -html "$out/$name.html" -json "$out/$name.json" "$@" > "$out/$name.txt" 2>&1
uptime >> "$out/$name.load"
