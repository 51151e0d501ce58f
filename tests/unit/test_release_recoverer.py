"""What pin recovery creates a stuck bare pod again from (`recoverer.recreated`): the pod as its creator wrote it,
without our pin and our annotations, so that our webhook admits it afresh — a gang member is gated again for its
gang instead of starting alone (found by tests/e2e/test_closed_loop_random_e2e.py, seed 20261128: the webhook
skipped the re-created members as "already mutated" and the gang ran part-way)."""

from __future__ import annotations

from typing import Any

import jsonpatch
import prometheus_client
import pytest

from admission import mutation
from common import events, kube, settings, snapshot
from descheduler.release import patches, planning, recoverer, recovery
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


# --- a unit with running members: evictions a PodDisruptionBudget refuses never leave it half done ---------------


class FakeApi:
    """kube.request as the API server answers it: evictions of the pods in `refuse` fail with 429 (a budget allows
    no disruption), for real or, when `dry_too`, in dry run as well."""

    def __init__(self, refuse: set[str], *, dry_too: bool) -> None:
        self.refuse, self.dry_too = refuse, dry_too
        self.calls: list[tuple[str, str]] = []  # (method and dry run, pod name or path) of pod calls

    async def request(self, api: object, method: str, path: str, *, timeout_seconds: float,
                      query: dict[str, str] | None = None, body: object = None,
                      content_type: str = "application/json") -> dict[str, Any]:
        dry = bool(query and query.get("dryRun"))
        if path.endswith("/eviction"):
            name = path.split("/")[-2]
            self.calls.append(("evict-dry" if dry else "evict", name))
            if name in self.refuse and (self.dry_too or not dry):
                raise kube.ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        elif "/pods/" in path:
            self.calls.append((method, path.split("/")[-1]))
        return {"items": []}


def gang_cluster() -> snapshot.Snapshot:
    """g-0 pinned to a node that is gone; g-1 and g-2 bound from the same release (ReplicaSet-owned)."""
    record = {NAMES.release: "2026-11-26T12:00:00Z gang team/g of 3 placed on n1, n2"}
    labels = {NAMES.gang_name: "g", NAMES.gang_size: "3"}

    def owned(pod: dict[str, Any]) -> None:
        pod["metadata"].update(uid=f"u-{pod['metadata']['name']}", ownerReferences=[
            {"kind": "ReplicaSet", "name": "rs", "controller": True, "apiVersion": "apps/v1", "uid": "o"}])

    def pin(pod: dict[str, Any]) -> None:
        owned(pod)
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [patches.pin_requirement(["n1"])]}]}}}

    pods = [builders.pod("g-0", namespace="team", gpus=2, labels=labels, annotations=record, mutate=pin),
            *(builders.pod(f"g-{i}", namespace="team", gpus=2, labels=labels, annotations=record, node="n2",
                           phase="Running", mutate=owned) for i in (1, 2))]
    return snapshot.build(nodes=[builders.gpu_node("n2", gpus=8)], pods=pods, names=NAMES, taken_at=NOW)


