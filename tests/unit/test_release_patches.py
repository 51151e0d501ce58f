"""The release patches, applied with jsonpatch and compared as whole pods."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from common import gate_patch, settings
from descheduler.release import patches

GATE = settings.Names().gate
KUEUE_GATE = "kueue.x-k8s.io/admission"
PIN = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
GPU_SIZE = {"key": "gpu-steward.io/nvlink-domain-size", "operator": "Gt", "values": ["3"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
PREFERRED = [{"weight": 50, "preference": {"matchExpressions": [ZONE]}}]


def pod(*, affinity: dict[str, Any] | None = None, gates: list[str] | None = None, rv: str = "7") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12"}], "unknownField": {"kept": True}}
    if affinity is not None:
        spec["affinity"] = affinity
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-0", "namespace": "team", "resourceVersion": rv},
            "spec": spec}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(pod(), pod(affinity=required({"matchFields": [PIN]})), id="no-affinity-sets-required"),
        pytest.param(
            pod(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED},
                          "podAntiAffinity": {"x": 1}}),
            pod(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED,
                                           "requiredDuringSchedulingIgnoredDuringExecution": {
                                               "nodeSelectorTerms": [{"matchFields": [PIN]}]}},
                          "podAntiAffinity": {"x": 1}}),
            id="preferred-only-gains-required-and-keeps-the-rest",
        ),
        pytest.param(
            pod(affinity=required({"matchExpressions": [GPU_SIZE]}, {"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]})),
            pod(affinity=required({"matchExpressions": [GPU_SIZE], "matchFields": [PIN]}, {"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}, PIN]})),
            id="appended-after-existing-requirements-of-every-term",
        ),
        pytest.param(
            pod(affinity=required({}, {"matchExpressions": [ZONE]})),
            pod(affinity=required({}, {"matchExpressions": [ZONE], "matchFields": [PIN]})),
            id="empty-term-stays-empty",
        ),
        pytest.param(
            pod(affinity=required()),
            pod(affinity=required({"matchFields": [PIN]})),
            id="empty-term-list-is-set",
        ),
    ],
)
def test_tighten(before: dict[str, Any], after: dict[str, Any]) -> None:
    patch = patches.tighten(before, nodes=["n1"])
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert jsonpatch.apply_patch(before, patch) == after
    assert patches.tighten(after, nodes=["n1"]) == [], "a second pass changes nothing"


def test_tighten_fails_on_a_pod_changed_since_planning() -> None:
    patch = patches.tighten(pod(rv="7"), nodes=["n1"])
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(pod(rv="8"), patch)


@pytest.mark.parametrize(
    ("gates", "remaining"),
    [
        pytest.param([GATE], [], id="only-ours"),
        pytest.param([GATE, KUEUE_GATE], [KUEUE_GATE], id="ours-first-kueue-kept"),
        pytest.param([KUEUE_GATE, GATE, "other.io/x"], [KUEUE_GATE, "other.io/x"], id="ours-in-the-middle"),
        pytest.param([KUEUE_GATE], [KUEUE_GATE], id="not-ours-untouched"),
    ],
)
def test_ungate_removes_only_our_gate(gates: list[str], remaining: list[str]) -> None:
    before = pod(affinity=required({"matchFields": [PIN]}), gates=gates)
    expected = copy.deepcopy(before)
    expected["spec"]["schedulingGates"] = [{"name": g} for g in remaining]
    patch = gate_patch.ungate(before, gate=GATE)
    assert (patch == []) is (GATE not in gates)
    assert jsonpatch.apply_patch(before, patch) == expected


def test_ungate_fails_rather_than_remove_a_shifted_gate() -> None:
    patch = gate_patch.ungate(pod(gates=[KUEUE_GATE, GATE]), gate=GATE)
    shifted = pod(gates=[GATE, KUEUE_GATE])  # as read by someone else a moment later
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch(shifted, patch)


def test_mark_is_a_merge_patch_of_one_annotation() -> None:
    assert patches.mark(annotation="gpu-steward.io/gang-complete-since", value="2026-11-21T12:00:00Z") == {
        "metadata": {"annotations": {"gpu-steward.io/gang-complete-since": "2026-11-21T12:00:00Z"}}
    }


def _pinned(term: dict[str, Any] | None) -> dict[str, Any]:
    body = pod(rv="9")
    body["metadata"].update(uid="u-1", creationTimestamp="2026-11-21T12:00:00Z", managedFields=[{"x": 1}],
                            annotations={"gpu-steward.io/release": "2026-11-21T12:00:00Z placed on n1", "team": "a"})
    body["status"] = {"phase": "Pending"}
    if term is not None:
        body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}
    return body


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({"matchFields": [patches.pin_requirement(["n1"])]}, None, id="term-made-by-the-pin-dropped"),
        pytest.param({"matchExpressions": [ZONE], "matchFields": [patches.pin_requirement(["n1"])]},
                     {"matchExpressions": [ZONE]}, id="users-term-keeps-its-own-requirements"),
        pytest.param({"matchExpressions": [ZONE]}, {"matchExpressions": [ZONE]}, id="no-pin-nothing-removed"),
        pytest.param({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]},
                     {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]},
                     id="users-set-of-nodes-is-not-our-pin-boundary"),
    ],
)
def test_recreation_is_the_pod_as_written_minus_our_pin(before: dict[str, Any], after: dict[str, Any] | None) -> None:
    body = patches.recreation(_pinned(before), ours=["gpu-steward.io/release"])
    assert "status" not in body
    assert body["metadata"] == {"name": "w-0", "namespace": "team", "annotations": {"team": "a"}}
    assert body["spec"]["unknownField"] == {"kept": True}
    affinity = body["spec"].get("affinity")
    if after is None:
        assert affinity is None
    else:
        assert affinity == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [after]}}}
