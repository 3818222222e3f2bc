"""Independent KV-event subscriber for the Go interop test.

Uses libzmq (pyzmq) and msgpack-python, not the Go code under test. It
subscribes to a publisher, fills sequence gaps over a DEALER replay request,
and prints every applied batch as one JSON line. It exits 0 after applying a
batch that contains an AllBlocksCleared event, non-zero on any error.
"""

import argparse
import json
import sys

import msgpack
import zmq

END_SEQ = b"\xff" * 8
MASK = (1 << 64) - 1


def norm_hash(h):
    if h is None:
        return None
    if isinstance(h, int):
        return h & MASK
    if isinstance(h, (bytes, bytearray, str)):
        b = h.encode("latin-1") if isinstance(h, str) else bytes(h)
        if len(b) < 8:
            raise ValueError("digest shorter than 8 bytes")
        return int.from_bytes(b[-8:], "big")
    raise TypeError("bad hash %r" % (h,))


FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def norm_event(ev):
    if isinstance(ev, list):
        tag = ev[0]
        fields = dict(zip(FIELDS.get(tag, []), ev[1:]))
    elif isinstance(ev, dict):
        tag = ev["type"]
        fields = ev
    else:
        raise TypeError("bad event %r" % (ev,))
    out = {"type": tag}
    if "block_hashes" in fields:
        out["block_hashes"] = [norm_hash(h) for h in fields["block_hashes"]]
    if "parent_block_hash" in fields:
        p = norm_hash(fields["parent_block_hash"])
        out["parent"] = None if p == 0 else p
    if "token_ids" in fields:
        out["token_ids"] = list(fields["token_ids"])
    for k in ("block_size", "medium"):
        if k in fields:
            out[k] = fields[k]
    return out


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    if isinstance(batch, dict):
        ts, events, rank = batch["ts"], batch["events"], batch.get("data_parallel_rank")
    else:
        ts, events = batch[0], batch[1]
        rank = batch[2] if len(batch) > 2 else None
    return ts, [norm_event(e) for e in events], rank


def emit(seq, payload, source):
    ts, events, rank = decode(payload)
    print(json.dumps({"seq": seq, "source": source, "ts": ts, "dp_rank": rank, "events": events}), flush=True)
    return any(e["type"] == "AllBlocksCleared" for e in events)


def replay(ctx, endpoint, start, timeout_ms):
    """Yield (seq, payload) for every buffered batch from start."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not dealer.poll(timeout_ms):
                raise TimeoutError("replay timed out")
            frames = dealer.recv_multipart()
            if len(frames) == 4:  # vLLM 0.26+: [empty, topic, seq, payload]
                frames = [frames[0]] + frames[2:]
            if len(frames) != 3 or frames[0] != b"":
                raise ValueError("bad replay reply %r" % (frames,))
            if frames[1] == END_SEQ:
                return
            yield int.from_bytes(frames[1], "big"), frames[2]
    finally:
        dealer.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay", default="")
    ap.add_argument("--topic", default="")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.endpoint)

    timeout_ms = int(args.timeout * 1000)
    last = None
    last_live = None
    done = False
    while not done:
        if not sub.poll(timeout_ms):
            print("timed out waiting for events", file=sys.stderr)
            return 2
        frames = sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            print("bad message %r" % (frames,), file=sys.stderr)
            return 3
        seq = int.from_bytes(frames[1], "big")
        if last_live is not None and seq <= last_live:
            # The live sequence went down: the engine restarted. Start over
            # from this batch, as a router drops that engine's state.
            print(json.dumps({"seq": seq, "source": "restart"}), flush=True)
            last = None
        last_live = seq
        if last is not None and seq <= last:
            continue  # already applied by a replay
        if last is not None and seq > last + 1:
            if not args.replay:
                print("gap after %d and no replay endpoint" % last, file=sys.stderr)
                return 4
            for rseq, payload in replay(ctx, args.replay, last + 1, timeout_ms):
                if rseq <= last:
                    continue
                if rseq != last + 1:
                    print("replay hole: got %d after %d" % (rseq, last), file=sys.stderr)
                    return 5
                done = emit(rseq, payload, "replay") or done
                last = rseq
            if seq <= last:
                continue
            if seq != last + 1:
                print("replay ended at %d before %d" % (last, seq), file=sys.stderr)
                return 6
        done = emit(seq, frames[2], "live") or done
        last = seq
    sub.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
