"""Pin recovery (descheduler/release/recovery.py): which pinned pods are stuck, why, and what recovers them.

One row per documented rule: a match, a no-match, a boundary; each asserts the decision and its reason.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import settings, snapshot
from descheduler.release import patches, recovery
from tests import builders

NAMES = settings.Names()
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
C, H = recovery.Cause, recovery.How


def at(seconds_before: float) -> str:
    return datetime.datetime.fromtimestamp(NOW - seconds_before, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pinned(
    name: str,
    *,
    node: str = "n1",
    released: float | None = 10,  # seconds before NOW; None: no time in the record
    record: bool = True,
    unschedulable: bool = False,
    owner: tuple[str, str] | None = ("ReplicaSet", "rs"),
    gang: tuple[str, int] | None = None,
    bound: bool = False,
    gated: bool = False,
    deleting: bool = False,
    created: str = "2026-11-21T11:00:00Z",
    nominated: str | None = None,
    text: str | None = None,  # the release record's text; default: placed on its node
    phase: str | None = None,
    condition: tuple[str, str] | None = None,  # PodScheduled's (status, reason) other than False, Unschedulable
) -> dict[str, Any]:
    labels = {NAMES.gang_name: gang[0], NAMES.gang_size: str(gang[1])} if gang else {}
    annotations = {}
    if record:
        text = text or f"placed on {node}: why"
        annotations[NAMES.release] = f"{at(released)} {text}" if released is not None else text

    def mutate(pod: dict[str, Any]) -> None:
        spec, meta = pod["spec"], pod["metadata"]
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [patches.pin_requirement([node])]}]}}}
        meta["uid"] = f"uid-{name}"
        if owner:
            meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True,
                                        "apiVersion": "apps/v1", "uid": "o-1"}]
        if gated:
            spec["schedulingGates"] = [{"name": NAMES.gate}]
        if deleting:
            meta["deletionTimestamp"] = at(1)
        if nominated:
            pod["status"]["nominatedNodeName"] = nominated
        if condition:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": condition[0], "reason": condition[1]}]
        if unschedulable:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/2 nodes are available: 1 node(s) didn't satisfy plugin(s) "
                                                       "[NodeAffinity]"}]

    return builders.pod(name, namespace="team", gpus=4, node=node if bound else None,
                        phase=phase or ("Running" if bound else "Pending"), labels=labels, annotations=annotations,
                        created=created, mutate=mutate)


N1 = builders.gpu_node("n1", gpus=8)
N2 = builders.gpu_node("n2", gpus=8)
CORDONED = builders.gpu_node("n1", gpus=8, mutate=lambda n: n["spec"].update(unschedulable=True))


def assess(nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]], *,
           jobs: Mapping[str, recovery.JobFacts] | None = None, deadline: float = 60) -> dict[str, recovery.Recovery]:
    config = settings.Settings(descheduler=settings.Descheduler(gangs=settings.Gangs(pin_deadline_seconds=deadline)))
    cluster = snapshot.build(nodes=nodes, pods=pods, names=NAMES, taken_at=NOW)
    return {r.unit: r for r in recovery.assess(cluster, config=config, now=NOW, jobs=jobs or {})}


# --- when a pin is stuck -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "pod", "want", "says"),
    [
        pytest.param([N2], pinned("p"), C.NODE_GONE, "its node n1 is gone", id="node-gone/match"),
        pytest.param([N1], pinned("p"), None, "", id="node-there-within-deadline/no-match"),
        pytest.param([CORDONED], pinned("p"), C.NODE_CORDONED, "its node n1 is cordoned",
                     id="node-cordoned-at-once/boundary"),
        pytest.param([N1], pinned("p", released=61, unschedulable=True), C.UNSCHEDULABLE,
                     "Unschedulable more than 60s after its release", id="unschedulable-past-deadline/match"),
        pytest.param([N1], pinned("p", released=30, unschedulable=True), None, "",
                     id="unschedulable-within-deadline/no-match"),
        pytest.param([N1], pinned("p", released=60, unschedulable=True), None, "",
                     id="unschedulable-exactly-at-deadline/boundary"),
        pytest.param([N1], pinned("p", released=600), None, "", id="past-deadline-but-not-reported-unschedulable"),
        pytest.param([N1], pinned("p", released=600, condition=("False", "SchedulingGated")), None, "",
                     id="past-deadline-still-schedulinggated-not-tried-yet"),
        pytest.param([N1], pinned("p", released=600, condition=("True", "Unschedulable")), None, "",
                     id="past-deadline-a-condition-not-false-is-no-report"),
        pytest.param([N1], pinned("p", released=None, unschedulable=True, created=at(61)), C.UNSCHEDULABLE,
                     "Unschedulable more than 60s", id="record-without-time-counts-from-creation"),
        pytest.param([N2], pinned("p", record=False), None, "", id="not-released-by-us-never-touched"),
        pytest.param([N2], pinned("p", gated=True), None, "", id="still-gated-not-released"),
        pytest.param([N2], pinned("p", bound=True), None, "", id="bound-is-done"),
        pytest.param([N2], pinned("p", deleting=True), None, "", id="already-leaving"),
    ],
)
def test_when_a_pin_is_stuck(nodes: list[dict[str, Any]], pod: dict[str, Any], want: recovery.Cause | None,
                             says: str) -> None:
    found = assess(nodes, [pod])
    if want is None:
        assert found == {}
        return
    [item] = found.values()
    assert (item.unit, item.cause, item.how) == ("team/p", want, H.EVICT)
    assert says in item.message and "recovered: team/p: its ReplicaSet rs re-creates it" in item.message


def bound_on(node: str, name: str = "other", *, leaving: float | None = None) -> dict[str, Any]:
    """A lower-priority 4-GPU pod bound to `node`; `leaving`: kube-scheduler's preemption is deleting it, its deletion
    time (the end of its grace period) that many seconds before NOW (negative: still to come)."""
    def mutate(p: dict[str, Any]) -> None:
        if leaving is not None:
            p["metadata"]["deletionTimestamp"] = at(leaving)
    return builders.pod(name, namespace="other", gpus=4, node=node, phase="Running", mutate=mutate)


def terminating_on(node: str) -> dict[str, Any]:
    """A lower-priority pod bound to `node` that kube-scheduler's preemption is deleting."""
    return bound_on(node, "victim", leaving=5)


