#!/bin/bash
# Fourth pass: alternates the third pass's EPP (before, df0fc40), this
# pass's with the ids by reference (after1, b42edda) and with the string
# decoder's jump as well (after2, cd40930), each built with go test -c
# from the same e2e/envoy code, in one session.
set -u
for round in ${ROUNDS:-1 2 3 4 5 6}; do
  for side in before after1 after2; do
    out=/tmp/e200d/runs/bench4-$side-$round.txt
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } > $out
    (cd /work/wt/envoy200d/e2e/envoy && /tmp/e200d/envoy-$side.test -test.run '^$' -test.bench EPPInEnvoy -test.count 3 2>&1) >> $out
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } >> $out
  done
done
echo finished > /tmp/e200d/runs/done
