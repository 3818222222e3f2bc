#!/bin/bash
# Third pass: alternates the second pass's EPP (before, 49629d7) and this
# pass's (after), built with go test -c from the same e2e/envoy code.
set -u
for round in ${ROUNDS:-1 2 3}; do
  for side in before after; do
    out=/tmp/e200c/runs/bench3-$side-$round.txt
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } > $out
    (cd /work/wt/envoy200/e2e/envoy && /tmp/e200c/envoy-$side.test -test.run '^$' -test.bench EPPInEnvoy -test.count 3 2>&1) >> $out
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } >> $out
  done
done
echo finished > /tmp/e200c/runs/done
