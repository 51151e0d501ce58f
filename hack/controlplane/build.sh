#!/usr/bin/env bash
# Build (or reuse) the local Kubernetes control plane for the end-to-end tests and the demo.
# The real script ships inside the package (gpu-steward demo runs it on a fresh machine); this is
# the entry point for a checkout. Versions: K8S_VERSION, ETCD_VERSION, KWOK_VERSION, HELM_VERSION.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../gpu_steward/controlplane_build.sh" "$@"
