#!/usr/bin/env bash
# Offline checks of everything under deploy/ (make test runs this):
#   - helm lint + helm template for every value combination that matters,
#     with assertions on the rendered objects, and renders that must fail;
#   - kubeconform -strict against local schemas only (generated from the
#     vendored InferencePool and model rule CRDs, the KEDA / Prometheus Operator / Gateway API
#     CRDs and the Kubernetes OpenAPI document in the Go module cache);
#   - promtool check rules / test rules, and the rendered KEDA queries;
#   - the Go test in deploy/ (PromQL parses; metric names in metrics.txt;
#     dashboard JSON: datasource variable, unique panel ids; the EPP as the
#     chart and the systemd unit start it sends one destination, as Envoy's
#     ORIGINAL_DST cluster needs);
#   - envoy --mode validate on every shipped Envoy config (deploy/envoy/ and
#     the chart's rendered ConfigMap), with the pinned Envoy;
#   - systemd unit syntax (when systemd-analyze exists);
#   - install.sh --dry-run with good and bad inputs;
#   - the runbook's own commands, as written, in a copy of the tree named
#     provider-node: the install (dry run and stub cluster) and both
#     ./setup.sh forms.
# Tools: deploy/tools.sh. Nothing here needs a cluster or the network.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
chart="$here/helm/provider-node"
ci="$here/helm/ci"
gobin="$(go env GOBIN)"
[[ -n "$gobin" ]] || gobin="$(go env GOPATH)/bin"
export PATH="$gobin:$PATH"
modcache="$(go env GOMODCACHE)"

for tool in helm kubeconform promtool; do
	command -v "$tool" >/dev/null || { echo "check: $tool not found; run deploy/tools.sh" >&2; exit 1; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/deploy-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
failures=0
pass() { printf '  ok   %s\n' "$1"; }
bad() { printf '  FAIL %s\n' "$1" >&2; failures=$((failures + 1)); }
section() { printf '%s\n' "== $1"; }

# ---------------------------------------------------------------- schemas
section "schemas"
k8s="$modcache/k8s.io/kubernetes@v1.37.2/api/openapi-spec/swagger.json"
keda="$modcache/github.com/kedacore/keda/v2@v2.21.0/config/crd/bases/keda.sh_scaledobjects.yaml"
promop="$modcache/github.com/prometheus-operator/prometheus-operator@v0.85.0/example/prometheus-operator-crd-full"
gwapi="$modcache/sigs.k8s.io/gateway-api@v1.6.3/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"
for f in "$k8s" "$keda" "$promop/monitoring.coreos.com_servicemonitors.yaml" "$gwapi"; do
	[[ -r "$f" ]] || { echo "check: $f missing; run deploy/tools.sh" >&2; exit 1; }
done
schemas="$work/schemas"
(cd "$root" && GOFLAGS=-mod=mod go run ./deploy/schemagen -out "$schemas" -swagger "$k8s" \
	-kinds apps/v1/Deployment,v1/Service,v1/ServiceAccount,v1/ConfigMap,v1/Pod,batch/v1/CronJob,batch/v1/Job,rbac.authorization.k8s.io/v1/Role,rbac.authorization.k8s.io/v1/RoleBinding,networking.k8s.io/v1/NetworkPolicy,policy/v1/PodDisruptionBudget \
	-crd "$here/crds/inference.networking.k8s.io_inferencepools.yaml" -crd "$keda" \
	-crd "$here/crds/llm-d.ai_inferenceobjectives.yaml" -crd "$here/crds/llm-d.ai_inferencemodelrewrites.yaml" \
	-crd "$promop/monitoring.coreos.com_servicemonitors.yaml" -crd "$promop/monitoring.coreos.com_prometheusrules.yaml" \
	-crd "$gwapi") >"$work/schemas.txt"
pass "$(wc -l <"$work/schemas.txt") schemas generated"

kubeconform_check() { # FILE LABEL
	if kubeconform -strict -summary -output text \
		-schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$1" >"$work/kc.out" 2>&1; then
		pass "kubeconform -strict $2 ($(tail -1 "$work/kc.out"))"
	else
		bad "kubeconform -strict $2"
		sed 's/^/       /' "$work/kc.out" >&2
	fi
}

# The kubeconform schemas must reject what the API server would: a typo'd
# field and a wrong enum in the InferencePool, an unknown Deployment field.
cat >"$work/invalid.yaml" <<'EOF'
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  selector: {matchLabels: {app: x}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}, failureMode: FailSometimes}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  replica: 1
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec: {containers: [{name: c, image: x}]}
EOF
if kubeconform -strict -summary -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$work/invalid.yaml" >"$work/kc.out" 2>&1; then
	bad "kubeconform accepted invalid objects"
elif grep -q 'FailSometimes\|failureMode' "$work/kc.out" && grep -q 'replica' "$work/kc.out"; then
	pass "kubeconform rejects a bad failureMode and an unknown Deployment field"
else
	bad "kubeconform rejected invalid objects for other reasons"
	sed 's/^/       /' "$work/kc.out" >&2
fi

# ---------------------------------------------------------------- chart
section "helm lint + template"
# go-installed helm reports Kubernetes v1.20 unless told otherwise.
kube=1.33.0
# The combinations: deploy/helm/ci/renders.txt (deploy/clustertest applies
# the same ones to a real API server).
renders="$ci/renders.txt"
render_args() { # NAME: the helm flags of combination NAME
	awk -v n="$1" '!/^#/ && $1 == n { $1 = ""; sub(/^ +/, ""); print; found = 1; exit } END { exit !found }' "$renders"
}
render() { # NAME: renders combination NAME into $work/NAME.yaml
	local name="$1" line args=()
	if ! line="$(render_args "$name")"; then
		bad "render $name: not in $renders"
		return 1
	fi
	read -r -a args <<<"$line"
	if (cd "$here/helm" && helm template pn "$chart" --kube-version "$kube" --namespace omnious-ci -f ci/base.yaml "${args[@]}") >"$work/$name.yaml" 2>"$work/$name.err"; then
		return 0
	fi
	bad "helm template $name: $(cat "$work/$name.err")"
	return 1
}
count() { grep -c "^kind: $2\$" "$work/$1.yaml" || true; }
expect() { # NAME DESCRIPTION CONDITION...
	local name="$1" what="$2"
	shift 2
	if "$@"; then pass "$name: $what"; else bad "$name: $what"; fi
}
has() { grep -qF -- "$2" "$work/$1.yaml"; }
hasnt() { ! grep -qF -- "$2" "$work/$1.yaml"; }
eq() { [[ "$1" == "$2" ]]; }
# docHas NAME KIND OBJECT TEXT: one object of a render contains TEXT (grep
# reads it whole: with -q the early exit would fail the pipe).
docHas() { doc "$1" "$2" "$3" | grep -F -- "$4" >/dev/null; }
# doc NAME KIND OBJECT prints one object of a render.
doc() {
	awk -v kind="$2" -v obj="$3" 'BEGIN { RS = "\n---\n" } $0 ~ ("\nkind: " kind "\n") && $0 ~ ("\n  name: " obj "\n") { print }' "$work/$1.yaml"
}

