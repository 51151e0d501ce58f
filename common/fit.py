"""Could this pod run on this node at all? The scheduler's filters that matter for GPU choice:
node readiness, taints and tolerations, nodeSelector, and free GPUs. (The user's own node affinity
is not evaluated here; the scheduler still enforces it, we only avoid wasting terms on nodes
that can never take the pod.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common import snapshot

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if not key:  # empty key with Exists tolerates everything
            if toleration.get("operator") == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists":
            return True
        if (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def why_not(pod_spec: Mapping[str, Any], node: snapshot.Node) -> str | None:
    """None when the pod may go to the node (ignoring GPU counts), else the reason it may not."""
    if not node.schedulable:
        return "node not ready or cordoned"
    tolerations = pod_spec.get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    return None
