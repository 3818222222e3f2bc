#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME each (default 10s).
set -euo pipefail
fuzztime=${FUZZTIME:-10s}
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "fuzz $pkg $target for $fuzztime"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done
