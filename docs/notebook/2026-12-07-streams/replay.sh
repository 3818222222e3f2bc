#!/bin/sh
# replay.sh OLD_QUOTER NEW_QUOTER: the idle quote of each saved real-vLLM
# run, read offline from the EPP's snapshot and the calibration saved at
# that quote, by two quoter binaries (before and after a change to the
# ladder's bounds). The "repeated" rows append to the calibration's ladder
# its proof's first closed-loop check at the streams it sold, as the
# ladder's repeat of that level (quoter calibrate --repeats).
set -eu
old=$1 new=$2
P=$(dirname "$0")/../2026-12-06-vllm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
repeated() { # attempt-dir: writes $tmp/<attempt>.json, prints its path
	python3 - "$P/proof/$1" "$tmp/$1.json" <<'PY'
import json, sys
d, out = sys.argv[1:]
cal = json.load(open(d + "/state/calibration.json"))
o = cal["objectives"]
c = next(c for c in json.load(open(d + "/proof.json"))["checks"] if c["label"] == "1.00x quoted concurrency")
lv = {"concurrency": c["streams"], "requests": c["requests"], "errors": c["errors"],
      "ttft_p95_seconds": c["ttft_p95_ms"] / 1000, "itl_p95_seconds": c["itl_p95_ms"] / 1000,
      "output_tokens_per_sec": c["output_tok_per_s"]}
lv["within"] = lv["ttft_p95_seconds"] <= o["ttft_seconds"] and lv["itl_p95_seconds"] <= o["itl_seconds"]
cal["levels"].append(lv)
json.dump(cal, open(out, "w"))
PY
	echo "$tmp/$1.json"
}
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
row "attempt 9, precise, 5 repeated (2 s / 50 ms)" "$P/proof/attempt-9/state/snapshot-0.json" "$(repeated attempt-9)"
row "attempt 10, precise (2 s / 50 ms)" "$P/proof/attempt-10/state/snapshot-0.json" "$P/proof/attempt-10/state/calibration.json"
row "attempt 10, precise, 7 repeated (2 s / 50 ms)" "$P/proof/attempt-10/state/snapshot-0.json" "$(repeated attempt-10)"
