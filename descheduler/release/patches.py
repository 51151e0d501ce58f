"""The JSON patch that releases one gated pod: pin it to its node and remove our gate, in one call.

Pure. What the API server accepts while a pod is gated (kube-apiserver 1.36.3,
`pkg/apis/core/validation/validation.go`, `validateNodeAffinityMutation` and
`validateNodeSelectorTermHasOnlyAdditions`):
- no required node affinity (or an empty term list): anything may be set;
- otherwise the number of terms must stay the same, and each term may only gain requirements
  appended after its existing `matchExpressions` / `matchFields`;
- a term with no requirements at all must stay empty (it matches no node; adding any would widen it);
- scheduling gates may only be removed.
So the pin is a `matchFields` requirement `metadata.name In [node]` appended to every non-empty
term (or the only term when there is none): node names work on nodes without a hostname label (kwok).
Both go in one patch (`release`): the API server validates the update against the gated pod it
replaces, so tightening and un-gating together is accepted (proven on the real API server in
tests/e2e/test_controlplane_facts.py), and a pod is never left pinned but gated, or un-gated unpinned.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

from common import gate_patch

Patch = gate_patch.Patch


def pin_requirement(nodes: Sequence[str]) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": sorted(set(nodes))}


def tighten(pod: Mapping[str, Any], *, nodes: Sequence[str]) -> Patch:
    """A patch restricting the pod's required node affinity to `nodes`; [] when it already is.

    Guarded by a `test` of the resourceVersion the plan was made from, so a pod changed meanwhile
    fails the patch instead of being pinned on stale facts.
    """
    mutated: dict[str, Any] = copy.deepcopy(dict(pod))
    requirement = pin_requirement(nodes)
    spec = mutated.setdefault("spec", {})
    affinity = spec["affinity"] = spec.get("affinity") or {}
    node_affinity = affinity["nodeAffinity"] = affinity.get("nodeAffinity") or {}
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity[key] = node_affinity.get(key) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        required["nodeSelectorTerms"] = [{"matchFields": [requirement]}]
    for term in terms:
        fields = term.get("matchFields") or []
        if (term.get("matchExpressions") or fields) and requirement not in fields:
            term["matchFields"] = [*fields, requirement]
    return _guarded(pod, jsonpatch.make_patch(dict(pod), mutated).patch)


def _guarded(pod: Mapping[str, Any], patch: Patch) -> Patch:
    version = (pod.get("metadata") or {}).get("resourceVersion")
    if not patch or not version:
        return patch
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *patch]


def release(pod: Mapping[str, Any], *, gate: str, node: str | None,
            record: tuple[str, str] | None = None) -> Patch:
    """One patch: pin the pod to `node` (if given and not pinned there yet), write `record` (annotation, value:
    where and why, so that a single pod's placement needs no Event call) and remove our gate; [] when there is
    nothing to do. Guarded by the resourceVersion the plan read when it pins."""
    pin = tighten(pod, nodes=[node]) if node else []
    gates = gate_patch.ungate(pod, gate=gate)
    if not gates:
        return pin
    if record is not None:
        pin = [*pin, gate_patch.annotate(pod, key=record[0], value=record[1])]
    return [*pin, *gates]


def mark(*, annotation: str, value: str) -> dict[str, Any]:
    """A merge patch setting one annotation (allowed at any time, gated or not)."""
    return {"metadata": {"annotations": {annotation: value}}}


SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
              "generation", "managedFields", "selfLink")


def recreation(pod: Mapping[str, Any], *, ours: Sequence[str]) -> dict[str, Any]:
    """The pod as its creator wrote it, to create it again: without status, without what the API server set in its
    metadata, without our annotations `ours` and without our pin (a term the pin alone made is dropped whole)."""
    body: dict[str, Any] = copy.deepcopy(dict(pod))
    body.pop("status", None)
    meta = body.setdefault("metadata", {})
    for key in SERVER_SET:
        meta.pop(key, None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in ours}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    spec = body.get("spec") or {}
    spec.pop("nodeName", None)
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = [f for f in term.get("matchFields") or [] if not _is_pin(f)]
        if len(fields) == len(term.get("matchFields") or []):
            terms.append(term)
            continue
        if fields:
            term["matchFields"] = fields
        else:
            term.pop("matchFields", None)
        if term:
            terms.append(term)
    if terms:
        required["nodeSelectorTerms"] = terms
    elif required:
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
        if not node_affinity:
            affinity.pop("nodeAffinity", None)
        if not affinity:
            spec.pop("affinity", None)
    return body


def _is_pin(requirement: Mapping[str, Any]) -> bool:
    return (requirement.get("key") == "metadata.name" and requirement.get("operator") == "In"
            and len(requirement.get("values") or []) == 1)
