# Sourced by install.sh and setup.sh (never run): the one resolution of the
# tool-call parser from the reviewed profile of the exact model family.
# Unknown families fail closed (conformance would fail anyway, after a GPU
# rollout). Starts no program but quoter, awk and tr, which the installer's
# callers already allow (deploy/clustertest's installerTools).
#
# tool_profile_resolve reads MODEL_ID, ENGINE, TOOL_PROFILE,
# VLLM_TOOL_CALL_PARSER, SGLANG_TOOL_CALL_PARSER and $profiles, sets
# tool_family, tool_parser and reasoning_parser, and reports problems
# through the caller's fail.
resolve_with_awk() {
	awk -F'\t' -v model="$(printf '%s' "$MODEL_ID" | tr '[:upper:]' '[:lower:]')" -v engine="$ENGINE" '
		/^#/ || $1 == "family" || NF < 5 { next }
		model ~ tolower($2) {
			parser = (engine == "sglang") ? $5 : $3
			reasoning = (engine == "sglang") ? "-" : $4
			printf "%s\t%s\t%s\n", $1, parser, reasoning
			exit
		}' "$profiles"
}
tool_profile_resolve() {
	local out row k v
	tool_family="" tool_parser="" reasoning_parser=""
	case "$TOOL_PROFILE" in
	auto)
		if command -v quoter >/dev/null 2>&1; then
			if out="$(quoter tool-profile --profiles "$profiles" --mode auto --model "$MODEL_ID" --engine "$ENGINE" --format env 2>&1)"; then
				while IFS='=' read -r k v; do
					v="${v#\'}" v="${v%\'}"
					case "$k" in
					TOOL_FAMILY) tool_family="$v" ;;
					TOOL_CALL_PARSER) tool_parser="$v" ;;
					REASONING_PARSER) reasoning_parser="$v" ;;
					esac
				done <<<"$out"
				[[ -n "$tool_parser" ]] || fail "quoter tool-profile resolved no parser for MODEL_ID '$MODEL_ID' on $ENGINE"
			else
				fail "no reviewed tool profile for MODEL_ID '$MODEL_ID' on $ENGINE (fail closed): ${out##*: }"
			fi
		elif [[ ! -r "$profiles" ]]; then
			fail "tool profiles $profiles not readable"
		else
			row="$(resolve_with_awk)"
			if [[ -z "$row" ]]; then
				fail "no reviewed tool profile matches MODEL_ID '$MODEL_ID' (fail closed); after reviewing the family's official parser, set TOOL_PROFILE=custom and VLLM_TOOL_CALL_PARSER (or SGLANG_TOOL_CALL_PARSER)"
			else
				IFS=$'\t' read -r tool_family tool_parser reasoning_parser <<<"$row"
				if [[ "$tool_parser" == "-" || -z "$tool_parser" ]]; then
					fail "tool family '$tool_family' has no reviewed $ENGINE parser (fail closed); use ENGINE=vllm or a reviewed custom parser"
				fi
			fi
		fi
		[[ "$reasoning_parser" == "-" ]] && reasoning_parser=""
		;;
	custom)
		tool_family="custom"
		if [[ "$ENGINE" == sglang ]]; then
			tool_parser="${SGLANG_TOOL_CALL_PARSER:-${VLLM_TOOL_CALL_PARSER:-}}"
		else
			tool_parser="${VLLM_TOOL_CALL_PARSER:-}"
		fi
		[[ -n "$tool_parser" ]] || fail "TOOL_PROFILE=custom needs VLLM_TOOL_CALL_PARSER (or SGLANG_TOOL_CALL_PARSER for sglang)"
		[[ -z "$tool_parser" || "$tool_parser" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || fail "tool parser '$tool_parser' is not a parser name"
		;;
	*) fail "TOOL_PROFILE '$TOOL_PROFILE' must be auto or custom" ;;
	esac
	return 0
}

# tool_profile_load FILE: the result setup.sh left (KEY=value lines, read
# without running anything) into saved_model, saved_engine, saved_mode,
# saved_family, saved_parser and saved_reasoning.
tool_profile_load() {
	local k v
	saved_model="" saved_engine="" saved_mode="" saved_family="" saved_parser="" saved_reasoning=""
	while IFS='=' read -r k v; do
		case "$k" in
		MODEL_ID) saved_model="$v" ;;
		ENGINE) saved_engine="$v" ;;
		TOOL_PROFILE) saved_mode="$v" ;;
		TOOL_FAMILY) saved_family="$v" ;;
		TOOL_CALL_PARSER) saved_parser="$v" ;;
		REASONING_PARSER) saved_reasoning="$v" ;;
		esac
	done <"$1"
}
