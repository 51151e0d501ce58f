"""Node-affinity edits: the NVLink-domain requirement and preferred terms for the best-scored nodes.

Merging never widens what the user wrote: our required expression is ANDed into every existing
nodeSelectorTerm (terms are ORed, so adding to only one would widen), and our preferred terms are
appended after the user's, which are never removed or reordered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from admission import scoring
from common import settings, snapshot

HOSTNAME_FIELD = "metadata.name"  # kwok and hand-made nodes often lack kubernetes.io/hostname


@dataclasses.dataclass(frozen=True)
class Requirement:
    expression: dict[str, Any] | None
    reason: str


def requirement(*, gpus: int, cluster: snapshot.Snapshot, names: settings.Names) -> Requirement:
    """Admit only nodes whose NVLink domains hold the pod; if none can, those that need the fewest domains."""
    label = names.nvlink_domain_size
    sizes = cluster.labelled_domain_sizes
    if not sizes:
        return Requirement(None, f"no node is labelled {label}")
    largest = max(sizes)
    if largest >= gpus:
        return Requirement(
            {"key": label, "operator": "Gt", "values": [str(gpus - 1)]},
            f"{label} >= {gpus}: nodes whose NVLink domains hold all {gpus} GPUs",
        )
    return Requirement(
        {"key": label, "operator": "Gt", "values": [str(largest - 1)]},
        f"{label} >= {largest}: no domain holds {gpus} GPUs, the largest domains span the fewest",
    )


def _node_affinity(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod.setdefault("spec", {})
    affinity = spec.get("affinity") or {}
    spec["affinity"] = affinity
    node_affinity = affinity.get("nodeAffinity") or {}
    affinity["nodeAffinity"] = node_affinity
    return node_affinity


def add_required(pod: dict[str, Any], expression: dict[str, Any]) -> bool:
    """AND `expression` into every required term (creating one if none). True if the pod changed."""
    node_affinity = _node_affinity(pod)
    ours = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    # A user's required affinity without terms matches no node (the API server refuses it): adding a term
    # of ours would widen it, so only a pod without any required affinity gets a term of its own.
    terms = [{}] if ours else list(required.get("nodeSelectorTerms") or [])
    changed = False
    for term in terms:
        if not ours and not (term.get("matchExpressions") or term.get("matchFields")):
            continue  # a user's empty term matches no node; with our expression in it, it would match some
        expressions = term.get("matchExpressions") or []
        if expression not in expressions:
            term["matchExpressions"] = [*expressions, expression]
            changed = True
    if changed:
        required["nodeSelectorTerms"] = terms
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return changed


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
