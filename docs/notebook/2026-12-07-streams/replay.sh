#!/bin/sh
# replay.sh OLD_QUOTER NEW_QUOTER: the idle quote of each saved real-vLLM
# run, read offline from the EPP's snapshot and the calibration saved at
# that quote, by two quoter binaries (before and after the fleet ladder).
set -eu
old=$1 new=$2
P=$(dirname "$0")/../2026-12-06-vllm
row() { # name dir-with-files snapshot calibration [objective flags]
	name=$1 snap=$2 cal=$3; shift 3
	for b in "$old" "$new"; do
		"$b" headroom --snapshot "$snap" --calibration-file "$cal" "$@" 2>/dev/null |
			python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; a=r["assessment"]; c=a.get("calibrated_streams"); k=a.get("calibrated_tokens_per_sec"); print("%s\t%s\t%d\t%d\t%.2f\t%s\t%s" % (sys.argv[1], sys.argv[2], r["headroom_tokens_per_sec"], r["headroom_concurrency"], a["streams"], "-" if c is None else "%.2f" % c, "-" if k is None else "%.1f" % k))' "$name" "$(basename "$b")"
	done
}
printf 'run\tbinary\ttok/s\tstreams\tsum or bound\tcalibrated_streams\tcalibrated_tokens_per_sec\n'
D=$(dirname "$0")/../2026-12-06-capacity-demo/dir
row "simulated demo fleet, 4 replicas (2 s / 50 ms)" "$D/snapshot-1.json" "$D/calibration.json"
row "notebook calibration (2 s / 50 ms)" "$P/capacity-snapshot.json" "$P/calibration.json"
row "attempt 7 (2 s / 50 ms)" "$P/proof/attempt-7/state/snapshot-0.json" "$P/proof/attempt-7/state/calibration.json"
row "attempt 8, precise (2 s / 50 ms)" "$P/proof/precise/state/snapshot-0.json" "$P/proof/precise/state/calibration.json"
row "loose (3 s / 300 ms)" "$P/proof/loose-state/snapshot-0.json" "$P/proof/loose-state/calibration.json" --slo-ttft-p95 3s --slo-itl-p95 300ms
row "attempt 9, precise (2 s / 50 ms)" "$P/proof/attempt-9/state/snapshot-0.json" "$P/proof/attempt-9/state/calibration.json"
