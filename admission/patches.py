"""Patch by diff, limited to the fields the webhook owns.

The engine edits a working copy of the raw pod in which only the subtrees it may change are
copied (everything else is shared, read-only), and the patch is the JSON diff of those subtrees
against the request. Unknown fields cannot turn into removals, a bug elsewhere in the engine
cannot leak into the patch, and large pods (env, volumes, managedFields) cost nothing to copy or diff.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer

OWNED: tuple[tuple[str, str], ...] = (
    ("metadata", "annotations"),
    ("spec", "priorityClassName"),
    ("spec", "priority"),
    ("spec", "preemptionPolicy"),
    ("spec", "affinity"),
    ("spec", "schedulingGates"),
    ("spec", "schedulingGroup"),  # our gang's own PodGroup (`gating.native_binding`), only at creation
    ("spec", "resourceClaims"),  # a claim entry pointed at the pod's own claim (`common.domain_claim`), at creation
)
_MISSING = object()


def _clone(value: Any) -> Any:
    """Deep copy of JSON data, several times faster than copy.deepcopy."""
    if type(value) is dict:
        return {k: _clone(v) for k, v in value.items()}
    if type(value) is list:
        return [_clone(v) for v in value]
    return value


def working_copy(pod: Mapping[str, Any]) -> dict[str, Any]:
    copy = dict(pod)
    for parent in {p for p, _ in OWNED}:
        copy[parent] = dict(pod.get(parent) or {})
    for parent, key in OWNED:
        if key in copy[parent]:
            copy[parent][key] = _clone(copy[parent][key])
    return copy


def diff(original: Mapping[str, Any], mutated: Mapping[str, Any]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for parent, key in OWNED:
        before = (original.get(parent) or {}).get(key, _MISSING)
        after = (mutated.get(parent) or {}).get(key, _MISSING)
        if before == after:
            continue
        path = f"/{parent}/{jsonpointer.escape(key)}"
        if before is _MISSING:
            ops.append({"op": "add", "path": path, "value": after})
        elif after is _MISSING:
            ops.append({"op": "remove", "path": path})
        elif isinstance(before, dict | list) and type(before) is type(after):
            ops += [{**op, "path": path + op["path"]} for op in jsonpatch.make_patch(before, after).patch]
        else:
            ops.append({"op": "replace", "path": path, "value": after})
    return ops
