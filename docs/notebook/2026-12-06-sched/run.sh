#!/bin/sh
# Interleaved before/after runs of BenchmarkSchedule64 at 64, 256 and
# 1,024 replicas: ROUNDS rounds (default 5), each running the two test
# binaries one after the other (the order alternates), so both see the
# same machine. BEFORE and AFTER are scheduler test binaries
# (go test -c -o X ./scheduler at the two commits); OUT the directory the
# raw outputs go to.
set -eu
: "${BEFORE:?}" "${AFTER:?}" "${OUT:=.}"
ROUNDS=${ROUNDS:-5}
BENCH='Schedule64/replicas=(64|256|1024)$'
: >"$OUT/before.txt"
: >"$OUT/after.txt"
: >"$OUT/uptime.txt"
i=1
while [ "$i" -le "$ROUNDS" ]; do
	uptime >>"$OUT/uptime.txt"
	if [ $((i % 2)) -eq 1 ]; then order="BEFORE AFTER"; else order="AFTER BEFORE"; fi
	for which in $order; do
		eval bin=\$$which
		name=$(echo "$which" | tr 'A-Z' 'a-z')
		"$bin" -test.run '^$' -test.bench "$BENCH" -test.count 1 >>"$OUT/$name.txt"
	done
	i=$((i + 1))
done
uptime >>"$OUT/uptime.txt"