# calibration_checks NAME: the quoter gets the objectives and the optional
# calibration ConfigMap; the calibration hook Job drives the quoter's own
# serving URL as its own ServiceAccount, mounts no Secret but the admin
# token and the calibration token (never the signing key), and its Role
# creates ConfigMaps and reads or changes only the calibration's.
calibration_checks() {
	local name="$1" url
	url="$(doc "$name" Deployment pn-provider-node-quoter | sed -n 's/^ *- --serving-url=//p')"
	expect "$name" "quoter env SLO_TTFT_P95=2s SLO_ITL_P95=50ms QUOTER_CALIBRATION_FILE, calibration ConfigMap optional" \
		eval 'doc "$name" Deployment pn-provider-node-quoter | grep -A1 "name: SLO_TTFT_P95" | grep -q "value: \"2s\"" && doc "$name" Deployment pn-provider-node-quoter | grep -A1 "name: SLO_ITL_P95" | grep -q "value: \"50ms\"" && docHas "$name" Deployment pn-provider-node-quoter "value: /etc/omnious-quoter/calibration/calibration.json" && doc "$name" Deployment pn-provider-node-quoter | grep -A2 "name: pn-provider-node-calibration" | grep -q "optional: true"'
	expect "$name" "calibration hook Job: post-install/upgrade, the quoter's serving URL, own ServiceAccount, only the admin and calibration tokens" \
		eval '[[ -n "$url" ]] && docHas "$name" Job pn-provider-node-calibrate "helm.sh/hook: post-install,post-upgrade" && docHas "$name" Job pn-provider-node-calibrate "helm.sh/hook-delete-policy: before-hook-creation" && docHas "$name" Job pn-provider-node-calibrate "- --url=$url" && docHas "$name" Job pn-provider-node-calibrate "- --configmap=pn-provider-node-calibration" && docHas "$name" Job pn-provider-node-calibrate "- --slo-ttft-p95=2s" && docHas "$name" Job pn-provider-node-calibrate "serviceAccountName: pn-provider-node-calibration" && [[ "$(doc "$name" Job pn-provider-node-calibrate | grep "secretName:" | tr -d " " | sort | tr "\n" " ")" == "secretName:pn-calibration secretName:pn-epp-admin " ]] && ! doc "$name" Job pn-provider-node-calibrate | grep -q "pn-quoter-key"'
	expect "$name" "calibration Role: create configmaps; get and update only on the calibration ConfigMap" \
		eval '[[ "$(doc "$name" Role pn-provider-node-calibration | sed -n "/^rules:/,\$p" | tr -d " \n")" == "rules:-apiGroups:[\"\"]resources:[\"configmaps\"]verbs:[\"create\"]-apiGroups:[\"\"]resources:[\"configmaps\"]resourceNames:[\"pn-provider-node-calibration\"]verbs:[\"get\",\"update\"]" ]]'
}

if helm lint --strict --kube-version "$kube" "$chart" -f "$ci/base.yaml" >"$work/lint.out" 2>&1; then pass "helm lint --strict (base)"; else bad "helm lint --strict"; cat "$work/lint.out" >&2; fi

for engine in vllm sglang; do
	for mode in standalone gateway; do
		for keda in off on; do
			for mon in off on; do
				name="$engine-$mode-keda_$keda-mon_$mon"
				# helm lint has no --api-versions: the guarded objects are linted
				# through the forced-monitoring render below.
				read -r -a args <<<"$(render_args "$name" | sed 's/--api-versions [^ ]*//g')"
				if ! (cd "$here/helm" && helm lint --strict --kube-version "$kube" "$chart" -f ci/base.yaml "${args[@]}") >"$work/lint.out" 2>&1; then
					bad "helm lint $name"
					sed 's/^/       /' "$work/lint.out" >&2
				fi
				render "$name" || continue
				kubeconform_check "$work/$name.yaml" "$name"
				block=16
				[[ $engine == sglang ]] && block=32
				expect "$name" "InferencePool v1 with endpointPickerRef" has "$name" "apiVersion: inference.networking.k8s.io/v1"
				expect "$name" "EPP Role reads the model rule CRDs" \
					eval 'doc "$name" Role pn-provider-node-epp | grep -A1 "apiGroups: \[\"llm-d.ai\"\]" | grep -q "resources: \[\"inferenceobjectives\", \"inferencemodelrewrites\"\]"'
				expect "$name" "EPP --block-size=$block" has "$name" "--block-size=$block"
				if [[ $engine == vllm ]]; then
					expect "$name" "vLLM --block-size and EPP --block-size from blockSize, KV events, tool parser, defaults" \
						eval '[[ $(grep -c -- "--block-size=$block" "$work/$name.yaml") == 2 ]] && has "$name" "\"enable_kv_cache_events\":true" && has "$name" "--tool-call-parser=hermes" && has "$name" "--enable-auto-tool-choice" && has "$name" "--max-num-batched-tokens=8192" && has "$name" "--gpu-memory-utilization=0.9" && has "$name" "--enable-prefix-caching" && has "$name" "--enable-chunked-prefill" && has "$name" "\"replay_endpoint\":\"tcp://*:5558\""'
				else
					expect "$name" "SGLang --page-size and EPP --block-size from blockSize, KV events, tool parser, options" \
						eval 'has "$name" "--page-size=$block" && [[ $(grep -c -- "--block-size=$block" "$work/$name.yaml") == 1 ]] && has "$name" "--kv-events-config={\"buffer_steps\"" && has "$name" "--tool-call-parser=qwen25" && hasnt "$name" "--enable-auto-tool-choice" && has "$name" "--chunked-prefill-size=-1" && has "$name" "--disable-radix-cache" && has "$name" "--mem-fraction-static=0.9" && has "$name" "--enable-metrics"'
				fi
				expect "$name" "KV topic names the Pod's own address" has "$name" '"topic":"kv@$(POD_IP):8000@Qwen/Qwen3-32B"'
				if [[ $mode == standalone ]]; then
					expect "$name" "Envoy sidecar, proxy Service, no HTTPRoute" \
						eval 'has "$name" "name: envoy" && has "$name" "name: pn-provider-node-proxy" && eq "$(count "$name" HTTPRoute)" 0 && has "$name" "failure_mode_allow: false"'
				else
					expect "$name" "HTTPRoute to the pool, no Envoy, FailOpen" \
						eval 'eq "$(count "$name" HTTPRoute)" 1 && hasnt "$name" "name: envoy" && has "$name" "failureMode: FailOpen" && has "$name" "kind: InferencePool"'
				fi
				want=0
				[[ $keda == on ]] && want=1
				expect "$name" "$want ScaledObject" eq "$(count "$name" ScaledObject)" "$want"
				if [[ $keda == on ]]; then
					expect "$name" "engine replica count left to KEDA" eval '! doc "$name" Deployment pn-provider-node-engine | grep -q "^  replicas:"'
				else
					expect "$name" "engine replica count set" eval 'doc "$name" Deployment pn-provider-node-engine | grep -q "^  replicas: 1$"'
				fi
				want=0
				[[ $mon == on ]] && want=1
				expect "$name" "$want ServiceMonitor and PrometheusRule" eval 'eq "$(count "$name" ServiceMonitor)" "$want" && eq "$(count "$name" PrometheusRule)" "$want"'
				expect "$name" "quoter key from the Secret, read-only, 0400; canary and test run conformance" \
					eval 'has "$name" "secretName: pn-quoter-key" && has "$name" "defaultMode: 0400" && has "$name" "--key-file=/var/run/secrets/omnious/key" && has "$name" "- --quick" && has "$name" "helm.sh/hook: test" && eq "$(count "$name" CronJob)" 1'
				calibration_checks "$name"
			done
		done
	done