W = recovery.Wait
NOMINATED_LATE = "Unschedulable more than 60s after its release"


def nominated(released: float, node: str | None = "n1", **kw: Any) -> dict[str, Any]:
    """Pinned to n1, reported Unschedulable, released `released` seconds before NOW, nominated to `node`."""
    return pinned("p", released=released, unschedulable=True, nominated=node, **kw)


@pytest.mark.parametrize(
    ("pod", "others", "want", "says", "until"),
    [
        pytest.param(nominated(600), [terminating_on("n1")], W.VICTIMS_LEAVING,
                     "nominated it to n1, where it preempts: other/victim terminating; waited on until 360s past "
                     "their deletion time", NOW - 5 + 360, id="victims-leaving-waited-on/match"),
        pytest.param(nominated(600), [bound_on("n1", leaving=360)], W.VICTIMS_LEAVING, "other/other terminating",
                     NOW, id="victims-leaving-exactly-at-bound/boundary"),
        pytest.param(nominated(600), [bound_on("n1", leaving=361)], C.NOMINATED_STALLED,
                     NOMINATED_LATE + "; nominated to n1, where other/other still terminating more than 360s past "
                     "their deletion time", None, id="victims-leaving-past-bound/no-match"),
        pytest.param(nominated(600), [bound_on("n1", leaving=-3600)], W.VICTIMS_LEAVING, "other/other terminating",
                     NOW + 3600 + 360, id="victim-with-a-long-grace-period-still-counts"),
        pytest.param(nominated(300), [], W.RETRY_DUE,
                     "nominated it to n1, where no pod is terminating and it fits now: its retry is due; waited on "
                     "until 360s after its release", NOW - 300 + 360, id="victims-gone-room-free-waited-on/match"),
        pytest.param(nominated(360), [bound_on("n1")], W.RETRY_DUE, "its retry is due", NOW,
                     id="victims-gone-room-free-exactly-at-bound-with-another-pod-there/boundary"),
        pytest.param(nominated(361), [], C.NOMINATED_STALLED,
                     NOMINATED_LATE + "; nominated to n1, where it fits, yet not bound 360s after its release", None,
                     id="victims-gone-room-free-past-bound/no-match"),
        pytest.param(nominated(300), [bound_on("n1", "a"), bound_on("n1", "b")], C.UNSCHEDULABLE,
                     NOMINATED_LATE + " (nominated to n1, no room for it there now: needs 4 GPU, 0 free)", None,
                     id="nominated-but-another-pod-took-the-room"),
        pytest.param(nominated(300, "n2"), [terminating_on("n1")], C.UNSCHEDULABLE,
                     NOMINATED_LATE + " (nominated to n2 instead)", None, id="nominated-to-another-node-than-its-pin"),
        pytest.param(nominated(300, None), [terminating_on("n1")], C.UNSCHEDULABLE, NOMINATED_LATE + "; recovered",
                     None, id="nomination-cleared-is-stuck-as-before"),
        pytest.param(nominated(300, deleting=True), [], None, "", None, id="pod-deleted-neither-stuck-nor-waited-on"),
        pytest.param(nominated(30), [], None, "", None, id="within-the-pin-deadline-no-wait-to-tell"),
    ],
)
def test_a_pin_kube_scheduler_nominated_to_its_node_is_waited_on_each_wait_bounded(
    pod: dict[str, Any], others: list[dict[str, Any]], want: recovery.Cause | recovery.Wait | None, says: str,
    until: float | None,
) -> None:
    config = settings.Settings()  # the default deadlines: pin 60 s, nominated retry 360 s
    cluster = snapshot.build(nodes=[N1, N2], pods=[pod, *others], names=NAMES, taken_at=NOW)
    found = {r.unit: r for r in recovery.assess(cluster, config=config, now=NOW)}
    waits = recovery.waiting(cluster, config=config, now=NOW)
    if isinstance(want, recovery.Wait):
        assert found == {}
        [wait] = waits
        assert (wait.key, wait.node, wait.wait, wait.until) == ("team/p", "n1", want, until) and says in wait.why, (
            wait.why)
        return
    assert waits == ()
    if want is None:
        assert found == {}
        return
    assert [(r.unit, r.cause) for r in found.values()] == [("team/p", want)]
    assert f"pinned to n1, not bound: kube-scheduler reports it {says}" in found["team/p"].message, (
        found["team/p"].message)


