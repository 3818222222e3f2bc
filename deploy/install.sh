#!/usr/bin/env bash
# Installs or upgrades one Omnious Provider Node release: validates the
# inputs, resolves the tool-call parser, applies the pinned CRDs (InferencePool,
# InferenceObjective, InferenceModelRewrite),
# creates the Secrets with kubectl (keys never pass through Helm values or any
# process's command line), runs `helm upgrade --install --wait`, then
# `helm test`; the chart's post-install hook calibrates the quoter against the
# latency objectives (SLO_TTFT_P95, SLO_ITL_P95). Safe to re-run. See
# deploy/README.md.
#
#   PROVIDER_ID=acme-qwen PROVIDER_KEY=/secure/acme.key \
#   (or PROVIDER_KEY=0x<64 hex digits>, the key itself, as the runbook shows)
#   MODEL_ID=Qwen/Qwen3-32B MODEL_CLASS=qwen3-32b \
#   FLOOR_IN=210000 FLOOR_OUT=680000 HF_TOKEN=hf_... \
#   ./deploy/install.sh [--env NAME] [--dry-run]
#
# The runbook's ./provider-node/install.sh is the same installer: the root
# install.sh hands over to this file.
set -euo pipefail

# The secrets leave the environment before any program starts: every child
# inherits the environment, and /proc/PID/environ shows it.
provider_key="${PROVIDER_KEY:-}" hf_token="${HF_TOKEN:-}"
unset PROVIDER_KEY HF_TOKEN

usage() {
	cat <<'EOF'
Usage: deploy/install.sh [--env NAME] [--namespace NS] [--release NAME]
                         [--values FILE] [--skip-test] [--dry-run]

Required environment:
  PROVIDER_ID   market provider id ([a-z0-9][a-z0-9-]*)
  PROVIDER_KEY  the signing key: 0x and 64 hex digits; or the path of a key
                file (that hex key, or a keystore JSON with
                PROVIDER_KEY_PASSWORD_FILE), or "-" to read the key from
                stdin. A file or stdin keeps the key out of shell history.
                The key only ever reaches kubectl on stdin.
  MODEL_ID      Hugging Face model id, e.g. Qwen/Qwen3-32B
  MODEL_CLASS   market model class, e.g. qwen3-32b
  FLOOR_IN      input price floor, integer micro-units per million tokens
  FLOOR_OUT     output price floor, integer micro-units per million tokens
Optional environment:
  HF_TOKEN      Hugging Face token (gated models)
  ENGINE        vllm (default) or sglang
  TOOL_PROFILE  auto (default: reviewed family from deploy/config/tool-profiles.tsv)
                or custom (with VLLM_TOOL_CALL_PARSER or SGLANG_TOOL_CALL_PARSER);
                unset, what setup.sh left in out/tool-profile.env
                (TOOL_PROFILE_ENV) for the same MODEL_ID and ENGINE, else auto
  BLOCK_SIZE    KV block size for engine and EPP (default 16)
  MODE          standalone (default) or gateway (then GATEWAY_NAME, SERVING_URL)
  GATEWAY_NAME, GATEWAY_NAMESPACE, SERVING_URL, MARKET_URL, FAILURE_MODE
  KEDA=1        enable the KEDA ScaledObject; MONITORING=1 the ServiceMonitor
                and PrometheusRule
  INSTALL_CRDS  auto (default), always or never
  SLO_TTFT_P95  p95 time-to-first-token objective, a Go duration (default 2s)
  SLO_ITL_P95   p95 inter-token latency objective, a Go duration (default 50ms)
  SKIP_CALIBRATION=1
                no calibration Job: the quoter runs without a calibration
Flags:
  --env NAME    environment (default mainnet): release provider-node-NAME in
                namespace omnious-NAME, Secrets and identity per environment
  --dry-run     validate and print every command; needs no cluster
EOF
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="$here/helm/provider-node"
# The pinned CRDs: file, CRD name, the annotation its bundle version is
# published under, and the pinned version.
crds=(
	"inference.networking.k8s.io_inferencepools.yaml inferencepools.inference.networking.k8s.io inference\.networking\.k8s\.io/bundle-version v1.0.0"
	"llm-d.ai_inferenceobjectives.yaml inferenceobjectives.llm-d.ai llm-d\.ai/bundle-version v0.10.0"
	"llm-d.ai_inferencemodelrewrites.yaml inferencemodelrewrites.llm-d.ai llm-d\.ai/bundle-version v0.10.0"
)
profiles="${TOOL_PROFILES_FILE:-$here/config/tool-profiles.tsv}"
# Where setup.sh leaves its result (deploy/setup.sh).
setup_result="${TOOL_PROFILE_ENV:-$(cd "$here/.." && pwd)/out/tool-profile.env}"
# shellcheck source=tool-profile.sh
source "$here/tool-profile.sh"

dry_run=0 env_name="mainnet" namespace="" release="" extra_values="" skip_test=0
while (($#)); do
	case "$1" in
	--dry-run) dry_run=1 ;;
	--env) env_name="${2:?--env needs a name}"; shift ;;
	--env=*) env_name="${1#--env=}" ;;
	--namespace|-n) namespace="${2:?--namespace needs a name}"; shift ;;
	--release) release="${2:?--release needs a name}"; shift ;;
	--values|-f) extra_values="${2:?--values needs a file}"; shift ;;
	--skip-test) skip_test=1 ;;
	-h|--help) usage; exit 0 ;;
	*) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

