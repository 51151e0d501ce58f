"""The patches that release one gated pod: nominate it to its node, then remove our gate.

Pure. Two calls per pod, because they go to two places:
- - `nominate`: a `pods/status` merge patch setting `status.nominatedNodeName` while the pod is still gated.
  kube-scheduler keeps the nominated node's resources for it against equal- and lower-priority pods, tries that node
  first once the pod is un-gated, and binds it elsewhere when the node no longer fits: a nomination says where, it never
  strands (docs/placement.md; proven in tests/e2e/test_nomination_facts_e2e.py). The patch carries the resourceVersion
  the plan read, so a pod changed since (someone else nominated it, its gate went) fails it with a conflict instead of
  being nominated on stale facts, and a nomination someone else set is never overwritten.
- `release`: a JSON patch writing our release record (`names.release`: when, where and why) and removing our gate.
No required node term is ever added: nothing here can make a pod unplaceable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import gate_patch

Patch = gate_patch.Patch


def nominated(pod: Mapping[str, Any]) -> str | None:
    """The node the pod is nominated to (by us, kube-scheduler's preemption or anyone), if any."""
    node = (pod.get("status") or {}).get("nominatedNodeName")
    return str(node) if node else None


def nominate(pod: Mapping[str, Any], *, node: str) -> dict[str, Any] | None:
    """The `pods/status` merge patch nominating the pod to `node`, guarded by the resourceVersion the plan read; None
    when the pod is already nominated (to `node`: nothing to do; elsewhere: not ours to overwrite)."""
    if nominated(pod) is not None:
        return None
    body: dict[str, Any] = {"status": {"nominatedNodeName": node}}
    version = (pod.get("metadata") or {}).get("resourceVersion")
    if version:
        body["metadata"] = {"resourceVersion": version}
    return body


def release(pod: Mapping[str, Any], *, gate: str, record: tuple[str, str] | None = None) -> Patch:
    """One JSON patch: write `record` (annotation, value) and remove our gate; [] when the pod no longer carries it."""
    gates = gate_patch.ungate(pod, gate=gate)
    if not gates:
        return []
    if record is None:
        return gates
    return [gate_patch.annotate(pod, key=record[0], value=record[1]), *gates]


def mark(*, annotation: str, value: str) -> dict[str, Any]:
    """A merge patch setting one annotation (allowed at any time, gated or not)."""
    return {"metadata": {"annotations": {annotation: value}}}