@pytest.mark.parametrize(
    ("released", "want", "until"),
    [
        pytest.param(300, W.VICTIMS_LEAVING, NOW + 60, id="within-retry-of-its-release/match"),
        pytest.param(361, C.NOMINATED_STALLED, None, id="past-retry-of-its-release/no-match"),
    ],
)
def test_victims_whose_deletion_time_cannot_be_read_count_from_the_release(
    released: float, want: recovery.Wait | recovery.Cause, until: float | None,
) -> None:
    victims = [bound_on("n1", "a", leaving=5), bound_on("n1", "b", leaving=5)]
    for victim in victims:
        victim["metadata"]["deletionTimestamp"] = "soon"
    cluster = snapshot.build(nodes=[N1], pods=[nominated(released), *victims], names=NAMES, taken_at=NOW)
    config = settings.Settings()
    waits = recovery.waiting(cluster, config=config, now=NOW)
    if isinstance(want, recovery.Wait):
        [wait] = waits
        assert (wait.wait, wait.until) == (want, until) and "other/a, other/b terminating" in wait.why, wait.why
    else:
        [item] = recovery.assess(cluster, config=config, now=NOW)
        assert waits == () and item.cause is want and "where other/a, other/b still terminating" in item.message


@pytest.mark.parametrize(
    ("indices", "want"),
    [
        pytest.param({0: "other/a", 1: "other/a", 4: "other/b", 5: "other/b"}, W.RETRY_DUE,
                     id="free-gpus-spread-over-nvlink-domains-still-fit/match"),
        pytest.param({0: "other/a", 1: "other/a", 2: "other/b", 3: "other/b", 4: "other/c", 5: "other/c"},
                     C.UNSCHEDULABLE, id="too-few-free-gpus/no-match"),
    ],
)
def test_room_is_what_kube_scheduler_counts_not_nvlink_domains(indices: dict[int, str], want: object) -> None:
    """kube-scheduler does not place by NVLink domain: 4 free GPUs in two domains are room for a 4-GPU pod."""
    node = builders.gpu_node("n1", gpus=8, domains=[range(4), range(4, 8)])
    others = [builders.pod(name, namespace="other", gpus=2, node="n1", phase="Running")
              for name in sorted({k.partition("/")[2] for k in indices.values()})]
    cluster = snapshot.build(nodes=[node], pods=[nominated(300), *others], names=NAMES, taken_at=NOW,
                             occupancy={"n1": indices})
    config = settings.Settings()
    waits = recovery.waiting(cluster, config=config, now=NOW)
    found = recovery.assess(cluster, config=config, now=NOW)
    assert ([w.wait for w in waits] == [want]) if isinstance(want, recovery.Wait) else (
        waits == () and [r.cause for r in found] == [want] and "no room for it there now" in found[0].message)


