"""Republishes an engine's KV events from its ipc:// PUB socket on a
loopback TCP port, frames unchanged, so an endpoint file (TCP ports only)
can name them without vLLM binding tcp://* (every interface).
Usage: python relay.py ipc:///RUNDIR/kv.sock PORT"""
import sys

import zmq

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(sys.argv[1])
pub = ctx.socket(zmq.PUB)
pub.bind("tcp://127.0.0.1:" + sys.argv[2])
zmq.proxy(sub, pub)
