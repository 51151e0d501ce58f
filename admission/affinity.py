"""Node-affinity edits: preferred terms for the best-scored nodes.

Admission adds no required term: node affinity cannot be relaxed after creation, and a requirement
computed from cluster-wide labels can leave a pod with no node the scheduler would otherwise accept
(docs/scoring.md, "Never strand a pod"). Preferred terms only rank nodes; they are appended after the
user's, which are never removed or reordered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from admission import scoring

HOSTNAME_FIELD = "metadata.name"  # kwok and hand-made nodes often lack kubernetes.io/hostname


def _node_affinity(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod.setdefault("spec", {})
    affinity = spec.get("affinity") or {}
    spec["affinity"] = affinity
    node_affinity = affinity.get("nodeAffinity") or {}
    affinity["nodeAffinity"] = node_affinity
    return node_affinity


def preferred_terms(scores: Sequence[scoring.NodeScore], count: int) -> list[dict[str, Any]]:
    return [
        {
            "weight": s.normalized,
            "preference": {"matchFields": [{"key": HOSTNAME_FIELD, "operator": "In", "values": [s.node]}]},
        }
        for s in scores[:count]
    ]


def add_preferred(pod: dict[str, Any], terms: Sequence[dict[str, Any]]) -> bool:
    if not terms:
        return False
    node_affinity = _node_affinity(pod)
    existing = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [*existing, *terms]
    return True