def test_a_gang_with_a_member_waited_on_and_one_bound_is_left_until_the_bound_then_taken_back_whole() -> None:
    """The preemption race of docs/operations.md: one member bound, the other nominated to its node where it fits;
    within the bound nothing is taken (the bound member keeps running), past it the whole gang comes back."""
    gang = "gang team/g of 2 placed on n1: why"
    pods = [pinned(f"g-{i}", node="n1", gang=("g", 2), text=gang, released=400, bound=i == 1,
                   unschedulable=i == 0, nominated="n1" if i == 0 else None) for i in range(2)]
    config = settings.Settings()
    within = snapshot.build(nodes=[N1], pods=pods, names=NAMES, taken_at=NOW - 200)
    assert recovery.assess(within, config=config, now=NOW - 200) == ()
    assert [(w.key, w.wait) for w in recovery.waiting(within, config=config, now=NOW - 200)] == [
        ("team/g-0", W.RETRY_DUE)]
    past = snapshot.build(nodes=[N1], pods=pods, names=NAMES, taken_at=NOW)
    [item] = recovery.assess(past, config=config, now=NOW)
    assert (item.unit, item.cause) == ("team/g", C.NOMINATED_STALLED)
    assert [(p.key, p.cause, p.bound) for p in item.pods] == [
        ("team/g-0", C.NOMINATED_STALLED, False), ("team/g-1", None, True)]
    assert "recovered with the 1 member(s) bound from the same release" in item.message


# --- how it is recovered, by what re-creates it ------------------------------------------------------------------

GONE = [N2]  # every pin below is to n1: gone


def job(name: str = "j") -> tuple[str, str]:
    return ("Job", name)


@pytest.mark.parametrize(
    ("pods", "jobs", "how", "says"),
    [
        pytest.param([pinned("p", owner=("ReplicaSet", "rs"))], {}, H.EVICT, "its ReplicaSet rs re-creates it",
                     id="replicaset-evicted"),
        pytest.param([pinned("p", owner=("StatefulSet", "db"))], {}, H.EVICT, "its StatefulSet db re-creates it",
                     id="statefulset-evicted"),
        pytest.param([pinned("p", owner=None)], {}, H.RECREATE, "a bare pod: created again as it was, without our pin",
                     id="bare-pod-recreated"),
        pytest.param([pinned("p", owner=("Workflow", "wf"))], {}, H.REPORT,
                     "left as it is: its owner Workflow wf may count a deleted pod as a failure. To recover, delete "
                     "the pod (team/p) and create it again", id="unknown-owner-reported-with-what-to-do"),
        pytest.param([pinned("p", owner=job())], {"team/j": recovery.JobFacts(1, False)}, H.EVICT,
                     "its Job j re-creates it (1 retries left, 1 used)", id="job-with-a-retry-to-spare/match"),
        pytest.param([pinned("p", owner=job())], {"team/j": recovery.JobFacts(0, False)}, H.REPORT,
                     "its Job j has 0 retries left: deleting 1 pod(s) would fail it",
                     id="job-without-retries/no-match"),
        pytest.param([pinned(f"p{i}", owner=job(), gang=("g", 2)) for i in range(2)],
                     {"team/j": recovery.JobFacts(1, False)}, H.REPORT, "its Job j has 1 retries left: deleting 2",
                     id="job-with-fewer-retries-than-stuck-pods/boundary"),
        pytest.param([pinned("p", owner=job())], {"team/j": recovery.JobFacts(0, True)}, H.EVICT,
                     "podFailurePolicy ignores DisruptionTarget)", id="job-ignoring-disruption-evicted"),
        pytest.param([pinned("p", owner=job())], {}, H.REPORT, "its Job j could not be read",
                     id="job-not-read-is-never-evicted"),
    ],
)
def test_how_it_is_recovered(pods: list[dict[str, Any]], jobs: dict[str, recovery.JobFacts], how: recovery.How,
                             says: str) -> None:
    [item] = assess(GONE, pods, jobs=jobs).values()
    assert item.how is how and item.acting is (how is not H.REPORT)
    assert says in item.message, item.message
    if item.acting:
        assert item.message.endswith(f"recovered: team/p: {item.pods[0].why}") and item.pods[0].why.endswith(says)


