#!/bin/bash
# Second pass: alternates the first pass's EPP (before, 43cb795) and this
# pass's (after), built with go test -c from the same e2e/envoy code.
set -u
for round in ${ROUNDS:-1 2 3}; do
  for side in before after; do
    out=/tmp/e200b/runs/bench2-$side-$round.txt
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } > $out
    (cd /work/wt/envoy200b/e2e/envoy && /tmp/e200b/envoy-$side.test -test.run '^$' -test.bench EPPInEnvoy -test.count 3 2>&1) >> $out
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } >> $out
  done
done
echo finished > /tmp/e200b/runs/done
