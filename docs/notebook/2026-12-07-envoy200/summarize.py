#!/usr/bin/env python3
"""Summarises a bench-*.txt file: per body size and side, epp/noop over
every run (min, median, max), the decision's median (route-p50-us), and
each -count 3 run's best epp/noop (the target's "best of 3")."""
import collections
import re
import statistics as st
import sys

ratios = collections.defaultdict(list)
route = collections.defaultdict(list)
runs = collections.defaultdict(list)
side = rnd = None
for line in open(sys.argv[1]):
    if line.startswith('#'):
        side, rnd = line.split()[1], line.split()[2]
        continue
    size = line.split()[0].split('/')[1].split('-')[0]
    r = float(re.search(r'([\d.]+) epp/noop', line).group(1))
    ratios[(size, side)].append(r)
    route[(size, side)].append(float(re.search(r'([\d.]+) route-p50-us', line).group(1)))
    runs[(size, side, rnd)].append(r)
for k in sorted(ratios):
    v = ratios[k]
    bests = [min(x) for (s, sd, _), x in runs.items() if (s, sd) == k]
    print('%-6s %-10s epp/noop min %.3f med %.3f max %.3f n=%d  route-p50 med %.0f us  best of 3 per run: %s (<= 1.10 in %d of %d)' % (
        k[0], k[1], min(v), st.median(v), max(v), len(v), st.median(route[k]),
        ' '.join('%.3f' % b for b in bests), sum(b <= 1.10 for b in bests), len(bests)))