done

# Guards: the optional APIs render only where the cluster serves them.
render keda-no-api &&
	expect keda-no-api "no ScaledObject/ServiceMonitor/PrometheusRule without the APIs" \
		eval 'eq "$(count keda-no-api ScaledObject)" 0 && eq "$(count keda-no-api ServiceMonitor)" 0 && eq "$(count keda-no-api PrometheusRule)" 0'
render mon-forced &&
	expect mon-forced "monitoring.force renders the monitoring objects" eval 'eq "$(count mon-forced ServiceMonitor)" 1 && eq "$(count mon-forced PrometheusRule)" 1'
render keystore && {
	kubeconform_check "$work/keystore.yaml" keystore
	expect keystore "keystore + password files, EPP --config, PVCs" \
		eval 'has keystore "--keystore-file=/var/run/secrets/omnious/keystore.json" && has keystore "--password-file=/var/run/secrets/omnious/password" && has keystore "--config=/etc/epp/config.yaml" && has keystore "claimName: pn-quoter-state" && has keystore "claimName: pn-models"'
}
render bs64 &&
	expect bs64 "one blockSize feeds engine and EPP" eval '[[ $(grep -c -- "--block-size=64" "$work/bs64.yaml") == 2 ]] && hasnt bs64 "block-size=16"'
render bs64s &&
	expect bs64s "one blockSize feeds SGLang page size and EPP" eval 'has bs64s "--page-size=64" && has bs64s "--block-size=64"'
render netpol && {
	kubeconform_check "$work/netpol.yaml" netpol
	expect netpol "3 NetworkPolicies; KV ports only from the EPP, admin only from the quoter and the EPP's siblings" \
		eval 'eq "$(count netpol NetworkPolicy)" 3 && doc netpol NetworkPolicy pn-provider-node-engine | grep -A8 "port: kv-events" | grep -q "app.kubernetes.io/component: epp" && doc netpol NetworkPolicy pn-provider-node-epp | grep -A8 "port: admin" | grep -q "app.kubernetes.io/component: quoter" && doc netpol NetworkPolicy pn-provider-node-epp | grep -A14 "port: admin" | grep -q "app.kubernetes.io/component: epp"'
	expect netpol "the calibration Job reaches the serving ports and the EPP admin port" \
		eval 'doc netpol NetworkPolicy pn-provider-node-epp | grep -q "values: \[quoter, canary, test, calibration\]" && doc netpol NetworkPolicy pn-provider-node-epp | sed -n "/port: admin/,/port: metrics/p" | grep -q "app.kubernetes.io/component: calibration"'
}
render peers &&
	expect peers "headless Service of the EPPs' admin port, named by the EPP's --peer-service" \
		eval 'doc peers Service pn-provider-node-epp-peers | grep -q "clusterIP: None" && doc peers Service pn-provider-node-epp-peers | grep -q "name: admin" && has peers "--peer-service=pn-provider-node-epp-peers.omnious-ci.svc:9091"'
render gw-netpol && kubeconform_check "$work/gw-netpol.yaml" gw-netpol
# EPPs run active-active: the default two get a PDB, a preferred spread
# over nodes and a surge-only rollout; one EPP gets neither PDB nor spread.
render epp2 && {
	kubeconform_check "$work/epp2.yaml" epp2
	expect epp2 "2 EPP replicas, PDB minAvailable 1, preferred anti-affinity, maxUnavailable 0, grace above drain" \
		eval 'docHas epp2 Deployment pn-provider-node-epp "  replicas: 2" && eq "$(count epp2 PodDisruptionBudget)" 1 && docHas epp2 PodDisruptionBudget pn-provider-node-epp "minAvailable: 1" && docHas epp2 Deployment pn-provider-node-epp "preferredDuringSchedulingIgnoredDuringExecution" && docHas epp2 Deployment pn-provider-node-epp "maxUnavailable: 0" && docHas epp2 Deployment pn-provider-node-epp "terminationGracePeriodSeconds: 45"'
}
render epp1 &&
	expect epp1 "one EPP: no PDB, no anti-affinity" \
		eval 'eq "$(count epp1 PodDisruptionBudget)" 0 && ! docHas epp1 Deployment pn-provider-node-epp podAntiAffinity'
# Trust boundaries (docs/security.md): by default the admin port asks for
# the token Secret, which the EPP, quoter and calibration Job mount; the
# EPP takes band and tenant from the gateway only and checks the
# calibration token; mtls, ext_proc TLS and the bind port's policy.
expect vllm-standalone-keda_off-mon_off "admin token: EPP, quoter and calibration Job present it; gateway-only headers; calibration token" \
	eval 'docHas vllm-standalone-keda_off-mon_off Deployment pn-provider-node-epp "- --admin-token-file=/etc/omnious-admin/token" && docHas vllm-standalone-keda_off-mon_off Deployment pn-provider-node-epp "- --gateway-headers" && docHas vllm-standalone-keda_off-mon_off Deployment pn-provider-node-epp "- --calibration-token-file=/etc/omnious-calibration/token" && docHas vllm-standalone-keda_off-mon_off Deployment pn-provider-node-quoter "- --capacity-token-file=/etc/omnious-admin/token" && docHas vllm-standalone-keda_off-mon_off Job pn-provider-node-calibrate "- --capacity-token-file=/etc/omnious-admin/token" && docHas vllm-standalone-keda_off-mon_off Job pn-provider-node-calibrate "- --calibration-token-file=/etc/omnious-calibration/token" && docHas vllm-standalone-keda_off-mon_off Deployment pn-provider-node-epp "secretName: pn-epp-admin"'
render trust &&
	expect trust "mtls admin port (https, certificates from the Secret), ext_proc TLS in Envoy, bind port open to engines only" \
		eval 'docHas trust Deployment pn-provider-node-epp "- --admin-client-ca-file=/etc/omnious-admin/ca.crt" && docHas trust Deployment pn-provider-node-epp "- --admin-server-name=pn-provider-node-epp-admin" && docHas trust Deployment pn-provider-node-quoter "- --capacity-url=https://pn-provider-node-epp.omnious-ci.svc:9091" && docHas trust Deployment pn-provider-node-quoter "- --capacity-cert-file=/etc/omnious-admin/tls.crt" && docHas trust Deployment pn-provider-node-epp "- --tls-cert-file=/etc/omnious-extproc/tls.crt" && docHas trust ConfigMap pn-provider-node-envoy "UpstreamTlsContext" && docHas trust ConfigMap pn-provider-node-envoy "filename: /etc/omnious-extproc/ca.crt" && doc trust NetworkPolicy pn-provider-node-epp | grep -A6 "port: 5557" | grep -q "app.kubernetes.io/component: engine" && ! docHas trust Deployment pn-provider-node-epp "- --admin-token-file"'
