#!/usr/bin/env bash
# Resolves the tool-call parser of one model before the install, as the
# runbook shows (the root setup.sh hands over to this file):
#
#   TOOL_PROFILE=auto ./setup.sh
#   TOOL_PROFILE=custom VLLM_TOOL_CALL_PARSER=<official-parser> ./setup.sh
#
# auto takes the reviewed parser of the exact model family from
# deploy/config/tool-profiles.tsv (config/ at the repository root); custom
# takes a parser you reviewed (VLLM_TOOL_CALL_PARSER, or
# SGLANG_TOOL_CALL_PARSER with ENGINE=sglang). An unknown family fails
# closed. The result goes to out/tool-profile.env, where install.sh reads it
# for the same MODEL_ID and ENGINE; without it install.sh resolves alone.
# The resolution itself is install.sh's (deploy/tool-profile.sh).
set -euo pipefail

usage() {
	cat <<'USAGE'
Usage: [MODEL_ID=owner/name] [ENGINE=vllm|sglang] TOOL_PROFILE=auto|custom \
       [VLLM_TOOL_CALL_PARSER=name | SGLANG_TOOL_CALL_PARSER=name] ./setup.sh

  MODEL_ID      the model install.sh serves (as in the install command);
                default: the one of the last setup.sh run
  ENGINE        vllm (default: the last run's, else vllm) or sglang
  TOOL_PROFILE  auto (default): the reviewed family's parser from
                config/tool-profiles.tsv; custom: the parser given
  TOOL_PROFILE_ENV
                where the result goes (default out/tool-profile.env)
USAGE
}
case "${1:-}" in
-h|--help) usage; exit 0 ;;
"") ;;
*) echo "setup.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
profiles="${TOOL_PROFILES_FILE:-$here/config/tool-profiles.tsv}"
result="${TOOL_PROFILE_ENV:-$root/out/tool-profile.env}"
# shellcheck source=tool-profile.sh
source "$here/tool-profile.sh"

errors=()
fail() { errors+=("$1"); }

saved_model="" saved_engine=""
[[ -r "$result" ]] && tool_profile_load "$result"
MODEL_ID="${MODEL_ID:-$saved_model}"
ENGINE="${ENGINE:-${saved_engine:-vllm}}"
TOOL_PROFILE="${TOOL_PROFILE:-auto}"

[[ -n "$MODEL_ID" ]] || fail "MODEL_ID is required: the model of the install command, e.g. MODEL_ID=Qwen/Qwen3-32B TOOL_PROFILE=auto ./setup.sh (or export the install variables first)"
[[ -z "$MODEL_ID" || "$MODEL_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$ ]] || fail "MODEL_ID '$MODEL_ID' is not a Hugging Face model id (owner/name)"
case "$ENGINE" in vllm|sglang) ;; *) fail "ENGINE '$ENGINE' must be vllm or sglang" ;; esac
((${#errors[@]})) || tool_profile_resolve

if ((${#errors[@]})); then
	# A failed run leaves no result behind: install.sh then resolves alone
	# and fails closed the same way.
	if [[ -e "$result" ]]; then
		rm -f "$result"
		echo "setup.sh: removed the previous result $result" >&2
	fi
	echo "setup.sh: no tool profile:" >&2
	printf '  - %s\n' "${errors[@]}" >&2
	exit 2
fi

mkdir -p "$(dirname "$result")"
{
	echo "# Written by setup.sh; install.sh reads it for the same MODEL_ID and ENGINE."
	echo "# Re-run setup.sh to change it; remove it and install.sh resolves alone."
	echo "MODEL_ID=$MODEL_ID"
	echo "ENGINE=$ENGINE"
	echo "TOOL_PROFILE=$TOOL_PROFILE"
	echo "TOOL_FAMILY=$tool_family"
	echo "TOOL_CALL_PARSER=$tool_parser"
	echo "REASONING_PARSER=$reasoning_parser"
} >"$result"
echo "setup.sh: $MODEL_ID on $ENGINE: tool family '$tool_family', parser '$tool_parser'${reasoning_parser:+, reasoning parser '$reasoning_parser'} ($TOOL_PROFILE)"
echo "setup.sh: wrote $result; install.sh uses it for this MODEL_ID and ENGINE"
