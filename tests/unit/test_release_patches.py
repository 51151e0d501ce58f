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


def pod(*, affinity: dict[str, Any] | None = None, gates: list[str] | None = None, rv: str = "7") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12"}], "unknownField": {"kept": True}}
    if affinity is not None:
        spec["affinity"] = affinity
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-0", "namespace": "team", "resourceVersion": rv},
            "spec": spec}


def nominated(node: str) -> dict[str, Any]:
    body = pod(gates=[GATE])
    body["status"] = {"phase": "Pending", "nominatedNodeName": node}
    return body


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        # Adversarial first: a nomination someone else set (kube-scheduler's preemption, native TAS) is never
        # overwritten, nor is ours re-sent.
        pytest.param(nominated("other"), None, id="someone-elses-nomination-kept"),
        pytest.param(nominated("n1"), None, id="already-nominated-there-nothing-to-send"),
        pytest.param(pod(gates=[GATE], rv=""), {"status": {"nominatedNodeName": "n1"}},
                     id="no-resource-version-no-guard"),
        pytest.param(pod(gates=[GATE]), {"metadata": {"resourceVersion": "7"}, "status": {"nominatedNodeName": "n1"}},
                     id="guarded-by-the-version-the-plan-read"),
    ],
)
def test_nominate(before: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert patches.nominate(before, node="n1") == expected


def test_nominate_adds_no_node_term() -> None:
    body = patches.nominate(pod(gates=[GATE]), node="n1")
    assert body is not None and set(body) == {"metadata", "status"} and set(body["metadata"]) == {"resourceVersion"}


@pytest.mark.parametrize(
    ("gates", "record", "expected"),
    [
        pytest.param([KUEUE_GATE], ("gpu-steward.io/release", "x"), None, id="not-gated-by-us-nothing"),
        pytest.param([GATE, KUEUE_GATE], None, {"gates": [KUEUE_GATE]}, id="no-record-only-the-gate"),
        pytest.param([GATE], ("gpu-steward.io/release", "2026-11-21T12:00:00Z planned=n1 placed"),
                     {"gates": [], "annotations": {"gpu-steward.io/release": "2026-11-21T12:00:00Z planned=n1 placed"}},
                     id="record-and-gate-in-one-patch"),
    ],
)
def test_release_records_and_ungates_without_a_pin(gates: list[str], record: tuple[str, str] | None,
                                                   expected: dict[str, Any] | None) -> None:
    before = pod(gates=gates)
    patch = patches.release(before, gate=GATE, record=record)
    if expected is None:
        assert patch == []
        return
    after = jsonpatch.apply_patch(before, patch)
    want = copy.deepcopy(before)
    want["spec"]["schedulingGates"] = [{"name": g} for g in expected["gates"]]
    if "annotations" in expected:
        want["metadata"]["annotations"] = expected["annotations"]
    assert after == want, "nothing but the record and our gate changes: no node term"


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
    before = pod(gates=gates)
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