@pytest.mark.parametrize(
    ("refuse", "dry_too", "calls", "told"),
    [
        pytest.param(set(), False, [("evict-dry", "g-1"), ("evict-dry", "g-2"), ("evict", "g-1"), ("evict", "g-2"),
                                    ("evict", "g-0")], {recovery.RECOVERED},
                     id="running-members-evicted-first-then-the-pinned-one/match"),
        pytest.param({"g-2"}, True, [("evict-dry", "g-1"), ("evict-dry", "g-2")], {recovery.STUCK},
                     id="a-refusal-in-dry-run-reports-the-unit-and-touches-nothing/no-match"),
        pytest.param({"g-2"}, False, [("evict-dry", "g-1"), ("evict-dry", "g-2"), ("evict", "g-1"), ("evict", "g-2")],
                     {recovery.RECOVERED, recovery.STUCK},
                     id="a-refusal-no-dry-run-foresaw-stops-before-the-pinned-pod/boundary"),
    ],
)
async def test_a_refused_eviction_never_leaves_the_pinned_pods_half_done(
    monkeypatch: pytest.MonkeyPatch, refuse: set[str], dry_too: bool, calls: list[tuple[str, str]], told: set[str],
) -> None:
    fake = FakeApi(refuse, dry_too=dry_too)
    said: list[tuple[str, str, str]] = []

    async def post(api: object, *, regarding: events.ObjectRef, reason: str, message: str, **_: object) -> bool:
        said.append((regarding.name, reason, message))
        return True

    monkeypatch.setattr(kube, "request", fake.request)
    monkeypatch.setattr(events, "post", post)
    registry = prometheus_client.CollectorRegistry()
    worker = recoverer.Recoverer(config=CONFIG, api=object(), metrics=recoverer.Metrics(registry))  # type: ignore[arg-type]
    await worker.run(gang_cluster(), now=NOW)
    assert fake.calls == calls
    assert {reason for _, reason, _ in said} == told
    how = "report" if recovery.STUCK in told else "evict"
    assert registry.get_sample_value("gpu_steward_pin_recoveries_total", {"cause": "node-gone", "how": how}) == 1
    if recovery.STUCK in told:
        [stuck] = {m for _, reason, m in said if reason == recovery.STUCK}
        assert "not recovered, retried on each pass: team/g-2: eviction refused" in stuck, stuck


# --- a pin past its deadline that is waited on is told once, and counted ------------------------------------------


def nominated_cluster(*, nominated: str | None, now: float) -> snapshot.Snapshot:
    """pair-0 released 100 s before `now`, Unschedulable, pinned to n1 (8 GPUs, nothing else there)."""
    body = stuck({NAMES.release: "1970-01-01T00:15:00Z gang team/pair of 2 placed on n1"})  # released at 900
    body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    if nominated:
        body["status"]["nominatedNodeName"] = nominated
    return snapshot.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[body], names=NAMES, taken_at=now)


@pytest.mark.parametrize(
    ("nominated", "events_told", "waiting"),
    [
        pytest.param("n1", 1, 1.0, id="nominated-with-room-told-once-and-counted/match"),
        pytest.param(None, 0, 0.0, id="not-nominated-is-recovered-not-waited-on/no-match"),
    ],
)
async def test_a_pin_waited_on_is_one_normal_event_and_a_gauge(
    monkeypatch: pytest.MonkeyPatch, nominated: str | None, events_told: int, waiting: float,
) -> None:
    said: list[tuple[str, str, str, str]] = []

    async def post(api: object, *, regarding: events.ObjectRef, type: str, reason: str, message: str,
                   **_: object) -> bool:
        said.append((regarding.name, type, reason, message))
        return True

    monkeypatch.setattr(kube, "request", FakeApi(set(), dry_too=False).request)
    monkeypatch.setattr(events, "post", post)
    registry = prometheus_client.CollectorRegistry()
    worker = recoverer.Recoverer(config=CONFIG, api=object(), metrics=recoverer.Metrics(registry))  # type: ignore[arg-type]
    for now in (NOW, NOW + 10):  # the second pass says nothing new
        await worker.run(nominated_cluster(nominated=nominated, now=now), now=now)
    told = [s for s in said if s[2] == recovery.WAITING]
    assert len(told) == events_told
    if told:
        assert told[0][:3] == ("pair-0", "Normal", recovery.WAITING)
        assert told[0][3].startswith("pinned to n1, not bound past its deadline: kube-scheduler nominated it to n1, "
                                     "where no pod is terminating and it fits now"), told[0][3]
    else:
        assert {s[2] for s in said} == {recovery.RECOVERED}  # recovered (on each pass: the fake pod stays)
    assert registry.get_sample_value("gpu_steward_pins_waiting", {"wait": "retry-due"}) == waiting
    assert registry.get_sample_value("gpu_steward_pins_waiting", {"wait": "victims-leaving"}) == 0
