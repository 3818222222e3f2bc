#!/usr/bin/env bash
# Checks live /metrics scrapes against deploy/metrics.txt: `promtool check
# metrics` on each scrape, then every name listed for that component must be
# exposed with the listed type. Vectors appear only once they have a child, so
# scrape after some traffic has gone through the node.
#
#   deploy/live-metrics.sh http://127.0.0.1:9090/metrics http://127.0.0.1:9464/metrics [ENGINE_METRICS_URL...]
# An engine URL (vLLM or SGLang, e.g. enginesim) is checked against the
# engine names of its own flavour.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
(($# >= 2)) || { echo "usage: $0 EPP_METRICS_URL QUOTER_METRICS_URL [ENGINE_METRICS_URL...]" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
check() { # COMPONENT URL
	local comp="$1" url="$2" flavour=""
	if ! curl -fsS --max-time 10 "$url" >"$work/$comp.txt"; then
		echo "FAIL $comp: cannot scrape $url" >&2; status=1; return
	fi
	if [[ "$comp" != engine ]]; then
		if promtool check metrics <"$work/$comp.txt" >"$work/$comp.lint" 2>&1; then
			echo "ok   $comp: promtool check metrics"
		else
			echo "FAIL $comp: promtool check metrics" >&2; sed 's/^/       /' "$work/$comp.lint" >&2; status=1
		fi
	fi
	if [[ "$comp" == engine ]]; then
		flavour="$(grep -om1 -E '^# TYPE (vllm|sglang):' "$work/$comp.txt" | sed 's/^# TYPE //')"
		[[ -n "$flavour" ]] || { echo "FAIL engine: no vllm: or sglang: metrics at $url" >&2; status=1; return; }
	fi
	while read -r name type c; do
		[[ "$c" == "$comp" && "$name" == "$flavour"* ]] || continue
		if grep -qx "# TYPE $name $type" "$work/$comp.txt"; then
			echo "ok   $comp: $name ($type)"
		else
			echo "FAIL $comp: $name ($type) not exposed at $url" >&2; status=1
		fi
	done < <(grep -v '^#' "$here/metrics.txt" | grep .)
}
check epp "$1"
check quoter "$2"
shift 2
for url in "$@"; do check engine "$url"; done
exit "$status"