render auth-none &&
	expect auth-none "auth none: said explicitly, no token mounted, headers read as they arrive" \
		eval 'docHas auth-none Deployment pn-provider-node-epp "- --admin-unauthenticated" && ! has auth-none "admin-credentials" && ! docHas auth-none Deployment pn-provider-node-epp "- --gateway-headers"'
render nokv &&
	expect nokv "KV events off" eval 'hasnt nokv "kv-events-config" && hasnt nokv "name: kv-events"'
render nocal &&
	expect nocal "calibration off: no Job, no calibration identity, no calibration file" \
		eval 'eq "$(count nocal Job)" 0 && ! awk '"'"'BEGIN { RS = "\n---\n" } !/\n  name: pn-provider-node-envoy\n/'"'"' "$work/nocal.yaml" | grep -q calibration && has nocal "name: SLO_TTFT_P95"'
render slo &&
	expect slo "SLO values reach the quoter and the calibration Job" \
		eval 'doc slo Deployment pn-provider-node-quoter | grep -A1 "name: SLO_TTFT_P95" | grep -q "value: \"1500ms\"" && doc slo Deployment pn-provider-node-quoter | grep -A1 "name: SLO_ITL_P95" | grep -q "value: \"40ms\"" && docHas slo Job pn-provider-node-calibrate "- --slo-ttft-p95=1500ms" && docHas slo Job pn-provider-node-calibrate "- --slo-itl-p95=40ms" && docHas slo Job pn-provider-node-calibrate "- \"--prompt-tokens=2048\""'

# Key material never reaches a manifest: the chart references Secrets by
# name and never renders one.
if cat "$work"/*.yaml | grep -q '^kind: Secret$'; then bad "a render contains a Secret"; else pass "no Secret rendered (keys stay out of Helm)"; fi

# Images are named in values.yaml only: no template names one, so the
# engine, Envoy and project image versions have one place.
if grep -rnE '^[[:space:]]*(- )?image:' "$chart/templates" | grep -v '{{' >"$work/images.out"; then
	bad "a template names an image instead of taking it from values.yaml"
	sed 's/^/       /' "$work/images.out" >&2
else
	pass "every image comes from values.yaml"
fi
expect vllm-standalone-keda_off-mon_off "the EPP, quoter, calibration, canary and test run the image make image builds" \
	eval '[[ "$(grep -E "^ +image: " "$work/vllm-standalone-keda_off-mon_off.yaml" | grep -c "ghcr.io/omnious/provider-node:$(sed -n "s/^appVersion: \"*\([^\"]*\)\"*$/\1/p" "$chart/Chart.yaml")\$")" == 5 ]]'

section "renders that must fail"
must_fail() { # DESCRIPTION EXPECTED-MESSAGE helm-args...
	local what="$1" msg="$2"
	shift 2
	if helm template pn "$chart" --kube-version "$kube" "$@" >/dev/null 2>"$work/fail.err"; then
		bad "$what: rendered"
	elif grep -qF -- "$msg" "$work/fail.err"; then
		pass "$what"
	else
		bad "$what: wrong error: $(cat "$work/fail.err")"
	fi
}
must_fail "no quoter.existingSecret" "quoter.existingSecret is required" -f "$ci/base.yaml" --set quoter.existingSecret=
must_fail "no model.id" "model.id is required" -f "$ci/base.yaml" --set model.id=
must_fail "gateway mode without gateway.name" "gateway.name is required" -f "$ci/base.yaml" -f "$ci/gateway.yaml" --set gateway.name=
must_fail "gateway mode without servingURL" "servingURL is required in gateway mode" -f "$ci/base.yaml" -f "$ci/gateway.yaml" --set servingURL=
must_fail "unknown engine" "engine must be vllm or sglang" -f "$ci/base.yaml" --set engine=tgi
must_fail "blockSize out of range" "blockSize must be between 1 and 128" -f "$ci/base.yaml" --set blockSize=0
must_fail "bad failureMode" "inferencePool.failureMode must be FailOpen or FailClose" -f "$ci/base.yaml" --set inferencePool.failureMode=Open
must_fail "bad admin auth" "at '/epp/admin/auth'" -f "$ci/base.yaml" --set epp.admin.auth=basic
must_fail "admin token without its Secret" "epp.admin.token.existingSecret is required" -f "$ci/base.yaml" --set epp.admin.token.existingSecret=
must_fail "mtls without its Secret" "epp.admin.mtls.existingSecret is required" -f "$ci/base.yaml" --set epp.admin.auth=mtls
must_fail "calibration without its token" "quoter.calibration.tokenSecret is required" -f "$ci/base.yaml" --set quoter.calibration.tokenSecret=
must_fail "ext_proc TLS without its Secret" "epp.extprocTLS.existingSecret is required" -f "$ci/base.yaml" --set epp.extprocTLS.enabled=true
must_fail "bad keyFormat" "quoter.keyFormat must be file or keystore" -f "$ci/base.yaml" --set quoter.keyFormat=pem
must_fail "SLO not a duration" "quoter.slo.itlP95 must be a Go duration such as 2s or 50ms" -f "$ci/base.yaml" --set quoter.slo.itlP95=50
must_fail "SLO of zero" "quoter.slo.ttftP95 must be above zero" -f "$ci/base.yaml" --set quoter.slo.ttftP95=0s
must_fail "SLO with a space" "quoter.slo.ttftP95 must be a Go duration" -f "$ci/base.yaml" --set-string "quoter.slo.ttftP95=2 s"
must_fail "negative quoter.refresh" "at '/quoter/refresh': '-5s' does not match pattern" -f "$ci/base.yaml" --set quoter.refresh=-5s
must_fail "negative server.replicas" "at '/server/replicas': minimum: got -1, want 0" -f "$ci/base.yaml" --set server.replicas=-1
must_fail "negative blockSize" "at '/blockSize': minimum: got -1, want 0" -f "$ci/base.yaml" --set blockSize=-1
must_fail "negative SLO" "at '/quoter/slo/ttftP95': 'not' failed" -f "$ci/base.yaml" --set quoter.slo.ttftP95=-1s
if helm template pn "$chart" --kube-version "$kube" -f "$ci/base.yaml" --set quoter.enabled=false --set quoter.existingSecret= >/dev/null 2>&1; then
	pass "quoter.enabled=false needs no key Secret"
else
	bad "quoter.enabled=false still needs the key Secret"
fi

# ---------------------------------------------------------------- Envoy
section "standalone Envoy = deploy/envoy/envoy.yaml"
if cmp -s "$here/envoy/envoy.yaml" "$chart/files/envoy.yaml"; then pass "chart carries deploy/envoy/envoy.yaml"; else bad "copy deploy/envoy/envoy.yaml to helm/provider-node/files/envoy.yaml"; fi
# With default values the sidecar's configuration is the bare-metal file.
awk '/^  envoy.yaml: \|$/ { on = 1; next } on && /^    / { print substr($0, 5); next } on && /^$/ { print; next } on { exit }' \
	<(helm template pn "$chart" --kube-version "$kube" -f "$ci/base.yaml" -s templates/envoy-configmap.yaml) >"$work/envoy.rendered"
if diff -u "$here/envoy/envoy.yaml" "$work/envoy.rendered" >"$work/envoy.diff"; then
	pass "rendered sidecar config is identical to deploy/envoy/envoy.yaml"
else
	bad "rendered sidecar config differs from deploy/envoy/envoy.yaml"
	head -20 "$work/envoy.diff" >&2
fi
render envoy-open &&
	expect envoy-open "FailOpen sets failure_mode_allow; listener port from values" eval 'has envoy-open "failure_mode_allow: true" && has envoy-open "address: 0.0.0.0, port_value: 8181 }" && has envoy-open "containerPort: 8181"'
# renders.txt holds what check.sh renders, no more.
for name in $(awk '!/^#/ && NF { print $1 }' "$renders"); do
	[[ -f "$work/$name.yaml" ]] || bad "renders.txt: $name is never rendered here"
done
# Envoy itself loads every config the project ships: the bare-metal files
# and the chart's rendered ConfigMap (default values and FailOpen). The
# binary: $ENVOY, else the pinned one (scripts/pyenv.sh envoy).
envoy_bin="${ENVOY:-}"
if [[ -z "$envoy_bin" ]]; then
	for f in "$root"/.cache/py/envoy/lib/python3*/site-packages/envoy/_bin/envoy; do if [[ -x "$f" ]]; then envoy_bin="$f"; fi; done
