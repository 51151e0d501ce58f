"""Builders for the Kubernetes objects tests create: plain dicts, exactly what goes over the wire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common import gpu


def requirement(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)} if values else {"key": key, "operator": operator}


def pod(
    name: str,
    *,
    namespace: str,
    gpus: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    gates: Sequence[str] = (),
    required_terms: Sequence[Mapping[str, Any]] | None = None,
    preferred_terms: Sequence[tuple[int, Mapping[str, Any]]] = (),
    priority_class: str | None = None,
    priority: int | None = None,
    preemption_policy: str | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A single-container pod; `required_terms`/`preferred_terms` are nodeSelectorTerms
    (`{"matchExpressions": [...], "matchFields": [...]}`), preferred ones with their weight."""
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {gpu.FULL_GPU: str(gpus)}
        resources["requests"][gpu.FULL_GPU] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/gpu-steward/e2e:1", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    node_affinity: dict[str, Any] = {}
    if required_terms is not None:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [dict(term) for term in required_terms]
        }
    if preferred_terms:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": weight, "preference": dict(term)} for weight, term in preferred_terms
        ]
    if node_affinity:
        spec["affinity"] = {"nodeAffinity": node_affinity}
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if priority is not None:
        spec["priority"] = priority
    if preemption_policy is not None:
        spec["preemptionPolicy"] = preemption_policy
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def priority_class(name: str, *, value: int, preemption_policy: str = "PreemptLowerPriority") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "preemptionPolicy": preemption_policy,
    }


def pod_disruption_budget(
    name: str, *, namespace: str, match_labels: Mapping[str, str], min_available: int
) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": dict(match_labels)}},
    }
