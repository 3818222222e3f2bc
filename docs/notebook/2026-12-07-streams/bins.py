#!/usr/bin/env python3
"""bins.py STATE_DIR: the curve bins of a saved proof run, per replica (the
EPP's snapshot at the idle quote) and pooled (the calibration's curve),
with each bin's share of inter-token gaps and first tokens within the
objectives, read as capacity.Histogram.Within reads them, and the
calibration's levels."""
import json
import sys


def within(h, bounds, x):
    if h["count"] <= 0:
        return 1.0
    lo, below = 0.0, 0.0
    for b, c in zip(bounds, h["counts"]):
        if x <= b:
            if b > lo:
                below += (c - below) * (x - lo) / (b - lo)
            return min(below / h["count"], 1.0)
        lo, below = b, c
    return min(below / h["count"], 1.0)


def show(name, c, ttft, itl):
    print(name)
    print("  load/replica  seconds  windows  ITL obs  ITL<=obj  TTFT<=obj  out tok/s")
    for b in c["bins"]:
        print("  %12.2f  %7.1f  %7.1f  %7.0f  %8.3f  %9.3f  %9.1f" % (
            b["concurrency"], b["seconds"], b["windows"], b["itl"]["count"],
            within(b["itl"], c["itl_bounds"], itl), within(b["ttft"], c["ttft_bounds"], ttft),
            b["output_tokens_per_sec"]))


d = sys.argv[1]
cal = json.load(open(d + "/calibration.json"))
o = cal["objectives"]
print("objectives: TTFT p95 %g s, ITL p95 %g ms" % (o["ttft_seconds"], 1000 * o["itl_seconds"]))
print("calibration levels (the whole fleet, client side):")
for l in cal["levels"]:
    print("  %2d streams  %4d requests  TTFT p95 %5.0f ms  ITL p95 %6.1f ms  %6.1f tok/s  within %s" % (
        l["concurrency"], l["requests"], 1000 * l["ttft_p95_seconds"], 1000 * l["itl_p95_seconds"],
        l["output_tokens_per_sec"], l["within"]))
show("calibration curve (both replicas pooled, one replica's share)", cal["curve"], o["ttft_seconds"], o["itl_seconds"])
snap = json.load(open(d + "/snapshot-0.json"))
for r in snap["models"][0]["replica_capacity"]:
    show("live curve of " + r["addr"] + " at the idle quote", r["curve"], o["ttft_seconds"], o["itl_seconds"])
