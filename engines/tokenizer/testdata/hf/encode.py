"""Hugging Face tokenizers' side of BenchmarkTokenizeVsHF.

Usage: python encode.py TOKENIZER_JSON

Loads the tokenizer once, prints {"version": ...}, then answers each JSON
line {"text": str, "cold": bool, "ids": bool} on stdin with one line
{"cpu_ns": int, "wall_ns": int[, "ids": [...]]}: the calling thread's CPU
time and the wall time of encode(text, add_special_tokens=False), as vLLM
encodes a rendered prompt. cold empties the BPE model's word cache first
(untimed), as the Go side empties its own. Parallelism is off, so the
encode runs on the timed thread.
"""
import json
import os
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main() -> None:
    tok = Tokenizer.from_file(sys.argv[1])
    print(json.dumps({"version": tokenizers.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("cold"):
            tok.model._clear_cache()
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        enc = tok.encode(req["text"], add_special_tokens=False)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        out = {"cpu_ns": c1 - c0, "wall_ns": w1 - w0}
        if req.get("ids"):
            out["ids"] = enc.ids
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
