#!/usr/bin/env python3
"""Markdown rows from bench JSON files: python3 table.py NAME.json...

Each row: run, policy, goodput tok/s (x precise's in the same run),
sessions done/min, hit rate (/ bound), TTFT p50/p90/p99 ms, session
p50/p90 s, output tok/s, done/started, errors, 429 given up / retried,
moves, sessions admitted within the KV budget / past it (spare compute).
Figures the report does not have (another EPP, an older binary) are "-"."""
import json, os, sys

NAMES = {"docs/notebook/2026-12-07-agents-workers/agent-noadm.yaml": "agent, admission off", "llmd": "llm-d EPP"}

print("| run | policy | goodput tok/s (x precise) | sessions done/min | hit rate (/ bound) | TTFT p50 / p90 / p99 ms | session p50 / p90 s | output tok/s | done / started | errors | 429 given up / retried | moves | admitted room / spare |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for f in sys.argv[1:]:
    d = json.load(open(f))
    run = os.path.basename(f)[:-5]
    bound = d["bound_hit_rate"]
    base = next(r["sessions"]["goodput_tok_per_s"] for r in d["results"] if r["policy"] == "precise")
    for r in d["results"]:
        s = r["sessions"]
        g = s["goodput_tok_per_s"]
        mv = s.get("moves", "-") if r.get("kind") != "exec" else "-"
        room, spare = s.get("admitted_room"), s.get("admitted_spare_compute")
        adm = f"{room:.0f} / {spare:.0f}" if room is not None and spare is not None and r.get("kind") != "exec" else "-"
        print(f"| {run} | {NAMES.get(r['policy'], r['policy'])} | {g:.0f} ({g / base:.2f}x) | {s['completed_per_min']:.1f} | "
              f"{100 * r['hit_rate']:.1f}% ({100 * r['hit_rate'] / bound:.1f}%) | "
              f"{r['ttft_p50_ms']:.0f} / {r['ttft_p90_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
              f"{s['completion_p50_s']:.1f} / {s['completion_p90_s']:.1f} | {r['output_tok_per_s']:.0f} | "
              f"{s['completed']} / {s['started']} | {r['errors']} | {s['refused']} / {s['retries']} | {mv} | {adm} |")