fi
if [[ -z "$envoy_bin" || ! -x "$envoy_bin" ]]; then
	bad "envoy --mode validate: no envoy binary (ENVOY='${ENVOY:-}'); run scripts/pyenv.sh envoy"
	if [[ -f "$root/.cache/py/envoy.err" ]]; then sed 's/^/       /' "$root/.cache/py/envoy.err" >&2; fi
else
	awk '/^  envoy.yaml: \|$/ { on = 1; next } on && /^    / { print substr($0, 5); next } on && /^$/ { print; next } on { exit }' \
		"$work/envoy-open.yaml" >"$work/chart-envoy-FailOpen.yaml"
	# Envoy reads a file as YAML by its extension.
	cp "$work/envoy.rendered" "$work/chart-envoy-default.yaml"
	for f in "$here"/envoy/*.yaml "$work/chart-envoy-default.yaml" "$work/chart-envoy-FailOpen.yaml"; do
		label="${f#"$root"/}"
		[[ "$f" == "$work"/* ]] && label="the chart's ConfigMap ($(basename "$f" .yaml | sed 's/^chart-envoy-//'))"
		if [[ ! -s "$f" ]]; then
			bad "envoy --mode validate $label: empty"
		elif "$envoy_bin" --mode validate -c "$f" --use-dynamic-base-id --log-level warn >"$work/validate.out" 2>&1; then
			pass "envoy --mode validate $label ($("$envoy_bin" --version | grep -o '/[0-9.]*/' | tr -d /))"
		else
			bad "envoy --mode validate $label"
			sed 's/^/       /' "$work/validate.out" >&2
		fi
	done
fi

# ---------------------------------------------------------------- PromQL
section "prometheus rules and PromQL"
if promtool check rules "$here/prometheus/rules.yaml" >"$work/p.out" 2>&1; then pass "promtool check rules"; else bad "promtool check rules"; cat "$work/p.out" >&2; fi
if (cd "$here/prometheus" && promtool test rules rules_test.yaml) >"$work/p.out" 2>&1; then pass "promtool test rules"; else bad "promtool test rules"; cat "$work/p.out" >&2; fi
if cmp -s "$here/prometheus/rules.yaml" "$chart/files/prometheus-rules.yaml"; then pass "chart carries the same rules"; else bad "helm/provider-node/files/prometheus-rules.yaml differs from prometheus/rules.yaml"; fi
# The KEDA queries as rendered, parsed by promtool as recording rules.
{
	echo "groups:"
	echo "  - name: keda"
	echo "    rules:"
	i=0
	grep -E '^ +query: ' "$work/vllm-standalone-keda_on-mon_off.yaml" | sed 's/^ *query: //' | while IFS= read -r q; do
		i=$((i + 1))
		printf '      - record: keda:query%d\n        expr: %s\n' "$i" "'${q//\'/\'\'}'"
	done
} >"$work/keda-rules.yaml"
n="$(grep -c 'record:' "$work/keda-rules.yaml" || true)"
if [[ "$n" == 3 ]] && promtool check rules "$work/keda-rules.yaml" >"$work/p.out" 2>&1; then
	pass "promtool parses the $n rendered KEDA queries"
else
	bad "rendered KEDA queries ($n) do not parse"
	cat "$work/p.out" "$work/keda-rules.yaml" >&2
fi
if (cd "$root" && GOFLAGS=-mod=mod go test ./deploy/) >"$work/go.out" 2>&1; then
	pass "go test ./deploy (PromQL parses, names in metrics.txt, dashboard JSON, one destination per request)"
else
	bad "go test ./deploy"
	cat "$work/go.out" >&2
fi