errors=()
fail() { errors+=("$1"); }
dns_label='^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'

[[ "$env_name" =~ $dns_label && ${#env_name} -le 20 ]] || fail "--env '$env_name' must be a DNS label of at most 20 characters"
release="${release:-provider-node-$env_name}"
namespace="${namespace:-omnious-$env_name}"
[[ "$release" =~ $dns_label && ${#release} -le 40 ]] || fail "release '$release' must be a DNS label of at most 40 characters"
[[ "$namespace" =~ $dns_label ]] || fail "namespace '$namespace' must be a DNS label"

ENGINE="${ENGINE:-vllm}"
# Without TOOL_PROFILE, setup.sh's result decides when it was made for this
# MODEL_ID and ENGINE: its custom parser is used as given, an auto result is
# resolved again from the current registry.
tool_source="" saved_parser=""
if [[ -z "${TOOL_PROFILE:-}" && -n "${MODEL_ID:-}" && -r "$setup_result" ]]; then
	tool_profile_load "$setup_result"
	if [[ "$saved_model" == "$MODEL_ID" && "$saved_engine" == "$ENGINE" ]]; then
		TOOL_PROFILE="$saved_mode" tool_source=" (from setup.sh: $setup_result)"
		if [[ "$saved_mode" == custom ]]; then
			VLLM_TOOL_CALL_PARSER="$saved_parser" SGLANG_TOOL_CALL_PARSER="$saved_parser"
		fi
	else
		echo "install.sh: note: $setup_result is setup.sh's result for MODEL_ID '$saved_model' on ${saved_engine:-?}, not this install's; resolving the tool profile here" >&2
	fi
fi
TOOL_PROFILE="${TOOL_PROFILE:-auto}"
BLOCK_SIZE="${BLOCK_SIZE:-16}"
MODE="${MODE:-standalone}"
FAILURE_MODE="${FAILURE_MODE:-FailClose}"
INSTALL_CRDS="${INSTALL_CRDS:-auto}"
SLO_TTFT_P95="${SLO_TTFT_P95:-2s}"
SLO_ITL_P95="${SLO_ITL_P95:-50ms}"
SKIP_CALIBRATION="${SKIP_CALIBRATION:-0}"

[[ -n "${PROVIDER_ID:-}" ]] || fail "PROVIDER_ID is required (the market provider id)"
[[ -z "${PROVIDER_ID:-}" || "$PROVIDER_ID" =~ ^[a-z0-9][a-z0-9-]{0,62}$ ]] || fail "PROVIDER_ID '$PROVIDER_ID' must match [a-z0-9][a-z0-9-]* (at most 63 characters)"
[[ -n "${MODEL_ID:-}" ]] || fail "MODEL_ID is required (a Hugging Face model id such as Qwen/Qwen3-32B)"
[[ -z "${MODEL_ID:-}" || "$MODEL_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$ ]] || fail "MODEL_ID '$MODEL_ID' is not a Hugging Face model id (owner/name)"
[[ -n "${MODEL_CLASS:-}" ]] || fail "MODEL_CLASS is required (the market model class, e.g. qwen3-32b)"
[[ -z "${MODEL_CLASS:-}" || "$MODEL_CLASS" =~ ^[a-z0-9][a-z0-9._-]*$ ]] || fail "MODEL_CLASS '$MODEL_CLASS' must be lower-case letters, digits, '.', '_' or '-'"
for v in FLOOR_IN FLOOR_OUT; do
	val="${!v:-}"
	if [[ -z "$val" ]]; then
		fail "$v is required (integer micro-units per million tokens)"
	elif ! [[ "$val" =~ ^[1-9][0-9]{0,17}$ ]]; then
		fail "$v '$val' must be a positive integer (micro-units per million tokens, no decimals)"
	fi
done
case "$ENGINE" in vllm|sglang) ;; *) fail "ENGINE '$ENGINE' must be vllm or sglang" ;; esac
case "$MODE" in
standalone) ;;
gateway)
	[[ -n "${GATEWAY_NAME:-}" ]] || fail "MODE=gateway needs GATEWAY_NAME (the Gateway the HTTPRoute attaches to)"
	[[ -n "${SERVING_URL:-}" ]] || fail "MODE=gateway needs SERVING_URL (the Gateway's public URL of this model)"
	;;
*) fail "MODE '$MODE' must be standalone or gateway" ;;
esac
[[ -z "${SERVING_URL:-}" || "$SERVING_URL" =~ ^https?://[^[:space:]/]+$ ]] || fail "SERVING_URL '$SERVING_URL' must be scheme://host[:port] with no path"
[[ -z "${MARKET_URL:-}" || "$MARKET_URL" =~ ^https?://[^[:space:]]+$ ]] || fail "MARKET_URL '$MARKET_URL' must be an http(s) URL"
case "$FAILURE_MODE" in FailOpen|FailClose) ;; *) fail "FAILURE_MODE '$FAILURE_MODE' must be FailOpen or FailClose" ;; esac
case "$INSTALL_CRDS" in auto|always|never) ;; *) fail "INSTALL_CRDS '$INSTALL_CRDS' must be auto, always or never" ;; esac
# Go durations (what time.ParseDuration reads, without a sign), above zero.
go_duration='^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))*$'
for v in SLO_TTFT_P95 SLO_ITL_P95; do
	val="${!v}"
	if ! [[ "$val" =~ $go_duration ]]; then
		fail "$v '$val' must be a Go duration such as 2s, 50ms or 1m30s"
	elif ! [[ "$val" =~ [1-9] ]]; then
		fail "$v '$val' must be above zero"
	fi
done
case "$SKIP_CALIBRATION" in 0|1) ;; *) fail "SKIP_CALIBRATION '$SKIP_CALIBRATION' must be 0 or 1" ;; esac
if ! [[ "$BLOCK_SIZE" =~ ^[0-9]+$ ]] || ((BLOCK_SIZE < 1 || BLOCK_SIZE > 128)); then
	fail "BLOCK_SIZE '$BLOCK_SIZE' must be an integer from 1 to 128"
elif [[ "$ENGINE" == vllm ]] && ! [[ "$BLOCK_SIZE" =~ ^(16|32|64|128)$ ]]; then
	fail "BLOCK_SIZE $BLOCK_SIZE is not a vLLM CUDA block size (16, 32, 64 or 128)"
fi
[[ -z "$extra_values" || -r "$extra_values" ]] || fail "--values file '$extra_values' is not readable"

# Private scratch space for the key and token files kubectl reads; removed on exit.
tmp="$(mktemp -d "${TMPDIR:-/tmp}/provider-node-install.XXXXXX")"
chmod 700 "$tmp"
trap 'rm -rf "$tmp"' EXIT

# The signing key: the key itself, a file path, or "-" for stdin.
# Validated, never printed, and gone from the environment before any other
# program starts.
key_format="file" key_file="" password_file=""
if [[ -z "$provider_key" ]]; then
	fail "PROVIDER_KEY is required: the key (0x and 64 hex digits), the path of the signing key file, or - to read it from stdin"
else
	if [[ "$provider_key" == "-" ]]; then
		key_file="$tmp/key"
		(umask 077 && cat >"$key_file")
	elif [[ "$provider_key" =~ ^(0x)?[0-9a-fA-F]{64}$ ]]; then
		# printf is a builtin: the key is in no process's argv.
		key_file="$tmp/key"
		(umask 077 && printf '%s\n' "$provider_key" >"$key_file")
		echo "install.sh: note: PROVIDER_KEY holds the key itself; PROVIDER_KEY=/path/to/key (chmod 600) or PROVIDER_KEY=- with the key on stdin keeps it out of your shell history" >&2
	elif [[ -f "$provider_key" && -r "$provider_key" ]]; then
		key_file="$provider_key"
		mode="$(stat -c %a "$key_file")"
		[[ "$mode" =~ ^[0-7]00$ ]] || fail "PROVIDER_KEY file $key_file has mode $mode; make it owner-only (chmod 600)"
	elif [[ "$provider_key" =~ ^(0x)?[0-9a-fA-F]+$ ]]; then
		# A mistyped key is still most of a key: never echoed.
		fail "PROVIDER_KEY (not shown: hex, but not 0x and 64 hex digits) is not a readable file"
	else
		fail "PROVIDER_KEY '$provider_key' is not a readable file"
	fi
	if [[ -n "$key_file" && -s "$key_file" ]]; then
		first="$(head -c 1 "$key_file")"
		if [[ "$first" == "{" ]]; then
			key_format="keystore"
			password_file="${PROVIDER_KEY_PASSWORD_FILE:-}"
			[[ -n "$password_file" && -r "$password_file" ]] || fail "PROVIDER_KEY is a keystore: set PROVIDER_KEY_PASSWORD_FILE to the readable password file"
		elif ! tr -d '[:space:]' <"$key_file" | grep -Eq '^(0x)?[0-9a-fA-F]{64}$'; then
			fail "PROVIDER_KEY file is neither a 32-byte hex private key nor a keystore JSON"
		fi
	elif [[ -n "$key_file" ]]; then
		fail "PROVIDER_KEY is empty"
	fi
fi
provider_key=""

# Tool-call parser: the reviewed profile of the exact model family
# (deploy/tool-profile.sh, shared with setup.sh).
tool_family="" tool_parser="" reasoning_parser=""
if [[ -n "${MODEL_ID:-}" ]]; then
	tool_profile_resolve
	if [[ -n "$tool_source" && "$TOOL_PROFILE" == auto && -n "$tool_parser" && "$tool_parser" != "$saved_parser" ]]; then
		echo "install.sh: note: setup.sh resolved parser '$saved_parser'; the registry now says '$tool_parser' (used)" >&2
	fi
fi

if [[ -n "${MARKET_URL:-}" && -z "${SERVING_URL:-}" ]]; then
	echo "install.sh: warning: MARKET_URL without SERVING_URL: quotes will name the in-cluster proxy URL; set SERVING_URL to the public URL clients use" >&2
fi

if ((${#errors[@]})); then
	echo "install.sh: invalid input:" >&2
	printf '  - %s\n' "${errors[@]}" >&2
	exit 2
fi

if ((!dry_run)); then
	for tool in kubectl helm; do
		command -v "$tool" >/dev/null || { echo "install.sh: $tool not found on PATH" >&2; exit 2; }
	done
fi

# run prints each command; it executes it unless --dry-run.
run() {
	printf '+'
	printf ' %q' "$@"
	printf '\n'
	((dry_run)) || "$@"
}
# apply_secret NAME KEY=FILE...: kubectl renders the Secret from files and
# `kubectl apply` reads it on stdin, so the content is never an argument.
apply_secret() {
	local name="$1"
	shift
	local from=()
	for kv in "$@"; do from+=("--from-file=$kv"); done
	printf '+ kubectl create secret generic %q -n %q' "$name" "$namespace"
	printf ' %q' "${from[@]}"
	printf ' --dry-run=client -o yaml | kubectl apply -n %q -f -\n' "$namespace"
	((dry_run)) || kubectl create secret generic "$name" -n "$namespace" "${from[@]}" --dry-run=client -o yaml |
		kubectl apply -n "$namespace" -f -
}

echo "install.sh: release $release in namespace $namespace (env $env_name), $ENGINE, block size $BLOCK_SIZE, $MODE mode"
echo "install.sh: tool family '${tool_family}', parser '${tool_parser}'${reasoning_parser:+, reasoning parser '$reasoning_parser'}$tool_source"
if [[ "$SKIP_CALIBRATION" == 1 ]]; then
	echo "install.sh: objectives p95 TTFT $SLO_TTFT_P95, p95 ITL $SLO_ITL_P95; calibration skipped (SKIP_CALIBRATION=1)"
else
	echo "install.sh: objectives p95 TTFT $SLO_TTFT_P95, p95 ITL $SLO_ITL_P95; the chart's hook Job calibrates the quoter after the rollout"
fi

# 1. Namespace.
printf '+ kubectl create namespace %q --dry-run=client -o yaml | kubectl apply -f -\n' "$namespace"
((dry_run)) || kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f -

# 2. The pinned CRDs: the InferencePool, and the InferenceObjective and
# InferenceModelRewrite the EPP reads its model rules from. For each, auto:
# install it when absent, upgrade it when this installer put it there, and
# keep one installed by someone else (a Gateway vendor's or llm-d's upstream
# bundle); always: replace whatever is there.
crd_flags=(--server-side --field-manager=omnious-provider-node)
[[ "$INSTALL_CRDS" == always ]] && crd_flags+=(--force-conflicts)
for entry in "${crds[@]}"; do
	read -r crd_file crd_name crd_bundle crd_version <<<"$entry"
	install_crd=1
	case "$INSTALL_CRDS" in
	never) install_crd=0 ;;
	auto)
		if ((!dry_run)) && kubectl get crd "$crd_name" >/dev/null 2>&1; then
			ours="$(kubectl get crd "$crd_name" -o jsonpath='{.metadata.annotations.omnious\.io/crd-revision}')"
			if [[ -z "$ours" ]]; then
				have="$(kubectl get crd "$crd_name" -o jsonpath="{.metadata.annotations.$crd_bundle}")"
				echo "install.sh: keeping the cluster's own $crd_name CRD (bundle ${have:-unknown}; pinned here: $crd_version; INSTALL_CRDS=always replaces it)"
				install_crd=0
			fi
		fi
		;;
	esac
	if ((install_crd)); then
		run kubectl apply "${crd_flags[@]}" -f "$here/crds/$crd_file"
		run kubectl wait --for=condition=Established --timeout=60s "crd/$crd_name"
	fi
done

# 3. Secrets (content from files, via stdin).
key_secret="$release-quoter-key"
if [[ "$key_format" == keystore ]]; then
	apply_secret "$key_secret" "keystore.json=$key_file" "password=$password_file"
else
	apply_secret "$key_secret" "key=$key_file"
fi
hf_secret=""
if [[ -n "$hf_token" ]]; then
	hf_secret="$release-hf-token"
	(umask 077 && printf '%s' "$hf_token" >"$tmp/HF_TOKEN")
	apply_secret "$hf_secret" "HF_TOKEN=$tmp/HF_TOKEN"
fi
# The EPP admin port's bearer token and the calibration token
# (docs/security.md): random, created once and kept across upgrades (the
# running Pods read them at start), from files, never arguments.
admin_secret="$release-epp-admin" calibration_secret="$release-calibration"
for s in "$admin_secret" "$calibration_secret"; do
	if ((dry_run)) || ! kubectl get secret "$s" -n "$namespace" >/dev/null 2>&1; then
		(umask 077 && head -c 512 /dev/urandom | LC_ALL=C tr -dc 'a-zA-Z0-9' >"$tmp/$s.token")
		apply_secret "$s" "token=$tmp/$s.token"
	fi
done

# 4. Helm values: names and settings only, never secret material.
values="$tmp/values.yaml"
yamlstr() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }
{
	echo "engine: $(yamlstr "$ENGINE")"
	echo "blockSize: $BLOCK_SIZE"
	echo "mode: $(yamlstr "$MODE")"
	echo "servingURL: $(yamlstr "${SERVING_URL:-}")"
	echo "model: {id: $(yamlstr "$MODEL_ID"), class: $(yamlstr "$MODEL_CLASS")}"
	echo "toolParser: {name: $(yamlstr "$tool_parser"), reasoning: $(yamlstr "$reasoning_parser"), family: $(yamlstr "$tool_family")}"
	echo "hfToken: {existingSecret: $(yamlstr "$hf_secret")}"
	echo "inferencePool: {failureMode: $(yamlstr "$FAILURE_MODE")}"
	echo "gateway: {name: $(yamlstr "${GATEWAY_NAME:-}"), namespace: $(yamlstr "${GATEWAY_NAMESPACE:-}")}"
	echo "epp: {admin: {token: {existingSecret: $(yamlstr "$admin_secret")}}}"
	echo "quoter:"
	echo "  existingSecret: $(yamlstr "$key_secret")"
	echo "  keyFormat: $key_format"
	echo "  providerId: $(yamlstr "$PROVIDER_ID")"
	echo "  floorIn: $(yamlstr "$FLOOR_IN")"
	echo "  floorOut: $(yamlstr "$FLOOR_OUT")"
	echo "  marketUrl: $(yamlstr "${MARKET_URL:-}")"
	echo "  slo: {ttftP95: $(yamlstr "$SLO_TTFT_P95"), itlP95: $(yamlstr "$SLO_ITL_P95")}"
	echo "  calibration: {enabled: $([[ "$SKIP_CALIBRATION" == 1 ]] && echo false || echo true), tokenSecret: $(yamlstr "$calibration_secret")}"
	echo "autoscaling: {keda: {enabled: $([[ "${KEDA:-0}" == 1 ]] && echo true || echo false)}}"
	m=$([[ "${MONITORING:-0}" == 1 ]] && echo true || echo false)
	echo "monitoring: {serviceMonitor: {enabled: $m}, prometheusRule: {enabled: $m}}"
} >"$values"
if ((dry_run)); then
	echo "# values ($values):"
	sed 's/^/#   /' "$values"
fi

helm_args=(upgrade --install "$release" "$chart" --namespace "$namespace" -f "$values")
[[ -n "$extra_values" ]] && helm_args+=(-f "$extra_values")
helm_args+=(--wait --timeout "${HELM_TIMEOUT:-45m}")
run helm "${helm_args[@]}"

# 5. Full conformance through the serving URL.
if ((!skip_test)); then
	run helm test "$release" --namespace "$namespace" --logs --timeout "${TEST_TIMEOUT:-15m}"
fi

if ((dry_run)); then
	echo "install.sh: dry run: nothing was changed"
else
	echo "install.sh: $release is installed and passed conformance"
fi
