"""The observation pass (descheduler/release/outcomes.py): what releases came to, and why, for every rule."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import settings, snapshot, snapshot_build
from descheduler.release import outcomes
from tests import builders

NAMES = settings.Names()
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
BOUND = 120.0
RECENT = "2026-11-21T11:59:00Z"  # 60 s before NOW: within the bound
AT_BOUND = "2026-11-21T11:58:00Z"  # exactly the bound before NOW
PAST = "2026-11-21T11:57:59Z"  # one second past the bound
SPLIT_8 = [range(4), range(4, 8)]
NODES = [builders.gpu_node(n, gpus=8, domains=SPLIT_8) for n in ("a", "b", "c")]
C = outcomes.Cause


def config() -> settings.Settings:
    return settings.Settings(descheduler=settings.Descheduler(gangs=settings.Gangs(bind_bound_seconds=BOUND)))


def released(name: str, *, planned: str | None = "a", node: str | None = None, at: str | None = RECENT,
             one_domain: bool = True, gpus: int = 4, gang: str | None = None, gated: bool = False,
             phase: str | None = None, deleting: bool = False, nominated: str | None = None,
             pin: str | None = None, raw_record: str | None = None, volume_claim: bool = False) -> dict[str, Any]:
    """A pod our release un-gated at `at` (None: a record without a time), nominated to `planned`."""
    if raw_record is not None:
        record = raw_record
    elif at is None:
        record = "placed somewhere"
    else:
        record = outcomes.record(at=at, node=planned, one_domain=one_domain, why="placed")

    def mutate(pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        if gated:
            spec["schedulingGates"] = [{"name": NAMES.gate}]
        if deleting:
            pod["metadata"]["deletionTimestamp"] = RECENT
        if nominated:
            pod["status"]["nominatedNodeName"] = nominated
        if pin:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": [pin]}]}]}}}
        if volume_claim:
            spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]

    labels = {NAMES.gang_name: gang, NAMES.gang_size: "2"} if gang else None
    return builders.pod(name, namespace="team", gpus=gpus, node=node,
                        phase=phase or ("Running" if node else "Pending"), labels=labels,
                        annotations={NAMES.release: record},
                        created=RECENT if at is not None else "2026-11-21T10:00:00Z", mutate=mutate)


def no_creation(pod: dict[str, Any]) -> dict[str, Any]:
    del pod["metadata"]["creationTimestamp"]
    return pod


def other(name: str, *, node: str | None) -> dict[str, Any]:
    """A pod no release of ours placed (no record)."""
    return builders.pod(name, namespace="team", gpus=4, node=node, phase="Running" if node else "Pending",
                        created="2026-11-21T10:00:00Z")


@dataclasses.dataclass(frozen=True)
class Want:
    cause: outcomes.Cause
    says: str  # a fragment of the message
    gang: str | None = None
    whole: bool = False  # `says` is the whole message


def assess(pods: Sequence[dict[str, Any]], occupancy: snapshot.Occupancy | None = None) -> dict[str, outcomes.Outcome]:
    cluster = snapshot_build.build(nodes=NODES, pods=pods, occupancy=occupancy, names=NAMES, taken_at=NOW)
    found = outcomes.assess(cluster, config=config(), now=NOW)
    assert len({o.key for o in found}) == len(found), "one outcome per pod"
    return {o.key.split("/")[1]: o for o in found}


def check(found: Mapping[str, outcomes.Outcome], expected: Mapping[str, Want]) -> None:
    assert sorted(found) == sorted(expected)
    for name, want in expected.items():
        got = found[name]
        assert (got.cause, got.gang, got.uid) == (want.cause, want.gang, f"uid-{name}"), got
        assert got.message == want.says if want.whole else want.says in got.message, got.message
        assert got.event == outcomes.EVENTS[want.cause]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        # --- adversarial rows first ---
        pytest.param([released("p", planned="a", node="b", nominated=None)],
                     {"p": Want(C.PLACED_ELSEWHERE, "nominated to a at release, bound to b (the node no longer "
                                                    "fitted it when kube-scheduler tried it)")},
                     id="node-filled-or-higher-priority-racer-took-it/bound-elsewhere"),
        pytest.param([released("p", planned="gone", node="b")],
                     {"p": Want(C.PLACED_ELSEWHERE, "nominated to gone at release, bound to b")},
                     id="node-deleted-after-nomination/bound-elsewhere"),
        pytest.param([released("p", planned="gone", node=None, at=PAST)],
                     {"p": Want(C.NOT_BOUND, "nominated to gone, not bound 121s after its release (bound: 120s)")},
                     id="node-deleted-after-nomination/not-bound-past-the-bound"),
        pytest.param([released("p", planned=None, node="b", nominated=None)], {},
                     id="someone-elses-nomination-kept/no-plan-of-ours-to-judge"),
        pytest.param([released("p", planned="a", node=None, at=PAST, nominated="c")],
                     {"p": Want(C.NOT_BOUND, "nominated to a, not bound")},
                     id="preemption-renominated-it-elsewhere/still-late"),
        pytest.param([released("p", planned=None, node=None, at=None, pin="a",
                                raw_record="2026-11-21T11:50:00Z placed on a: NVLink score 90")],
                     {"p": Want(C.NOT_BOUND, "an older release pinned it to a (a required metadata.name term): "
                                             "gpu-steward no longer deletes or re-creates pods")},
                     id="upgrade/pinned-by-an-older-release-still-pending/reported-never-deleted"),
        pytest.param([released("g-0", gang="g", node="a", at=PAST),
                      released("g-1", gang="g", node=None, at=PAST, volume_claim=True, planned=None)],
                     {"g-0": Want(C.GANG_NOT_BOUND, "gang team/g: 1 of 2 released members not bound within 120s "
                                                    "(team/g-1)", "team/g"),
                      "g-1": Want(C.GANG_NOT_BOUND, "the others hold their GPUs meanwhile", "team/g")},
                     id="gang-member-with-a-volume-claim-unbound/every-member-told"),
        pytest.param([released("g-0", gang="g", node="a", at=RECENT),
                      released("g-1", gang="g", node=None, at=RECENT, volume_claim=True, planned=None)], {},
                     id="gang-member-with-a-volume-claim-unbound/within-the-bound"),
        pytest.param([released("g-0", gang="g", planned="a", node="a"), released("g-1", gang="g", planned="a",
                                                                                   node="b")],
                     {"g-0": Want(C.GANG_SPREAD, "gang team/g: nominated to 1 node(s) (a), bound on 2 (a, b)",
                                  "team/g"),
                      "g-1": Want(C.GANG_SPREAD, "bound on 2 (a, b)", "team/g")},
                     id="gang-bound-on-more-nodes-than-planned"),
        pytest.param([released("g-0", gang="g", planned="a", node="b"), released("g-1", gang="g", planned="a",
                                                                                   node="b")],
                     {"g-0": Want(C.PLACED_ELSEWHERE, "bound to b", "team/g"),
                      "g-1": Want(C.PLACED_ELSEWHERE, "bound to b", "team/g")},
                     id="gang-moved-whole-to-another-node/not-spread-each-member-elsewhere"),
        pytest.param([released("g-0", gang="g", planned="a", node="a"), released("g-1", gang="g", planned="b",
                                                                                   node="a")],
                     {"g-1": Want(C.PLACED_ELSEWHERE, "nominated to b at release, bound to a", "team/g")},
                     id="gang-on-fewer-nodes-than-planned/not-spread"),
        pytest.param([released("g-0", gang="g", planned="a", node="a"), released("g-1", gang="g", planned="a",
                                                                                   node="b"),
                      released("g-2", gang="g", planned="a", node=None, at=RECENT)],
                     {"g-0": Want(C.GANG_SPREAD, "bound on 2 (a, b)", "team/g"),
                      "g-1": Want(C.GANG_SPREAD, "bound on 2 (a, b)", "team/g")},
                     id="gang-spread-judges-only-its-bound-nominated-members"),
        # --- a cluster of everything at once: every group judged, none stops the others ---
        pytest.param([other("a-theirs", node=None), released("a-gone", node=None, at=PAST, deleting=True),
                      released("b-moved", planned="a", node="b"),
                      released("g-0", gang="g", node=None, at=PAST), released("g-1", gang="g", node=None, at=PAST),
                      released("h-0", gang="h", planned="a", node="a"),
                      released("h-1", gang="h", planned="a", node="c"),
                      released("i-0", gang="i", planned="a", node="b"), released("i-1", gang="i", planned="b",
                                                                                   node="b"),
                      released("z-late", node=None, at=PAST)],
                     {"b-moved": Want(C.PLACED_ELSEWHERE, "bound to b"),
                      "g-0": Want(C.GANG_NOT_BOUND, "gang team/g: 2 of 2 released members not bound within 120s "
                                                    "(team/g-0, team/g-1); none is bound: they wait for room "
                                                    "together",
                                  "team/g", whole=True),
                      "g-1": Want(C.GANG_NOT_BOUND, "(team/g-0, team/g-1)", "team/g"),
                      "h-0": Want(C.GANG_SPREAD, "gang team/h: nominated to 1 node(s) (a), bound on 2 (a, c)",
                                  "team/h", whole=True),
                      "h-1": Want(C.GANG_SPREAD, "(a, c)", "team/h"),
                      "i-0": Want(C.PLACED_ELSEWHERE, "nominated to a at release, bound to b", "team/i"),
                      "z-late": Want(C.NOT_BOUND, "not bound 121s")},
                     id="everything-at-once"),
        # --- what is never judged ---
        pytest.param([other("theirs", node=None)], {}, id="no-release-record/not-ours"),
        pytest.param([released("p", node=None, at=PAST, gated=True)], {}, id="still-gated/not-released"),
        pytest.param([released("p", node=None, at=PAST, deleting=True)], {}, id="being-deleted"),
        pytest.param([released("p", node="b", phase="Succeeded")], {}, id="finished"),
        # --- match / no match / boundary ---
        pytest.param([released("p", planned="a", node="a")], {}, id="bound-where-nominated/no-match"),
        pytest.param([released("p", node=None, at=RECENT)], {}, id="not-bound-within-the-bound/no-match"),
        pytest.param([released("p", node=None, at=AT_BOUND)], {}, id="not-bound-exactly-at-the-bound/boundary"),
        pytest.param([released("p", node=None, at=PAST)],
                     {"p": Want(C.NOT_BOUND, "nominated to a, not bound 121s after its release (bound: 120s)",
                                whole=True)},
                     id="not-bound-past-the-bound/match"),
        pytest.param([released("p", planned=None, node=None, at=PAST)],
                     {"p": Want(C.NOT_BOUND, "released without a nomination, not bound 121s after its release "
                                             "(bound: 120s)", whole=True)},
                     id="released-without-a-nomination-still-late"),
        pytest.param([released("p", planned="a", node=None, at=PAST, pin="a")],
                     {"p": Want(C.NOT_BOUND, "nominated to a, not bound 121s after its release (bound: 120s)",
                                whole=True)},
                     id="users-own-metadata-name-term-is-not-an-older-release-pin"),
        pytest.param([released("p", node=None, at=None)], {"p": Want(C.NOT_BOUND, "released without a nomination")},
                     id="record-without-a-time-counts-from-creation"),
        pytest.param([no_creation(released("p", node=None, at=None))], {},
                     id="no-time-and-no-creation-time/never-late"),
    ],
)
def test_outcomes(pods: list[dict[str, Any]], expected: Mapping[str, Want]) -> None:
    check(assess(pods), expected)


@pytest.mark.parametrize(
    ("observed", "one_domain", "expected"),
    [
        pytest.param({1: "team/p", 5: "team/p"}, True, {"p": Want(C.SPLIT_DOMAINS, "its GPUs 1, 5 span 2")},
                     id="observed-across-two-domains/match"),
        pytest.param({0: "team/p", 1: "team/p"}, True, {}, id="observed-in-one-domain/no-match"),
        pytest.param({1: "team/p", 5: "team/p"}, False, {}, id="planned-to-span/not-judged"),
        pytest.param(None, True, {}, id="estimated-indices/never-judged"),
    ],
)
def test_domains(observed: Mapping[int, str] | None, one_domain: bool, expected: Mapping[str, Want]) -> None:
    pod = released("p", planned="a", node="a", gpus=2, one_domain=one_domain)
    check(assess([pod], occupancy={"a": observed} if observed is not None else None), expected)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("2026-11-21T12:00:00Z planned=a domains=1 placed on a: score",
                     outcomes.Record(NOW, "a", True, "placed on a: score"), id="nominated-one-domain"),
        pytest.param("2026-11-21T12:00:00Z planned=a placed", outcomes.Record(NOW, "a", False, "placed"),
                     id="nominated-spanning"),
        pytest.param("2026-11-21T12:00:00Z no member to place", outcomes.Record(NOW, None, False,
                                                                                "no member to place"),
                     id="not-nominated"),
        pytest.param("placed on a: score 90", outcomes.Record(None, None, False, "placed on a: score 90"),
                     id="no-time"),
        pytest.param("2026-11-21T12:00:00Z domains=1 planned=a x", outcomes.Record(NOW, "a", True, "x"),
                     id="tokens-in-any-order"),
    ],
)
def test_record_is_read_back(raw: str, expected: outcomes.Record) -> None:
    assert outcomes.read(raw) == expected


def test_record_round_trips() -> None:
    raw = outcomes.record(at="2026-11-21T12:00:00Z", node="a", one_domain=True, why="placed on a")
    assert outcomes.read(raw) == outcomes.Record(NOW, "a", True, "placed on a")
    assert outcomes.record(at="2026-11-21T12:00:00Z", node=None, one_domain=True, why="x") == "2026-11-21T12:00:00Z x"