# ---------------------------------------------------------------- systemd
section "systemd units"
if command -v systemd-analyze >/dev/null; then
	for u in "$here"/systemd/*.service; do
		# Binaries are absent here; every other complaint is a unit error.
		out="$(SYSTEMD_LOG_LEVEL=err systemd-analyze verify --man=no "$u" 2>&1 | grep -v 'is not executable: No such file' || true)"
		if [[ -z "$out" ]]; then pass "systemd-analyze verify $(basename "$u")"; else bad "$(basename "$u"): $out"; fi
	done
	for u in omnious-epp omnious-quoter; do
		expect "$u" "DynamicUser and ProtectSystem=strict" eval "grep -qx 'DynamicUser=yes' '$here/systemd/$u.service' && grep -qx 'ProtectSystem=strict' '$here/systemd/$u.service'"
	done
	expect omnious-quoter "key is a LoadCredential" grep -q '^LoadCredential=quoter-key:' "$here/systemd/omnious-quoter.service"
else
	echo "  (systemd-analyze not installed: unit syntax not checked)"
fi

# ---------------------------------------------------------------- install.sh
section "install.sh --dry-run"
umask 077
printf '0x%064x\n' 48879 >"$work/provider.key"
keyhex="$(tr -d '\n' <"$work/provider.key")"
good_env=(PROVIDER_ID=acme-qwen "PROVIDER_KEY=$work/provider.key" MODEL_ID=Qwen/Qwen2.5-72B-Instruct
	MODEL_CLASS=qwen2.5-72b FLOOR_IN=210000 FLOOR_OUT=680000 HF_TOKEN=hf_secret_token_value)
# quoter on PATH resolves tool profiles; without it install.sh uses awk.
nopath="$work/nopath"
mkdir -p "$nopath"
for t in bash awk tr head stat grep sed mktemp chmod rm cat printf dirname id mkdir; do
	p="$(command -v "$t")" && ln -sf "$p" "$nopath/$t"
done
printf '0x%064x\n' 1 >"$work/open.key"
chmod 644 "$work/open.key"
dry_stdin=/dev/null
# isolate: a setup.sh result left in this tree (out/tool-profile.env) is
# not read by the runs here; the runbook's runs below use their copy's own.
isolate=("TOOL_PROFILE_ENV=$work/no-setup.env")
# judge LABEL rc expected-rc pattern OUTPUT: an installer run passes when
# it exits as expected, its output matches pattern, and it printed no
# secret (the test key, the HF token).
judge() {
	local label="$1" rc="$2" rc_want="$3" pattern="$4" out="$5"
	if [[ "$rc" != "$rc_want" ]]; then
		bad "$label: exit $rc, want $rc_want"
		sed 's/^/       /' "$out" >&2
	elif ! grep -qE -- "$pattern" "$out"; then
		bad "$label: output lacks /$pattern/"
		sed 's/^/       /' "$out" >&2
	elif grep -qF -- "${keyhex#0x}" "$out" || grep -qF hf_secret_token_value "$out"; then
		bad "$label: printed secret material"
	else
		pass "$label"
	fi
}
dry() { # LABEL expected-rc pattern env... -- args...
	local label="$1" rc_want="$2" pattern="$3"
	shift 3
	local envs=()
	while (($#)) && [[ "$1" != -- ]]; do envs+=("$1"); shift; done
	shift
	local rc=0
	env -i PATH="$nopath" HOME="$work" "${isolate[@]}" "${envs[@]}" bash "$here/install.sh" --dry-run "$@" <"$dry_stdin" >"$work/dry.out" 2>&1 || rc=$?
	judge "install.sh $label" "$rc" "$rc_want" "$pattern" "$work/dry.out"
}
dry "good input" 0 "^\+ helm test provider-node-mainnet --namespace omnious-mainnet" "${good_env[@]}" --
expect "install.sh" "dry run prints CRD, Secrets via stdin, helm upgrade --install --wait" \
	eval 'grep -q "^+ kubectl apply --server-side .*crds/inference.networking.k8s.io_inferencepools.yaml" "$work/dry.out" && grep -q "^+ kubectl apply --server-side .*crds/llm-d.ai_inferenceobjectives.yaml" "$work/dry.out" && grep -q "^+ kubectl wait .*crd/inferencemodelrewrites.llm-d.ai" "$work/dry.out" && grep -q "^+ kubectl create secret generic provider-node-mainnet-quoter-key .*--from-file=key=.* | kubectl apply" "$work/dry.out" && grep -q "^+ kubectl create secret generic provider-node-mainnet-hf-token" "$work/dry.out" && grep -q "^+ helm upgrade --install provider-node-mainnet .* --wait" "$work/dry.out" && grep -q "toolParser: {name: \"hermes\"" "$work/dry.out" && grep -q "existingSecret: \"provider-node-mainnet-quoter-key\"" "$work/dry.out"'
dry "--env staging" 0 "^\+ helm upgrade --install provider-node-staging .*--namespace omnious-staging" "${good_env[@]}" -- --env staging
dry_stdin="$work/provider.key"
dry "key on stdin (-)" 0 "quoter-key .*--from-file=key=/" "${good_env[@]}" PROVIDER_KEY=- --
dry_stdin=/dev/null
dry "sglang" 0 "toolParser: \{name: \"qwen25\"" "${good_env[@]}" ENGINE=sglang --
dry "custom parser" 0 "toolParser: \{name: \"my_parser\"" "${good_env[@]}" MODEL_ID=acme/new-model TOOL_PROFILE=custom VLLM_TOOL_CALL_PARSER=my_parser --
dry "gateway" 0 "mode: \"gateway\"" "${good_env[@]}" MODE=gateway GATEWAY_NAME=gw SERVING_URL=https://llm.example.com --
dry "missing inputs" 2 "PROVIDER_ID is required" --
dry "SLO defaults" 0 "objectives p95 TTFT 2s, p95 ITL 50ms; the chart.s hook Job calibrates" "${good_env[@]}" --
expect "install.sh" "dry run: SLO defaults 2s / 50ms and calibration on in the Helm values" \
	eval 'grep -q "slo: {ttftP95: \"2s\", itlP95: \"50ms\"}" "$work/dry.out" && grep -q "calibration: {enabled: true, tokenSecret: \"provider-node-mainnet-calibration\"}" "$work/dry.out" && grep -q "epp: {admin: {token: {existingSecret: \"provider-node-mainnet-epp-admin\"}}}" "$work/dry.out"'
dry "SLO values and SKIP_CALIBRATION=1" 0 "calibration skipped \(SKIP_CALIBRATION=1\)" "${good_env[@]}" SLO_TTFT_P95=1m30s SLO_ITL_P95=.5ms SKIP_CALIBRATION=1 --
expect "install.sh" "dry run: SLO values and calibration off in the Helm values" \
	eval 'grep -q "slo: {ttftP95: \"1m30s\", itlP95: \".5ms\"}" "$work/dry.out" && grep -q "calibration: {enabled: false, tokenSecret: " "$work/dry.out"'
dry "SLO not a duration" 2 "SLO_ITL_P95 '50' must be a Go duration" "${good_env[@]}" SLO_ITL_P95=50 --
dry "SLO with a unit Go does not know" 2 "SLO_TTFT_P95 '2sec' must be a Go duration" "${good_env[@]}" SLO_TTFT_P95=2sec --
dry "SLO of zero" 2 "SLO_TTFT_P95 '0s' must be above zero" "${good_env[@]}" SLO_TTFT_P95=0s --
dry "bad SKIP_CALIBRATION" 2 "SKIP_CALIBRATION 'yes' must be 0 or 1" "${good_env[@]}" SKIP_CALIBRATION=yes --
# The runbook's literal form: PROVIDER_KEY=0x... on the command line.
dry "key inline (the runbook's PROVIDER_KEY=0x...)" 0 "note: PROVIDER_KEY holds the key itself;.*keeps it out of your shell history" "${good_env[@]}" "PROVIDER_KEY=$keyhex" --
expect "install.sh" "inline key: the Secret still comes from a private file, via kubectl apply on stdin" \
	eval 'grep -q "^+ kubectl create secret generic provider-node-mainnet-quoter-key .*--from-file=key=.*provider-node-install\..*/key .*| kubectl apply" "$work/dry.out"'
