"""What pin recovery creates a stuck bare pod again from (`recoverer.recreated`): the pod as its creator wrote it,
without our pin and our annotations, so that our webhook admits it afresh — a gang member is gated again for its
gang instead of starting alone (found by tests/e2e/test_closed_loop_random_e2e.py, seed 20261128: the webhook
skipped the re-created members as "already mutated" and the gang ran part-way)."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from admission import mutation
from common import settings, snapshot
from descheduler.release import patches, planning, recoverer
from tests import builders

CONFIG = settings.Settings()
NAMES = CONFIG.names
NOW = 1_000.0
GANG = {NAMES.gang_name: "pair", NAMES.gang_size: "2"}
DECISION = "2 GPU; tier normal: default tier; gate gpu-steward.io/gang added: gang team/pair of 2 (gpu-steward)"


def stuck(annotations: dict[str, str]) -> dict[str, Any]:
    """A released gang member pinned to n1, as the API server holds it."""
    body = builders.pod("pair-0", namespace="team", gpus=2, labels=GANG, annotations=annotations)
    body["metadata"].update(uid="u-1", resourceVersion="9")
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [patches.pin_requirement(["n1"])]}]}}}
    return body


@pytest.mark.parametrize(
    ("annotations", "kept"),
    [
        pytest.param({NAMES.decision: DECISION}, {}, id="webhook-decision-record-dropped"),
        pytest.param({NAMES.release: "2026-11-26T12:00:00Z placed on n1", planning.complete_mark(NAMES): "x"}, {},
                     id="release-record-and-complete-mark-dropped"),
        pytest.param({"team.example.com/ticket": "GPU-42"}, {"team.example.com/ticket": "GPU-42"},
                     id="creators-annotation-kept"),
        pytest.param({f"{NAMES.decision}-note": "mine", NAMES.decision: DECISION}, {f"{NAMES.decision}-note": "mine"},
                     id="boundary-an-annotation-named-like-ours-is-the-creators"),
    ],
)
def test_recreated_pod_carries_none_of_our_annotations(annotations: dict[str, str], kept: dict[str, str]) -> None:
    body = recoverer.recreated(stuck(annotations), names=NAMES)
    assert (body["metadata"].get("annotations") or {}) == kept
    assert snapshot.pinned_node(body) is None and "uid" not in body["metadata"]


@pytest.mark.parametrize(
    ("annotations", "gated"),
    [
        pytest.param({NAMES.decision: DECISION}, True, id="recreated-member-gated-again"),
        pytest.param({}, True, id="member-never-admitted-gated"),
    ],
)
def test_webhook_gates_a_recreated_gang_member_again(annotations: dict[str, str], gated: bool) -> None:
    cluster = snapshot.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[], priority_classes=builders.tier_classes(),
                             namespaces=[builders.namespace("team")], names=NAMES, taken_at=NOW)
    body = recoverer.recreated(stuck(annotations), names=NAMES)
    outcome = mutation.decide(operation="CREATE", namespace="team", pod=body, cluster=cluster, config=CONFIG, now=NOW,
                              controller_seen_at=NOW - 1)
    admitted = jsonpatch.apply_patch(body, outcome.patch)
    assert outcome.skipped is None, outcome.skipped
    assert (NAMES.gate in [g["name"] for g in admitted["spec"].get("schedulingGates") or ()]) is gated
    assert "gang team/pair of 2" in outcome.record


def test_the_old_recreation_kept_the_decision_and_the_webhook_skipped_the_member() -> None:
    """The no-match row: what the recoverer wrote before (only the release record and the mark dropped)."""
    body = patches.recreation(stuck({NAMES.decision: DECISION}), ours=[NAMES.release, planning.complete_mark(NAMES)])
    cluster = snapshot.build(nodes=[], pods=[], names=NAMES, taken_at=NOW)
    outcome = mutation.decide(operation="CREATE", namespace="team", pod=body, cluster=cluster, config=CONFIG, now=NOW)
    assert outcome.skipped == "already mutated (decision record present)" and outcome.patch == []
