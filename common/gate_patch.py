"""Removing our scheduling gate from a pod, and recording why, as JSON patch operations.

Pure. Shared by the release controller (`descheduler.release.patches`), the webhook's gate lifter
(`admission.gate_lifter`) and `gpu-steward release-gates`: one way to lift our gate, never another controller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Patch = list[dict[str, Any]]


def ungate(pod: Mapping[str, Any], *, gate: str) -> Patch:
    """A patch removing `gate` and only it; [] when the pod does not carry it.

    Written out rather than diffed: a diff of [ours, kueue] -> [kueue] may come out as "rename
    element 0, drop element 1". The `test` makes the removal fail rather than hit another
    controller's gate should the list have shifted since the pod was read.
    """
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, entry in enumerate(gates):
        if entry.get("name") == gate:
            path = f"/spec/schedulingGates/{i}"
            return [{"op": "test", "path": f"{path}/name", "value": gate}, {"op": "remove", "path": path}]
    return []


def annotate(pod: Mapping[str, Any], *, key: str, value: str) -> dict[str, Any]:
    """The JSON patch operation that sets one annotation (creating the map when the pod has none)."""
    annotations = (pod.get("metadata") or {}).get("annotations")
    pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
    return ({"op": "add", "path": pointer, "value": value} if annotations
            else {"op": "add", "path": "/metadata/annotations", "value": {key: value}})
