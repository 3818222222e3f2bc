"""Independent KV-event publisher for the Go interop test.

Uses libzmq (pyzmq) and msgpack-python, not the Go code under test, and
mimics the engines: a PUB socket, a ROUTER serving replay requests from a
buffer, and batches in every wire shape (vLLM legacy arrays, vLLM 0.26 maps
with bin digests, SGLang arrays with signed hashes).

Protocol with the test over stdio:
  - first stdout line: {"pub": endpoint, "replay": endpoint}
  - publishes probe batches every 50 ms until stdin says "go"
  - then publishes the test batches (some only buffered, never sent: a gap),
    prints {"expect": [{"seq": n, "hashes": [...]}, ...]} and keeps serving
    replay until stdin says "quit" or closes.
"""

import argparse
import json
import select
import sys
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8
MASK = (1 << 64) - 1


def digest(i):
    """A 32-byte digest whose last 8 bytes are the key."""
    key = (0x9E3779B97F4A7C15 * (i + 1)) & MASK
    return bytes([i & 0xFF]) * 24 + key.to_bytes(8, "big"), key


def signed(key):
    return key - (1 << 64) if key >= (1 << 63) else key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=["seq", "topic-seq"], default="seq")
    ap.add_argument("--topic", default="kv-events")
    args = ap.parse_args()
    topic = args.topic.encode()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"pub": "tcp://127.0.0.1:%d" % pub_port, "replay": "tcp://127.0.0.1:%d" % replay_port}), flush=True)

    buffer = []
    state = {"seq": 0}

    def publish(batch, send=True):
        seq = state["seq"]
        state["seq"] += 1
        payload = msgpack.packb(batch, use_bin_type=True)
        buffer.append((seq, payload))
        if send:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        return seq

    def serve_replay():
        frames = router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, payload in buffer:
            if seq >= start:
                if args.layout == "topic-seq":
                    router.send_multipart([ident, b"", topic, seq.to_bytes(8, "big"), payload])
                else:
                    router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
        if args.layout == "topic-seq":
            router.send_multipart([ident, b"", b"", END_SEQ, b""])
        else:
            router.send_multipart([ident, b"", END_SEQ, b""])

    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)

    started = False
    deadline = time.time() + 60
    while time.time() < deadline:
        if not started:
            publish([time.time(), [["BlockRemoved", [1], "GPU"]], 0])
        for sock, _ in poller.poll(50):
            if sock is router:
                serve_replay()
                continue
            line = sys.stdin.readline()
            if line.strip() == "go" and not started:
                started = True
                expect = []
                for i in range(12):
                    raw, key = digest(i)
                    _, parent = digest(i + 100)
                    shape = i % 3
                    if shape == 0:  # vLLM <= 0.23 positional, uint64 hashes
                        ev = ["BlockStored", [key], parent, [i, 2, 3, 4], 4, None, "GPU", None, None, 0, "full_attention", None]
                        batch = [time.time(), [ev], 0]
                    elif shape == 1:  # vLLM 0.26 tagged map, bin digests
                        ev = {"type": "BlockStored", "block_hashes": [raw], "parent_block_hash": None,
                              "token_ids": [i, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
                              "lora_name": None, "group_idx": 0, "locality": "local"}
                        batch = [time.time(), [ev, {"type": "BlockRemoved", "block_hashes": [raw], "medium": "GPU", "group_idx": 0}], 0]
                    else:  # SGLang positional, signed int64 hashes
                        ev = ["BlockStored", [signed(key)], signed(parent), [i, 2, 3, 4], 4, None, "GPU", {"cache_salt": "s"}]
                        batch = [time.time(), [ev, ["BlockRemoved", [signed(key)], "GPU"]], 0]
                    # Batches 4..6 are buffered but never sent: a gap to replay.
                    seq = publish(batch, send=not (4 <= i <= 6))
                    hashes = [key] if shape == 0 else [key, key]
                    expect.append({"seq": seq, "hashes": hashes})
                print(json.dumps({"expect": expect}), flush=True)
            elif line == "" or line.strip() == "quit":
                pub.close()
                router.close()
                ctx.term()
                return 0
    print("timed out", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
