#!/bin/bash
# Alternates the parent commit's EPP (before) and this branch's (after), the same benchmark code.
set -u
for round in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then dir=/tmp/e200/base/e2e/envoy; else dir=/work/wt/envoy200/e2e/envoy; fi
    out=/tmp/e200/runs/final/bench-$side-$round.txt
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } > $out
    (cd $dir && /tmp/e200/envoy-$side.test -test.run '^$' -test.bench EPPInEnvoy -test.count 3 2>&1) >> $out
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } >> $out
  done
done
echo finished > /tmp/e200/runs/final/done
