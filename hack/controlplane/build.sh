#!/usr/bin/env bash
# Build and cache a local Kubernetes control plane for the end-to-end tests and the demo:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (from k8s.io/kubernetes),
# etcd, kwok + kwokctl and helm — all from the Go module proxy with the machine's Go.
# Output: $GPU_STEWARD_CACHE/k8s-$K8S_VERSION/bin (default ~/.cache/gpu-steward). A second run
# reuses what is there (each binary is skipped when present), so CI pays the build once per machine.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${GPU_STEWARD_CACHE:-$HOME/.cache/gpu-steward}"
ROOT="$CACHE/k8s-$K8S_VERSION"
BIN="$ROOT/bin"
mkdir -p "$BIN"

say() { printf '[controlplane] %s\n' "$*" >&2; }

command -v go >/dev/null || { say "error: Go is required (https://go.dev/dl)"; exit 1; }
export GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0

build_kubernetes() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=()
  for b in "${want[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && { say "kubernetes v$K8S_VERSION: cached"; return; }
  say "kubernetes v$K8S_VERSION: building ${missing[*]} (cold: ~6 min on 2 cores)"
  local mod="$ROOT/src/kubernetes"
  mkdir -p "$mod"
  local gomod
  gomod=$(cd "$mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
  {
    echo "module gpu-steward.local/controlplane"
    echo
    echo "go 1.25"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    # kubernetes' own go.mod points each staging module at ./staging/...; pin them to v0.<minor>.<patch>.
    grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$gomod" | awk -v v="v0.${K8S_VERSION#*.}" '{print "replace " $1 " => " $1 " " v}'
  } > "$mod/go.mod"
  cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$mod" && go mod tidy -e >/dev/null 2>&1 || true; cd "$mod" && GOFLAGS=-tags=tools go mod tidy)
  local major="${K8S_VERSION%%.*}"
  local ld=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$mod" && go build -tags=tools -ldflags "-s -w $ld" -o "$BIN/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  say "kubernetes v$K8S_VERSION: built"
}

build_etcd() {
  [ -x "$BIN/etcd" ] && { say "etcd $ETCD_VERSION: cached"; return; }
  say "etcd $ETCD_VERSION: building (~30 s)"
  local mod="$ROOT/src/etcd"
  mkdir -p "$mod"
  cat > "$mod/go.mod" <<GOMOD
module gpu-steward.local/etcd

go 1.25

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (cd "$mod" && GOFLAGS=-tags=tools go mod tidy && go build -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  say "etcd $ETCD_VERSION: built"
}

go_install() {  # name module@version
  local name=$1 pkg=$2
  [ -x "$BIN/$name" ] && { say "$name: cached"; return; }
  say "$name: building from $pkg"
  GOBIN="$BIN" GOFLAGS= go install -ldflags "-s -w" "$pkg"
}

build_kubernetes
build_etcd
go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
go_install kwokctl "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
go_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
say "ready: $BIN"
echo "$BIN"