# --- a gang is recovered as a whole -------------------------------------------------------------------------------


GANG = "gang team/g of 3 placed on n1, n2: why"  # one release record text for all the members it un-gates


def member(i: int, *, bound: bool = True, node: str = "n2", **kw: Any) -> dict[str, Any]:
    return pinned(f"g-{i}", node=node, gang=("g", 3), bound=bound, text=kw.pop("text", GANG), **kw)


STUCK_G0 = member(0, bound=False, node="n1")  # pinned to n1, gone


@pytest.mark.parametrize(
    ("pods", "unit", "says"),
    [
        pytest.param([STUCK_G0, member(1), member(2)],
                     [("team/g-0", C.NODE_GONE, False), ("team/g-1", None, True), ("team/g-2", None, True)],
                     "recovered with the 2 member(s) bound from the same release (the gang never ran whole)",
                     id="bound-from-the-same-release-recovered-with-it/match"),
        pytest.param([STUCK_G0, member(1, released=3600), member(2, released=3600)],
                     [("team/g-0", C.NODE_GONE, False)], "; recovered: team/g-0",
                     id="bound-from-an-earlier-release-left-running/no-match"),
        pytest.param([STUCK_G0, member(1, text="gang team/g of 3 placed on n2: an earlier why"), member(2)],
                     [("team/g-0", C.NODE_GONE, False), ("team/g-2", None, True)], "the 1 member(s) bound",
                     id="same-second-other-release-text-left-running/boundary"),
        pytest.param([STUCK_G0, member(1, deleting=True), member(2)],
                     [("team/g-0", C.NODE_GONE, False), ("team/g-2", None, True)], "the 1 member(s) bound",
                     id="same-release-member-being-deleted-not-taken-again/boundary"),
        pytest.param([STUCK_G0, member(1, phase="Succeeded"), member(2)],
                     [("team/g-0", C.NODE_GONE, False), ("team/g-2", None, True)], "the 1 member(s) bound",
                     id="same-release-member-finished-not-taken/boundary"),
        pytest.param([member(0, bound=False, node="n1", released=None), member(1, released=None)],
                     [("team/g-0", C.NODE_GONE, False)], "; recovered: team/g-0",
                     id="records-without-a-time-tie-nothing/boundary"),
        pytest.param([STUCK_G0, member(1, bound=False), member(2, released=3600)],
                     [("team/g-0", C.NODE_GONE, False), ("team/g-1", None, False)],
                     "recovered with the 1 other unbound member(s): ",
                     id="unbound-pinned-members-always-come-bound-earlier-stay"),
    ],
)
def test_a_stuck_members_unit_is_its_gangs_pinned_members_and_those_bound_from_their_release(
    pods: list[dict[str, Any]], unit: list[tuple[str, recovery.Cause | None, bool]], says: str,
) -> None:
    [item] = assess([N2], pods).values()
    assert item.unit == "team/g" and item.how is H.EVICT
    assert [(p.key, p.cause, p.bound) for p in item.pods] == unit
    assert item.message.startswith("gang team/g: team/g-0 pinned to n1, not bound: its node n1 is gone; ")
    assert says in item.message, item.message


def test_every_stuck_unit_is_found_past_healthy_ones_and_its_pods_carry_uid_and_node() -> None:
    """A healthy pinned unit sorted first does not end the search; a bound member's node is where it runs and every
    pod carries its uid (the shell's eviction and re-creation preconditions)."""
    healthy = pinned("a-0", node="n2", gang=("a", 1))
    [item] = assess([N2], [healthy, STUCK_G0, member(1), member(2)]).values()
    assert item.unit == "team/g"
    assert [(p.key, p.uid, p.node) for p in item.pods] == [
        ("team/g-0", "uid-g-0", "n1"), ("team/g-1", "uid-g-1", "n2"), ("team/g-2", "uid-g-2", "n2")]


