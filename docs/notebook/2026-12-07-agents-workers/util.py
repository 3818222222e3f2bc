#!/usr/bin/env python3
"""Prefill work over the fleet's prefill compute: python3 util.py NAME.json...

Per run and policy: the run's model duration (completed sessions over
sessions per minute), the prompt tokens the replicas counted, the
uncached ones (prompt x (1 - hit rate), per replica) and their rate over
the 4 replicas' 63,492 tokens/s (the simulator's 63 us a prefill token)."""
import json, sys
for f in sys.argv[1:]:
    d=json.load(open(f))
    for r in d["results"]:
        s=r["sessions"]
        dur=s["completed"]/s["completed_per_min"]*60
        reps=r.get("replicas") or []
        pt=sum(x["prompt_tokens"] for x in reps)
        miss=sum(x["prompt_tokens"]*(1-(x["hit_rate"] or 0)) for x in reps)
        print(f"{f.split('/')[-1][:-5]:8s} {r['policy'][-20:]:22s} dur {dur:6.0f}s prompt {pt/1e6:5.1f}M prefill {miss/1e6:5.1f}M util {miss/dur/63492:5.2f}")
