"""Fluent builders for the raw Kubernetes objects the pure core reads (plain dicts, as the API sends)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from gpu_steward_lab import dra_devices

Mutator = Callable[[dict[str, Any]], None]
PREFIX = "gpu-steward.io/"


def gpu_node(
    name: str,
    *,
    gpus: int,
    domains: Sequence[Sequence[int]] | None = None,
    labels: dict[str, str] | None = None,
    topology: str = "labels",
    ready: bool = True,
    mutate: Mutator | None = None,
) -> dict[str, Any]:
    """A GPU node; `domains` default to one domain of all GPUs; `topology` is labels|annotation|none."""
    domains = [list(d) for d in (domains or [range(gpus)])]
    node_labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.count": str(gpus), **(labels or {})}
    annotations: dict[str, str] = {}
    if topology == "labels":
        node_labels[f"{PREFIX}nvlink-domains"] = str(len(domains))
        node_labels[f"{PREFIX}nvlink-domain-size"] = str(max(len(d) for d in domains))
    elif topology == "annotation":
        annotations[f"{PREFIX}nvlink-topology"] = json.dumps(domains)
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if mutate:
        mutate(node)
    return node


def pod(
    name: str,
    *,
    namespace: str = "default",
    gpus: int = 0,
    mig: dict[str, int] | None = None,
    node: str | None = None,
    phase: str = "Pending",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    created: str = "2026-11-21T10:00:00Z",
    mutate: Mutator | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    for profile, count in (mig or {}).items():
        limits[f"nvidia.com/mig-{profile}"] = str(count)
    container: dict[str, Any] = {"name": "main", "image": "cuda:12"}
    if limits:
        container["resources"] = {"limits": limits}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": created},
        "spec": {"containers": [container]},
        "status": {"phase": phase},
    }
    if labels:
        body["metadata"]["labels"] = dict(labels)
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if node:
        body["spec"]["nodeName"] = node
    if mutate:
        mutate(body)
    return body


def priority_class(
    name: str, value: int, *, policy: str = "PreemptLowerPriority", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "value": value,
        "preemptionPolicy": policy,
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


def tier_classes() -> list[dict[str, Any]]:
    """The PriorityClasses of the default settings' tiers."""
    return [
        priority_class("gpu-steward-critical", 100_000),
        priority_class("gpu-steward-normal", 10_000),
        priority_class("gpu-steward-scavenger", 100, policy="Never"),
    ]


def both(*mutators: Mutator) -> Mutator:
    """One mutator that applies each of `mutators` in turn."""
    def mutate(obj: dict[str, Any]) -> None:
        for m in mutators:
            m(obj)

    return mutate


def disruption_budget(name: str, *, namespace: str, match: dict[str, str] | None, allowed: int | None,
                      mutate: Mutator | None = None) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget selecting `match` labels (None: a null selector); `allowed`: its
    status.disruptionsAllowed (None: no status yet)."""
    body: dict[str, Any] = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": None if match is None else {"matchLabels": match}, "maxUnavailable": 1},
    }
    if allowed is not None:
        body["status"] = {"disruptionsAllowed": allowed}
    if mutate:
        mutate(body)
    return body


# --- DRA (resource.k8s.io/v1) -------------------------------------------------------------------------------

# NVIDIA's DeviceClass, a node's ResourceSlice and its devices: built in the lab, which the benchmarks use too.
NVIDIA_DRIVER = dra_devices.NVIDIA_DRIVER
NVIDIA_SELECTOR = dra_devices.NVIDIA_SELECTOR
device_class = dra_devices.device_class
gpu_device = dra_devices.gpu_device
resource_slice = dra_devices.resource_slice
mig_device = dra_devices.mig_device
MIG_CLASS = dra_devices.MIG_CLASS
MIG_SELECTOR = dra_devices.MIG_SELECTOR


def claim_spec(count: int = 1, *, device_class_name: str = NVIDIA_DRIVER, mode: str | None = None,
               admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if mode:
        exactly["allocationMode"] = mode
    if mode != "All":
        exactly["count"] = count
    if admin:
        exactly["adminAccess"] = True
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def claim_template(name: str, *, namespace: str = "default", spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"spec": spec or claim_spec()}}


def resource_claim(name: str, *, namespace: str = "default", spec: dict[str, Any] | None = None,
                   devices: Sequence[tuple[str, int]] = (), reserved_for: Sequence[str] = (),
                   extended: bool = False, driver: str = NVIDIA_DRIVER) -> dict[str, Any]:
    """A ResourceClaim; `devices`: (pool, GPU index) allocated to it; `reserved_for`: names of pods (uid-<name>)."""
    body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": name, "namespace": namespace}, "spec": spec or claim_spec()}
    if extended:
        body["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    status: dict[str, Any] = {}
    if devices:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpus", "driver": driver, "pool": pool, "device": f"gpu-{index}"} for pool, index in devices]}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved_for]
    if status:
        body["status"] = status
    return body


def with_claim_template(template: str, *, entry: str = "gpus", generated: str | None = None) -> Mutator:
    """A pod mutator: its main container uses a claim made from `template` (`generated`: the claim's name)."""
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["resourceClaims"] = [{"name": entry, "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": entry}]
        if generated:
            body["status"]["resourceClaimStatuses"] = [{"name": entry, "resourceClaimName": generated}]
    return mutate


def with_claim(claim: str, *, entry: str = "gpus") -> Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["resourceClaims"] = [{"name": entry, "resourceClaimName": claim}]
        body["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": entry}]
    return mutate


def with_extended_claim(claim: str) -> Mutator:
    """A pod mutator: kube-scheduler made `claim` for its extended-resource request."""
    def mutate(body: dict[str, Any]) -> None:
        body["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": claim, "requestMappings": []}
    return mutate


def dra_node(name: str, *, gpus: int = 8, domains: Sequence[Sequence[int]] | None = None,
             mutate: Mutator | None = None) -> dict[str, Any]:
    """A node whose GPUs are DRA devices: no nvidia.com/gpu in its allocatable (its slice is `resource_slice`)."""
    node = dra_devices.without_device_plugin(gpu_node(name, gpus=gpus, domains=domains))
    if mutate:
        mutate(node)
    return node