def test_a_single_pod_unit_never_ties_in_bound_pods_of_the_same_text() -> None:
    pods = [pinned("p", node="n1"), pinned("q", node="n2", bound=True, text="placed on n1: why")]
    assert [p.key for p in assess([N2], pods)["team/p"].pods] == ["team/p"]


@pytest.mark.parametrize(
    ("pods", "jobs", "how", "hows"),
    [
        pytest.param([STUCK_G0, member(1, owner=("ReplicaSet", "rs")), member(2, owner=None)], {}, H.EVICT,
                     [H.EVICT, H.EVICT, H.RECREATE], id="bound-replicaset-member-evicted-bound-bare-recreated"),
        pytest.param([STUCK_G0, member(1), member(2, owner=("Workflow", "wf"))], {}, H.REPORT,
                     [H.EVICT, H.EVICT, H.REPORT], id="one-bound-member-to-report-reports-the-whole-unit"),
        pytest.param([member(i, bound=i > 0, node="n1" if i == 0 else "n2", owner=job()) for i in range(3)],
                     {"team/j": recovery.JobFacts(2, False)}, H.REPORT, [H.REPORT] * 3,
                     id="bound-members-count-against-the-jobs-retries/boundary"),
    ],
)
def test_bound_members_of_the_unit_follow_the_owner_rules(
    pods: list[dict[str, Any]], jobs: dict[str, recovery.JobFacts], how: recovery.How, hows: list[recovery.How],
) -> None:
    [item] = assess([N2], pods, jobs=jobs).values()
    assert item.how is how and [p.how for p in item.pods] == hows
    if how is H.REPORT:
        assert "To recover, delete the pods (team/g-0, team/g-1, team/g-2) and create them again" in item.message


def test_bound_members_to_evict_come_first() -> None:
    pods = [STUCK_G0, member(1, owner=None), member(2, owner=("ReplicaSet", "rs"))]
    [item] = assess([N2], pods).values()
    assert [(p.key, p.bound, p.how) for p in item.in_order] == [
        ("team/g-2", True, H.EVICT), ("team/g-1", True, H.RECREATE), ("team/g-0", False, H.EVICT)]


def test_a_gang_with_one_member_that_would_cost_is_reported_whole() -> None:
    pods = [pinned("g-0", gang=("g", 2)), pinned("g-1", gang=("g", 2), owner=("Workflow", "wf"))]
    [item] = assess(GONE, pods).values()
    assert item.how is H.REPORT and not item.acting
    assert "To recover, delete the pods (team/g-0, team/g-1) and create them again" in item.message


def test_a_gang_of_bare_pods_is_recreated_and_mixed_owners_evict_the_owned() -> None:
    bare = [pinned(f"b-{i}", gang=("b", 2), owner=None) for i in range(2)]
    assert assess(GONE, bare)["team/b"].how is H.RECREATE
    mixed = [pinned("m-0", gang=("m", 2), owner=None), pinned("m-1", gang=("m", 2))]
    item = assess(GONE, mixed)["team/m"]
    assert item.how is H.EVICT and [p.how for p in item.pods] == [H.RECREATE, H.EVICT]


def test_healthy_gang_members_are_not_touched() -> None:
    pods = [pinned("g-0", node="n2", gang=("g", 2)), pinned("g-1", node="n2", gang=("g", 2))]
    assert assess([N2], pods) == {}


def test_jobs_to_read_are_those_of_stuck_units_only() -> None:
    """Jobs only (a stuck ReplicaSet's or bare pod's owner is never read), of units stuck by any cause (here node
    gone and Unschedulable past the deadline)."""
    pods = [pinned("a", owner=job("stuck")), pinned("b", node="n2", owner=job("fine")),
            pinned("c", node="n2", owner=job("late"), released=61, unschedulable=True),
            pinned("d", owner=("ReplicaSet", "rs")), pinned("e", owner=None)]
    config = settings.Settings()
    cluster = snapshot.build(nodes=[N2], pods=pods, names=NAMES, taken_at=NOW)
    assert recovery.jobs_to_read(cluster, config=config, now=NOW) == ("team/late", "team/stuck")


