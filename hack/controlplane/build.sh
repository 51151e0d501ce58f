#!/usr/bin/env bash
# Build and cache a local Kubernetes control plane for the end-to-end tests, the benchmarks and the demo:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (from k8s.io/kubernetes), etcd,
# kwok + kwokctl and helm — all from the Go module proxy with the machine's Go (no Docker, no downloads
# of prebuilt binaries).
#
# Output: $GPU_STEWARD_CACHE/k8s-$K8S_VERSION/bin (default ~/.cache/gpu-steward). Nothing is written
# outside that directory except Go's own module and build caches. A second run reuses what is there
# (each binary is skipped when present) and does not even need Go; etcd, kwok and helm are copied from
# another version's directory when they were built from the same module versions. Progress goes to
# stderr; the last line on stdout is the bin directory. The versions the project tests are
# KUBERNETES_VERSIONS in gpu_steward_lab/localcluster.py (scripts/setup test builds each).
#
# Part of the lab, never of the image: gpu_steward_lab/localcluster.py runs it from a clone.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${GPU_STEWARD_CACHE:-$HOME/.cache/gpu-steward}"
ROOT="$CACHE/k8s-$K8S_VERSION"
BIN="$ROOT/bin"
STAGE="$ROOT/stage"  # binaries land here first and are moved into BIN only when complete
STARTED=$SECONDS

say() { printf '[controlplane %4ds] %s\n' "$((SECONDS - STARTED))" "$*" >&2; }

# Go is needed only when something must be built; the wrapper modules say `go 1.25`.
need_go() {
  command -v go >/dev/null || {
    say "error: Go 1.25 or newer is required to build the control plane, and there is no 'go' on PATH (https://go.dev/dl)"
    exit 1
  }
  local found major minor
  found=$(go env GOVERSION)  # e.g. go1.26.1, go1.27rc1
  major=$(sed -n 's/^go\([0-9]*\)\.\([0-9]*\).*/\1/p' <<<"$found")
  minor=$(sed -n 's/^go\([0-9]*\)\.\([0-9]*\).*/\2/p' <<<"$found")
  if [ -z "$major" ] || [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 25 ]; }; then
    say "error: Go 1.25 or newer is required to build the control plane; $(command -v go) is $found (https://go.dev/dl)"
    exit 1
  fi
}

# Move freshly built binaries from STAGE into BIN (a rename on the same filesystem: never half a file).
publish() {
  local b
  for b in "$@"; do mv -f "$STAGE/$b" "$BIN/$b"; done
  rm -rf "$STAGE"
}

build_kubernetes() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=() b
  for b in "${want[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && { say "kubernetes v$K8S_VERSION: cached"; return; }
  need_go
  say "kubernetes v$K8S_VERSION: building ${missing[*]} (cold: ~6 min on 2 cores, ~3 GB of Go caches)"
  local mod="$ROOT/src/kubernetes"
  mkdir -p "$mod"
  local gomod
  gomod=$(cd "$mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -f "$gomod" ] || { say "error: could not download k8s.io/kubernetes@v$K8S_VERSION"; exit 1; }
  local major="${K8S_VERSION%%.*}" minor="${K8S_VERSION#*.}"
  minor="${minor%%.*}"
  {
    printf 'module gpu-steward.local/controlplane\n\ngo 1.25\n\nrequire k8s.io/kubernetes v%s\n\n' "$K8S_VERSION"
    # kubernetes' own go.mod points each staging module at ./staging/...; pin them to v0.<minor>.<patch>.
    grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$gomod" \
      | awk -v v="v0.${K8S_VERSION#*.}" '{print "replace " $1 " => " $1 " " v}'
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
  say "kubernetes v$K8S_VERSION: resolving modules"
  (cd "$mod" && go mod tidy)  # tidy honours every build tag, so tools.go keeps the requirements
  # Without these the binaries report v0.0.0 and version checks (Helm kubeVersion, kwokctl) misbehave.
  local ld="" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  say "kubernetes v$K8S_VERSION: compiling"
  mkdir -p "$STAGE"
  (cd "$mod" && go build -ldflags "-s -w $ld" -o "$STAGE/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  publish "${want[@]}"
  say "kubernetes v$K8S_VERSION: built"
}

# etcd, kwok and helm do not depend on the Kubernetes version: copy one from another version's cache when
# Go recorded the same module version in it (`go version -m`), instead of building it again.
reuse() {  # name module version
  local name=$1 module=$2 version=$3 other
  command -v go >/dev/null || return 1
  for other in "$CACHE"/k8s-*/bin/"$name"; do
    [ -x "$other" ] && [ "$other" != "$BIN/$name" ] || continue
    go version -m "$other" 2>/dev/null \
      | awk -v m="$module" -v v="$version" '($1 == "mod" || $1 == "dep") && $2 == m && $3 == v {ok = 1} END {exit !ok}' \
      || continue
    mkdir -p "$STAGE"
    cp "$other" "$STAGE/$name"
    publish "$name"
    say "$name: reused $other ($module $version)"
    return 0
  done
  return 1
}

build_etcd() {
  [ -x "$BIN/etcd" ] && { say "etcd $ETCD_VERSION: cached"; return; }
  reuse etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" && return
  need_go
  say "etcd $ETCD_VERSION: building (~30 s)"
  local mod="$ROOT/src/etcd"
  mkdir -p "$mod" "$STAGE"
  printf 'module gpu-steward.local/etcd\n\ngo 1.25\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" \
    > "$mod/go.mod"
  cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (cd "$mod" && go mod tidy && go build -ldflags "-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3)
  publish etcd
  say "etcd $ETCD_VERSION: built"
}

go_install() {  # name module module/cmd@version
  local name=$1 module=$2 pkg=$3
  [ -x "$BIN/$name" ] && { say "$name: cached"; return; }
  reuse "$name" "$module" "${pkg##*@}" && return
  need_go
  say "$name: building $pkg (~1.5 min)"
  mkdir -p "$STAGE"
  GOBIN="$STAGE" GOFLAGS= go install -ldflags "-s -w" "$pkg"
  publish "$name"
  say "$name: built"
}

mkdir -p "$BIN"
rm -rf "$STAGE"  # leftovers of an interrupted run
export GOFLAGS="${GOFLAGS:--mod=mod}"
export CGO_ENABLED=0

build_kubernetes
build_etcd
go_install kwok sigs.k8s.io/kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
go_install kwokctl sigs.k8s.io/kwok "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
go_install helm helm.sh/helm/v3 "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
say "ready: $BIN"
echo "$BIN"
