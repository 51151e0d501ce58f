"""Fluent builders for the raw Kubernetes objects the pure core reads (plain dicts, as the API sends)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

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