dry "key inline, not hex" 2 "is not a readable file" "${good_env[@]}" "PROVIDER_KEY=0x1234" --
dry "key file too open" 2 "make it owner-only" "${good_env[@]}" "PROVIDER_KEY=$work/open.key" --
dry "unknown family fails closed" 2 "no reviewed tool profile matches MODEL_ID 'acme/new-model' \(fail closed\)" "${good_env[@]}" MODEL_ID=acme/new-model --
dry "family without an SGLang parser" 2 "has no reviewed sglang parser \(fail closed\)" "${good_env[@]}" MODEL_ID=allenai/Olmo-3-7B-Instruct ENGINE=sglang --
dry "custom without parser" 2 "TOOL_PROFILE=custom needs VLLM_TOOL_CALL_PARSER" "${good_env[@]}" TOOL_PROFILE=custom --
dry "bad floor" 2 "FLOOR_IN '2.5' must be a positive integer" "${good_env[@]}" FLOOR_IN=2.5 --
dry "bad engine" 2 "ENGINE 'tgi' must be vllm or sglang" "${good_env[@]}" ENGINE=tgi --
dry "bad block size" 2 "BLOCK_SIZE 24 is not a vLLM CUDA block size" "${good_env[@]}" BLOCK_SIZE=24 --
dry "gateway without name" 2 "MODE=gateway needs GATEWAY_NAME" "${good_env[@]}" MODE=gateway SERVING_URL=https://x.example.com --
dry "bad env name" 2 "--env 'Prod_1' must be a DNS label" "${good_env[@]}" -- --env Prod_1
dry "unknown flag" 2 "unknown argument --force" "${good_env[@]}" -- --force
# A real (not dry) run against stub kubectl/helm that record their arguments
# and stdin: the key and the HF token must reach kubectl only on stdin, and the
# Helm values must name the Secrets without holding them.
stubs="$work/stubs"
mkdir -p "$stubs"
cp -P "$nopath"/* "$stubs"/
p="$(command -v base64)" && ln -sf "$p" "$stubs/base64"
p="$(command -v env)" && ln -sf "$p" "$stubs/env"
cat >"$stubs/kubectl" <<'EOF'
#!/bin/bash
{ printf 'kubectl'; printf ' %q' "$@"; echo; } >>"$STUB_ARGV"
env >>"$STUB_ENV"
case "$*" in
*"create secret generic"*)
	echo "apiVersion: v1"; echo "kind: Secret"; echo "data:"
	for a in "$@"; do
		case "$a" in --from-file=*) f="${a#--from-file=}"; echo "  ${f%%=*}: $(base64 -w0 <"${f#*=}")" ;; esac
	done ;;
*"apply"*"-f -"*) cat >>"$STUB_STDIN" ;;
*"get crd"*) exit 1 ;;
esac
exit 0
EOF
cat >"$stubs/helm" <<'EOF'
#!/bin/bash
{ printf 'helm'; printf ' %q' "$@"; echo; } >>"$STUB_ARGV"
env >>"$STUB_ENV"
prev=""
for a in "$@"; do
	[[ "$prev" == -f ]] && cat "$a" >>"$STUB_VALUES"
	prev="$a"
done
exit 0
EOF
chmod +x "$stubs/kubectl" "$stubs/helm"
# stub_install LABEL env...: a real run against the stubs; the key and the
# HF token reach kubectl only on stdin, never an argv, the environment of a
# program the installer ran, the Helm values or the output. It runs
# stub_cmd in stub_dir, installing release stub_release.
stub_cmd=(bash "$here/install.sh" --env stub) stub_dir="$here" stub_release=provider-node-stub
stub_install() {
	local label="$1"
	shift
	rm -f "$work/argv" "$work/stdin" "$work/values" "$work/env"
	local rc=0
	(cd "$stub_dir" && env -i PATH="$stubs" HOME="$work" STUB_ARGV="$work/argv" STUB_STDIN="$work/stdin" STUB_VALUES="$work/values" STUB_ENV="$work/env" \
		"${isolate[@]}" "$@" "${stub_cmd[@]}") </dev/null >"$work/real.out" 2>&1 || rc=$?
	local keyb64
	keyb64="$(base64 -w0 <"$work/provider.key")"
	if ((rc)); then
		bad "install.sh (stub cluster, $label): exit $rc"
		sed 's/^/       /' "$work/real.out" >&2
	elif grep -qF -- "${keyhex#0x}" "$work/argv" "$work/values" "$work/real.out" "$work/env" ||
		grep -qF hf_secret_token_value "$work/argv" "$work/values" "$work/real.out" ||
		grep -qF -- "$keyb64" "$work/argv" "$work/values" "$work/env"; then
		bad "install.sh (stub cluster, $label): secret material in a command line, an environment, the Helm values or the output"
	elif ! grep -qF -- "$keyb64" "$work/stdin" || ! grep -qF "$(printf hf_secret_token_value | base64 -w0)" "$work/stdin"; then
		bad "install.sh (stub cluster, $label): the Secrets did not reach kubectl apply on stdin"
	elif ! grep -q "^helm upgrade --install $stub_release .* --wait" "$work/argv" || ! grep -q "^helm test $stub_release" "$work/argv" ||
		! grep -q "existingSecret: \"$stub_release-quoter-key\"" "$work/values"; then
		bad "install.sh (stub cluster, $label): helm upgrade --install --wait / helm test / values"
		sed 's/^/       /' "$work/argv" >&2
	else
		pass "install.sh (stub cluster, $label): keys only on kubectl's stdin, Helm gets names, upgrade --wait and test run"
	fi
}
stub_install "key file" "${good_env[@]}"
stub_install "inline key" "${good_env[@]}" "PROVIDER_KEY=$keyhex"

# ---------------------------------------------------------------- runbook
# The runbook's commands exactly as it shows them, in a fresh copy of the
# tree named provider-node (no bin/, no out/): the install from the clone's
# parent (dry run, then against the stub cluster), and both ./setup.sh
# forms inside it, whose result the next install reads. Only placeholders
# are filled in: PROVIDER_KEY=0x... with a key, HF_TOKEN=hf_... with a
# token, <official-parser> with a parser name. The setup.sh runs get the
# install command's variables but the secrets, as an exported environment.
section "the runbook's commands, as written"
parent="$work/runbook"
clone="$parent/provider-node"
mkdir -p "$clone"
tar -C "$root" -cf - README.md install.sh setup.sh config deploy | tar -C "$clone" -xf -
rm -rf "$clone/out" "$clone/bin"
isolate=()
runbook_env=(PROVIDER_ID=acme-qwen "PROVIDER_KEY=$keyhex" MODEL_ID=Qwen/Qwen3-32B MODEL_CLASS=qwen3-32b
	FLOOR_IN=210000 FLOOR_OUT=680000 HF_TOKEN=hf_secret_token_value)
setup_env=(PROVIDER_ID=acme-qwen MODEL_ID=Qwen/Qwen3-32B MODEL_CLASS=qwen3-32b FLOOR_IN=210000 FLOOR_OUT=680000)
for f in install.sh setup.sh config/tool-profiles.tsv config/omnious-model-tool-profiles.json README.md; do
	[[ -e "$clone/$f" ]] || bad "runbook: provider-node/$f does not resolve"
done
expect runbook "config/tool-profiles.tsv and config/omnious-model-tool-profiles.json are deploy/config's" \
	eval 'cmp -s "$clone/config/tool-profiles.tsv" "$here/config/tool-profiles.tsv" && cmp -s "$clone/config/omnious-model-tool-profiles.json" "$here/config/omnious-model-tool-profiles.json"'
expect runbook "deploy/README.md has the allowlist data the runbook points to" grep -q '^## Allowlist data$' "$here/README.md"
# runbook LABEL DIR expected-rc pattern env... -- command...: one command as
# written, run in DIR (the clone's parent or the clone).
runbook() {
	local label="$1" dir="$2" rc_want="$3" pattern="$4"
	shift 4
	local envs=()
	while (($#)) && [[ "$1" != -- ]]; do envs+=("$1"); shift; done
	shift
	local rc=0
	(cd "$dir" && env -i PATH="$nopath" HOME="$work" "${envs[@]}" "$@") </dev/null >"$work/runbook.out" 2>&1 || rc=$?
	judge "runbook: $label" "$rc" "$rc_want" "$pattern" "$work/runbook.out"
}
runbook "./provider-node/install.sh --dry-run (Qwen/Qwen3-32B: hermes, reasoning qwen3)" "$parent" 0 \
	"^\+ helm upgrade --install provider-node-mainnet $clone/deploy/helm/provider-node .* --wait" "${runbook_env[@]}" -- ./provider-node/install.sh --dry-run
expect runbook "install dry run: the Qwen3 profile, Secrets via stdin, helm test" \
	eval 'grep -q "toolParser: {name: \"hermes\", reasoning: \"qwen3\", family: \"Qwen3\"}" "$work/runbook.out" && grep -q "^+ kubectl create secret generic provider-node-mainnet-quoter-key .*| kubectl apply" "$work/runbook.out" && grep -q "^+ helm test provider-node-mainnet" "$work/runbook.out"'
stub_cmd=(./provider-node/install.sh) stub_dir="$parent" stub_release=provider-node-mainnet
stub_install "the runbook's ./provider-node/install.sh" "${runbook_env[@]}"
runbook "TOOL_PROFILE=auto ./setup.sh" "$clone" 0 "parser 'hermes', reasoning parser 'qwen3' \(auto\)" "${setup_env[@]}" TOOL_PROFILE=auto -- ./setup.sh
expect runbook "setup.sh left its result in out/tool-profile.env" \
	eval 'grep -qx "MODEL_ID=Qwen/Qwen3-32B" "$clone/out/tool-profile.env" && grep -qx "TOOL_CALL_PARSER=hermes" "$clone/out/tool-profile.env"'
runbook "the install reads setup.sh's result" "$parent" 0 "parser 'hermes', reasoning parser 'qwen3' \(from setup.sh: $clone/out/tool-profile.env\)" \
	"${runbook_env[@]}" -- ./provider-node/install.sh --dry-run
runbook "TOOL_PROFILE=custom VLLM_TOOL_CALL_PARSER=<official-parser> ./setup.sh" "$clone" 0 "acme/new-model on vllm: tool family 'custom', parser 'my_parser' \(custom\)" \
	"${setup_env[@]}" MODEL_ID=acme/new-model TOOL_PROFILE=custom VLLM_TOOL_CALL_PARSER=my_parser -- ./setup.sh
runbook "the install takes setup.sh's reviewed override" "$parent" 0 "toolParser: \{name: \"my_parser\", reasoning: \"\", family: \"custom\"\}" \
	"${runbook_env[@]}" MODEL_ID=acme/new-model -- ./provider-node/install.sh --dry-run
runbook "the install of another model resolves alone" "$parent" 0 "note: .* is setup.sh's result for MODEL_ID 'acme/new-model' on vllm, not this install's" \
	"${runbook_env[@]}" -- ./provider-node/install.sh --dry-run
runbook "setup.sh, unknown family: fails closed with its reason" "$clone" 2 "no reviewed tool profile matches MODEL_ID 'acme/new-model' \(fail closed\)" \
	"${setup_env[@]}" MODEL_ID=acme/new-model TOOL_PROFILE=auto -- ./setup.sh
expect runbook "a failed setup.sh leaves no result" eval '[[ ! -e "$clone/out/tool-profile.env" ]]'
runbook "setup.sh without MODEL_ID says where it comes from" "$clone" 2 "MODEL_ID is required" TOOL_PROFILE=auto -- ./setup.sh
runbook "the install of the unknown family then fails closed too" "$parent" 2 "no reviewed tool profile matches MODEL_ID 'acme/new-model' \(fail closed\)" \
	"${runbook_env[@]}" MODEL_ID=acme/new-model -- ./provider-node/install.sh --dry-run
runbook "setup.sh, SGLang without a reviewed parser: fails closed" "$clone" 2 "has no reviewed sglang parser \(fail closed\)" \
	"${setup_env[@]}" MODEL_ID=allenai/Olmo-3-7B-Instruct ENGINE=sglang TOOL_PROFILE=auto -- ./setup.sh
runbook "setup.sh, SGLANG_TOOL_CALL_PARSER override" "$clone" 0 "parser 'olmo3_sg' \(custom\)" \
	"${setup_env[@]}" MODEL_ID=allenai/Olmo-3-7B-Instruct ENGINE=sglang TOOL_PROFILE=custom SGLANG_TOOL_CALL_PARSER=olmo3_sg -- ./setup.sh
runbook "deploy/install.sh keeps working from the clone" "$clone" 0 "^\+ helm test provider-node-mainnet" "${runbook_env[@]}" -- ./deploy/install.sh --dry-run
stub_cmd=(bash "$here/install.sh" --env stub) stub_dir="$here" stub_release=provider-node-stub
isolate=("TOOL_PROFILE_ENV=$work/no-setup.env")

# With the quoter binary (built by `make build`), resolution goes through
# `quoter tool-profile` and must agree with the awk fallback.
if [[ -x "$root/bin/quoter" ]]; then
	ln -sf "$root/bin/quoter" "$nopath/quoter"
	for case in "Qwen/Qwen2.5-72B-Instruct vllm hermes" "Qwen/Qwen2.5-72B-Instruct sglang qwen25" "openai/gpt-oss-120b vllm openai" "moonshotai/Kimi-K2-Instruct sglang kimi_k2"; do
		read -r model engine parser <<<"$case"
		dry "quoter tool-profile $model/$engine" 0 "toolParser: \{name: \"$parser\"" "${good_env[@]}" "MODEL_ID=$model" "ENGINE=$engine" --
	done
	dry "quoter tool-profile unknown family" 2 "fail closed" "${good_env[@]}" MODEL_ID=acme/new-model --
	rm -f "$nopath/quoter"
fi

echo
if ((failures)); then
	echo "deploy checks: $failures failed" >&2
	exit 1
fi
echo "deploy checks: all passed"
