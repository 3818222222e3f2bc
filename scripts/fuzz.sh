#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME each (default 5s).
#
# A real finding fails the run ("Failing input written to testdata/fuzz/...",
# which is then committed as a regression seed). Go's fuzzer can also end a
# clean run with "context deadline exceeded" when the time runs out while it
# is minimising a new interesting input; that is not a finding, so such a
# target is run once more, and fails for real if it happens again.
set -uo pipefail
fuzztime=${FUZZTIME:-5s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    for attempt in 1 2; do
      echo "fuzz $pkg $target for $fuzztime"
      if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 1s "$pkg" >"$log" 2>&1; then
        tail -n 2 "$log"
        break
      fi
      cat "$log"
      if [ "$attempt" = 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
        echo "fuzz: $target ended on the fuzzer's own deadline, not a finding; running it again"
        continue
      fi
      exit 1
    done
  done
done