@pytest.mark.parametrize(
    ("owner", "want"),
    [
        pytest.param(("ReplicaSet", "rs"), ("ReplicaSet", "rs"), id="its-controller"),
        pytest.param(None, None, id="a-bare-pod-has-none"),
    ],
)
def test_each_recovered_pod_names_its_owner(owner: tuple[str, str] | None, want: tuple[str, str] | None) -> None:
    [item] = assess(GONE, [pinned("p", owner=owner)]).values()
    assert [p.owner for p in item.pods] == [want]


def test_a_gang_named_with_a_colon_keeps_its_whole_name() -> None:
    """Our gang name may come from an annotation, where a colon is allowed."""
    def named(name: str) -> dict[str, Any]:
        body = pinned(name, gang=None)
        body["metadata"]["annotations"].update({NAMES.gang_name: "train:v2", NAMES.gang_size: "2"})
        return body

    [item] = assess(GONE, [named("a"), named("b")]).values()
    assert item.unit == "team/train:v2" and item.message.startswith("gang team/train:v2: team/a pinned to n1")


def test_a_gang_in_a_native_podgroup_without_a_gang_policy_is_still_ours() -> None:
    """A PodGroup with no gang policy holds nothing together: the members' own gang labels make the unit."""
    def member_of(name: str) -> dict[str, Any]:
        body = pinned(name, gang=("g", 2))
        body["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        return body

    group = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "team"}, "spec": {}}
    cluster = snapshot.build(nodes=GONE, pods=[member_of("a"), member_of("b")], pod_groups=[group], names=NAMES,
                             taken_at=NOW)
    [item] = recovery.assess(cluster, config=settings.Settings(), now=NOW)
    assert item.unit == "team/g" and [p.key for p in item.pods] == ["team/a", "team/b"]


def test_a_gang_recovery_says_every_member_and_why_in_one_sentence() -> None:
    pods = [STUCK_G0, member(1, bound=False), member(2)]
    [item] = assess([N2], pods).values()
    assert item.message == (
        "gang team/g: team/g-0 pinned to n1, not bound: its node n1 is gone; recovered with the 1 other unbound "
        "member(s) and the 1 member(s) bound from the same release (the gang never ran whole): team/g-0: its "
        "ReplicaSet rs re-creates it; team/g-1: its ReplicaSet rs re-creates it; team/g-2: its ReplicaSet rs "
        "re-creates it")


# --- what a Job's spec and status say ----------------------------------------------------------------------------

IGNORE_DISRUPTION = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}


@pytest.mark.parametrize(
    ("job_body", "want"),
    [
        pytest.param({}, recovery.JobFacts(6, False), id="defaults-backoff-limit-6"),
        pytest.param({"spec": {"backoffLimit": 3}, "status": {"failed": 1}}, recovery.JobFacts(2, False),
                     id="limit-minus-failed"),
        pytest.param({"spec": {"backoffLimit": 0}}, recovery.JobFacts(0, False), id="no-retries"),
        pytest.param({"spec": {"backoffLimit": 1}, "status": {"failed": 3}}, recovery.JobFacts(0, False),
                     id="over-spent-is-zero"),
        pytest.param({"spec": {"backoffLimitPerIndex": 2, "backoffLimit": 0}}, recovery.JobFacts(2, False),
                     id="per-index-budget"),
        pytest.param({"spec": {"backoffLimit": 0, "podFailurePolicy": IGNORE_DISRUPTION}}, recovery.JobFacts(0, True),
                     id="ignores-disruption"),
        pytest.param({"spec": {"podFailurePolicy": {"rules": [{"action": "FailJob", "onPodConditions": [
            {"type": "DisruptionTarget"}]}]}}}, recovery.JobFacts(6, False), id="fails-on-disruption-not-ignoring"),
        pytest.param({"spec": {"podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
            {"type": "DisruptionTarget", "status": "False"}]}]}}}, recovery.JobFacts(6, False),
            id="ignores-only-condition-false-boundary"),
    ],
)
def test_job_facts(job_body: dict[str, Any], want: recovery.JobFacts) -> None:
    assert recovery.job_facts(job_body) == want
