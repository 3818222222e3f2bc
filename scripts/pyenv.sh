#!/usr/bin/env bash
# Makes, or reuses, one pinned Python environment: scripts/pyenv.sh NAME
# installs scripts/python/NAME.txt with `pip install --no-deps` into
# .cache/py/NAME/ and stamps it with the file's hash, so a warm machine
# skips it and a changed pin rebuilds it.
#
# On failure it exits 1 and leaves .cache/py/NAME.err: the command to run
# and the tail of pip's output. The tests that need the environment
# (internal/testutil/pyenv) fail with that text; they never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:?usage: scripts/pyenv.sh envoy|vllm}
req=scripts/python/$name.txt
dir=.cache/py/$name
[ -f "$req" ] || { echo "pyenv: no $req" >&2; exit 2; }

sum=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$sum" ]; then
  exit 0
fi

mkdir -p .cache/py
rm -rf "$dir" "$dir.err"
echo "pyenv: installing $req into $dir"
log=.cache/py/$name.log
if ! { python3 -m venv "$dir" &&
  "$dir/bin/pip" install --no-input --disable-pip-version-check --no-deps -r "$req"; } >"$log" 2>&1; then
  {
    echo "scripts/pyenv.sh $name failed (python3 -m venv $dir && $dir/bin/pip install --no-deps -r $req):"
    tail -n 20 "$log"
  } >"$dir.err"
  cat "$dir.err" >&2
  exit 1
fi
echo "$sum" >"$dir/.installed"
