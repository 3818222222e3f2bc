"""Captures SGLang's real KV-event wire format for the decoder's tests.

SGLang's publisher (sglang.srt.disaggregation.kv_events, sglang 0.5.23)
imports without its GPU parts; the pinned vLLM environment lacks three of
its imports (orjson, IPython, traitlets), so it is run once by hand, not
by the tests:

  .cache/py/vllm/bin/python -m pip download sglang==0.5.23 --no-deps -d /tmp/sgl
  (cd /tmp/sgl && python3 -m zipfile -e sglang-0.5.23-*.whl pkg)
  .cache/py/vllm/bin/python -m pip install --no-deps --target /tmp/sgl/extra orjson IPython traitlets
  PYTHONPATH=/tmp/sgl/pkg:/tmp/sgl/extra .cache/py/vllm/bin/python \
      e2e/vllm/sglang_capture.py engines/kvevents/testdata/sglang-0.5.23.frames

It publishes a few batches through SGLang's own ZmqEventPublisher on an
ipc endpoint, receives them with a plain ZMQ SUB socket, and writes each
message's frames in hex, one message a line (topic, sequence, payload).
"""

import os
import sys
import tempfile
import time

import zmq
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

BATCHES = [
    [
        BlockStored(block_hashes=[101, -202], parent_block_hash=None,
                    token_ids=[1, 2, 3, 4, 5, 6, 7, 8], block_size=4, lora_id=None,
                    medium="GPU"),
        BlockStored(block_hashes=[303], parent_block_hash=-202,
                    token_ids=[9, 10, 11, 12], block_size=4, lora_id=None,
                    cache_salt="salt-a", session_id="s1"),
    ],
    [BlockRemoved(block_hashes=[303], medium="GPU")],
    [AllBlocksCleared()],
]


def main():
    out = sys.argv[1]
    d = tempfile.mkdtemp()
    ep = "ipc://" + os.path.join(d, "kv.sock")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    pub = ZmqEventPublisher(attn_dp_rank=0, endpoint=ep, topic="kv")
    sub.connect(ep)
    time.sleep(0.5)
    for events in BATCHES:
        pub.publish(KVEventBatch(ts=1765000000.5, events=events))
    lines = []
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while len(lines) < len(BATCHES) and poller.poll(5000):
        lines.append(" ".join(f.hex() for f in sub.recv_multipart()))
    pub.shutdown()
    if len(lines) != len(BATCHES):
        sys.exit(f"received {len(lines)} of {len(BATCHES)} messages")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
