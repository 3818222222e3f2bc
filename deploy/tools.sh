#!/usr/bin/env bash
# Installs what deploy/check.sh needs, and nothing that is already there:
#   helm and kubeconform   go install at pinned versions (into $(go env GOPATH)/bin)
#   promtool               Debian's prometheus package (/usr/bin/promtool)
#   schema sources         go mod download of the modules whose files hold the
#                          Kubernetes OpenAPI document and the KEDA, Prometheus
#                          Operator and Gateway API CRDs (read only; they are
#                          not build dependencies of the project)
# Run it from the deps step; check.sh itself never touches the network.
set -euo pipefail

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.7.0
# Modules read by check.sh (keep in sync with its paths).
SCHEMA_MODULES=(
	k8s.io/kubernetes@v1.37.2
	github.com/kedacore/keda/v2@v2.21.0
	github.com/prometheus-operator/prometheus-operator@v0.85.0
	sigs.k8s.io/gateway-api@v1.6.3
)

gobin="$(go env GOBIN)"
[[ -n "$gobin" ]] || gobin="$(go env GOPATH)/bin"
export PATH="$gobin:$PATH"

# The module version go install recorded in the binary ("" if absent).
modversion() {
	local bin
	bin="$(command -v "$1" 2>/dev/null)" || return 0
	go version -m "$bin" 2>/dev/null | awk '$1 == "mod" { print $3 }'
}

if [[ "$(modversion helm)" != "$HELM_VERSION" ]]; then
	echo "tools: go install helm $HELM_VERSION"
	GOFLAGS= go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
if [[ "$(modversion kubeconform)" != "$KUBECONFORM_VERSION" ]]; then
	echo "tools: go install kubeconform $KUBECONFORM_VERSION"
	GOFLAGS= go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
fi

if ! command -v promtool >/dev/null; then
	if [[ "$(id -u)" -ne 0 ]]; then
		echo "tools: promtool missing; run as root or: apt-get install -y prometheus" >&2
		exit 1
	fi
	echo "tools: apt-get install prometheus (for promtool)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends prometheus >/dev/null
	# The package also installs a Prometheus server; only promtool is wanted.
	if [[ -d /run/systemd/system ]]; then
		systemctl disable --now prometheus.service >/dev/null 2>&1 || true
	fi
	command -v promtool >/dev/null || { echo "tools: the prometheus package did not provide promtool" >&2; exit 1; }
fi

modcache="$(go env GOMODCACHE)"
missing=()
for m in "${SCHEMA_MODULES[@]}"; do
	[[ -d "$modcache/${m%@*}@${m#*@}" ]] || missing+=("$m")
done
if ((${#missing[@]})); then
	echo "tools: go mod download ${missing[*]}"
	# Outside the project module, so go.mod and go.sum stay untouched.
	scratch="$(mktemp -d)"
	trap 'rm -rf "$scratch"' EXIT
	(cd "$scratch" && GOFLAGS= GOTOOLCHAIN=local go mod download "${missing[@]}")
fi
