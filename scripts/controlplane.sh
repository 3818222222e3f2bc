#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kubectl) from the Go
# module proxy at the versions pinned in internal/testutil/kubetest/controlplane/go.mod,
# once per version set, into .cache/controlplane/<key>/ (git-ignored). A warm
# machine finds the binaries and builds nothing. internal/testutil/kubetest starts them.
#
#   scripts/controlplane.sh          build if absent; print the directory
#   scripts/controlplane.sh --dir    print the directory only
#
# The wrapper module exists because k8s.io/kubernetes points its staging
# modules at ./staging with replace directives, which a dependent module does
# not inherit; the wrapper pins each of them to its published version.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
mod="$root/internal/testutil/kubetest/controlplane"

# The version of a module required by the wrapper's go.mod.
modversion() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$mod/go.mod"; }
kube="$(modversion k8s.io/kubernetes)"
etcd="$(modversion go.etcd.io/etcd/server/v3)"
[[ -n "$kube" && -n "$etcd" ]] || { echo "controlplane: no k8s.io/kubernetes or etcd server version in $mod/go.mod" >&2; exit 1; }
dir="$root/.cache/controlplane/kube-$kube-etcd-$etcd"

if [[ "${1:-}" == --dir ]]; then
	echo "$dir"
	exit 0
fi
bins=(etcd kube-apiserver kube-controller-manager kubectl)
have=1
for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || have=0; done
if ((have)); then
	echo "$dir"
	exit 0
fi

echo "controlplane: building etcd $etcd, kube-apiserver, kube-controller-manager and kubectl $kube into $dir (once per version; cold: about 20 minutes on 2 cores)" >&2
start=$SECONDS
mkdir -p "$root/.cache"
tmp="$(mktemp -d "$root/.cache/controlplane.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# What `kubectl version` and the server's /version report, as Kubernetes'
# own release build stamps them (helm checks a chart's kubeVersion against it).
minor="${kube#v1.}"
minor="${minor%%.*}"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	stamp+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

# One go build for all four: the go command compiles their packages and
# links the binaries side by side. etcd's main package is
# go.etcd.io/etcd/server/v3, so its binary is named "server".
(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w$stamp" -o "$tmp/" \
	go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
mv "$tmp/server" "$tmp/etcd"

mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "controlplane: built in $((SECONDS - start)) s" >&2
echo "$dir"
