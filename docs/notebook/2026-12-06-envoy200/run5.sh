#!/bin/bash
# Fifth pass: alternates the fourth pass's EPP as merged (before, 3dae1d7)
# with this pass's: after1 (0414f83, the speculative match's skip and the
# keys' held tokens), after2 (84ed091, the held tokens alone), after3
# (4c20276, with the string decoder's adds) and after4 (7747763, with the
# body kept at its Content-Length), each built with go test -c from the
# same e2e/envoy code. Session A ran before, after1 and after2; session B
# before, after2 and after3; session C before, after2, after3 and after4
# (SIDES, RUNS).
set -u
for round in ${ROUNDS:-1 2 3 4 5 6}; do
  for side in ${SIDES:-before after1 after2}; do
    out=${RUNS:-/tmp/e200e/runs}/bench5-$side-$round.txt
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } > $out
    (cd /work/wt/envoy200e/e2e/envoy && /tmp/e200e/envoy-$side.test -test.run '^$' -test.bench EPPInEnvoy -test.count 3 2>&1) >> $out
    { echo "# $(date -u +%FT%TZ) uptime: $(uptime)"; } >> $out
  done
done
echo finished > ${RUNS:-/tmp/e200e/runs}/done
