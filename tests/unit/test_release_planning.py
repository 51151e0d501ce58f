"""The gang-release planner: decisions and their reasons, for every rule in descheduler/release/planning.py."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import dra, settings, snapshot, snapshot_build
from descheduler.release import planning
from gpu_steward import cmd_descheduler
from tests import builders

NAMES = settings.Names()
GATE = NAMES.gate
KUEUE_GATE = "kueue.x-k8s.io/admission"
MARK = planning.complete_mark(NAMES)
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
RECENT = "2026-11-21T11:59:00Z"  # a minute before NOW
LONG_AGO = "2026-11-21T10:00:00Z"  # two hours before NOW
EARLIER = "2026-11-21T11:58:20Z"  # before RECENT, within the default reservation bound (120 s)
SPLIT_8 = [range(4), range(4, 8)]  # an 8-GPU node with two NVLink domains of 4

A = planning.Action
W = planning.Waiting


def config(**gangs: Any) -> settings.Settings:
    return settings.Settings(descheduler=settings.Descheduler(gangs=settings.Gangs(**gangs)))


def member(
    name: str,
    *,
    gang: str = "train",
    size: int | str | None = 4,
    gpus: int = 1,
    gated: bool = True,
    gates: Sequence[str] = (),
    created: str = RECENT,
    node: str | None = None,
    priority: int = 10_000,
    annotations: Mapping[str, str] | None = None,
    owner: str | None = None,
    nominated: str | None = None,
    selector: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A gang member in namespace `team`; `gated` adds our gate (after `gates`, which come first)."""
    gang_labels = {NAMES.gang_name: gang, **({NAMES.gang_size: str(size)} if size is not None else {})}

    def mutate(pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        spec["priority"] = priority
        all_gates = [*gates, *([GATE] if gated else [])]
        if all_gates:
            spec["schedulingGates"] = [{"name": g} for g in all_gates]
        if owner:
            pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": owner, "controller": True}]
        if nominated:
            pod.setdefault("status", {})["nominatedNodeName"] = nominated
        if selector:
            spec["nodeSelector"] = dict(selector)

    return builders.pod(
        name, namespace="team", gpus=gpus, node=node, phase="Running" if node else "Pending",
        labels=dict(labels if labels is not None else gang_labels), annotations=dict(annotations or {}),
        created=created, mutate=mutate,
    )


def gang(prefix: str, count: int, **kwargs: Any) -> list[dict[str, Any]]:
    return [member(f"{prefix}-{i}", gang=prefix, **kwargs) for i in range(count)]


def running(name: str, *, node: str, gpus: int, priority: int = 1_000_000) -> dict[str, Any]:
    """A running pod; by default of a priority above every gated pod here, so that no preemption can remove it."""
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["priority"] = priority

    return builders.pod(name, namespace="other", gpus=gpus, node=node, phase="Running", mutate=mutate)


def low(name: str, *, node: str, gpus: int, priority: int = 0) -> dict[str, Any]:
    """A running pod of a priority below the gated pods here (default 10,000): preemption may remove it."""
    return running(name, node=node, gpus=gpus, priority=priority)


def cluster(
    nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]], occupancy: snapshot.Occupancy | None = None
) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, occupancy=occupancy, names=NAMES, taken_at=NOW)


@dataclasses.dataclass(frozen=True)
class Want:
    action: planning.Action
    reason: str | None
    says: str  # a fragment of the message
    nodes: Mapping[str, str] | None = None  # pod name -> node it is nominated to (RELEASE)
    waiting: planning.Waiting | None = None
    ungate: Sequence[str] | None = None  # pod names
    warns: bool = False  # a Warning where the reason is also given Normal (a gang that can never fit)
    whole: bool = False  # `says` is the whole message


# The Event type each reason goes out with (GangWaiting: Normal, unless the gang can never fit).
EVENT_TYPES: Mapping[str | None, str | None] = {
    planning.RELEASED: "Normal", planning.WAITING: "Normal", planning.PREEMPTING: "Normal",
    planning.INCOMPLETE: "Warning", planning.INVALID: "Warning", planning.ORPHANED: "Warning",
    planning.UNPLACED: "Warning", None: None,
}


def outcome(plan: planning.ReleasePlan) -> dict[str, planning.Decision]:
    return {d.gang: d for d in plan.decisions}


def check(decision: planning.Decision, want: Want) -> None:
    assert (decision.action, decision.event_reason, decision.waiting) == (want.action, want.reason, want.waiting)
    assert decision.event_type == ("Warning" if want.warns else EVENT_TYPES[want.reason]), decision.event_type
    assert decision.message == want.says if want.whole else want.says in decision.message, decision.message
    assert {m.key.split("/")[0] for m in decision.members} == {decision.gang.split("/")[0]}, decision.members
    if want.nodes is not None:
        assert {k.split("/")[1]: v for k, v in decision.nominations.items()} == dict(want.nodes)
    if want.ungate is not None:
        assert sorted(k.split("/")[1] for k in decision.ungate) == sorted(want.ungate)


EIGHT = builders.gpu_node("big", gpus=8, domains=SPLIT_8)
LAUNCHER = member("j-launcher", gang="j", size=5, gpus=0, priority=0)  # an MPI launcher: no GPU, no tier
# An older 2x4-GPU gang that does not fit "big" while 2 of its GPUs are busy.
LARGE_BLOCKED = [*gang("large", 2, size=2, gpus=4, created=EARLIER), running("busy", node="big", gpus=2)]


@pytest.mark.parametrize(
    ("nodes", "pods", "cfg", "expected"),
    [
        pytest.param(
            [EIGHT], gang("train", 2), config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "2 of 4 members present", waiting=W.INCOMPLETE)},
            id="incomplete-waits",
        ),
        pytest.param(
            [EIGHT], gang("train", 4, gpus=2), config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "4 members on 1 node(s) (big): one node",
                                nodes={f"train-{i}": "big" for i in range(4)},
                                ungate=[f"train-{i}" for i in range(4)])},
            id="complete-and-fits-releases-all",
        ),
        pytest.param(
            [EIGHT], [*gang("train", 2, size=2, gpus=4), running("busy", node="big", gpus=4)], config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs (8 needed, 4 free",
                                waiting=W.CAPACITY, ungate=[])},
            id="complete-does-not-fit-releases-none",
        ),
        pytest.param(
            [EIGHT, builders.gpu_node("small", gpus=4)],
            [member("m-4", gpus=4), member("m-2", gpus=2), member("m-1a", gpus=1), member("m-1b", gpus=1)],
            config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "each member within one NVLink domain",
                                nodes={"m-4": "big", "m-2": "big", "m-1a": "big", "m-1b": "big"})},
            id="mixed-gpu-counts-packed-on-one-node",
        ),
        pytest.param(
            # Alone, the greedy order would take n1 (clique X) and n2 (clique Y); clique Y holds the gang.
            [builders.gpu_node("n1", gpus=4, labels={"nvidia.com/gpu.clique": "X"}),
             builders.gpu_node("n2", gpus=4, labels={"nvidia.com/gpu.clique": "Y"}),
             builders.gpu_node("n3", gpus=4, labels={"accelerator.topograph.run/domain": "Y"})],
            gang("train", 2, size=2, gpus=4), config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "one multi-node NVLink domain Y",
                                nodes={"train-0": "n2", "train-1": "n3"})},
            id="one-multi-node-clique-preferred",
        ),
        pytest.param(
            [EIGHT],
            [*gang("older", 2, size=2, gpus=4, created="2026-11-21T11:50:00Z"),
             *gang("urgent", 2, size=2, gpus=4, priority=100_000)],
            config(),
            {"team/urgent": Want(A.RELEASE, planning.RELEASED, "one node",
                                 nodes={"urgent-0": "big", "urgent-1": "big"}),
             "team/older": Want(A.WAIT, planning.WAITING, "waiting for 8 more free GPUs", waiting=W.CAPACITY)},
            id="queue-higher-priority-first",
        ),
        pytest.param(
            [EIGHT],
            [*gang("second", 2, size=2, gpus=4, created="2026-11-21T11:30:00Z"),
             *gang("first", 2, size=2, gpus=4, created="2026-11-21T11:00:00Z")],
            config(),
            {"team/first": Want(A.RELEASE, planning.RELEASED, "one node"),
             "team/second": Want(A.WAIT, planning.WAITING, "waiting for 8 more free GPUs", waiting=W.CAPACITY)},
            id="queue-same-priority-oldest-first",
        ),
        pytest.param(
            [EIGHT],
            [*LARGE_BLOCKED, *gang("small", 2, size=2, gpus=1)],
            config(backfill=False),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/small": Want(A.WAIT, planning.WAITING, "fits, but queued behind team/large",
                                waiting=W.QUEUED, ungate=[])},
            id="backfill-off-small-gang-waits-behind-blocked-large-one",
        ),
        pytest.param(
            [EIGHT],
            [*LARGE_BLOCKED, *gang("small", 2, size=2, gpus=1)],
            config(backfill=True),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/small": Want(A.RELEASE, planning.RELEASED, "one node",
                                nodes={"small-0": "big", "small-1": "big"})},
            id="backfill-on-small-gang-starts",
        ),
        pytest.param(
            [EIGHT, builders.gpu_node("other-pool", gpus=2, labels={"pool": "b"})],
            [*gang("large", 2, size=2, gpus=4, created=EARLIER, selector={"kubernetes.io/hostname": "big"}),
             running("busy", node="big", gpus=2), *gang("elsewhere", 2, size=2, gpus=1, selector={"pool": "b"})],
            config(backfill=False),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more", waiting=W.CAPACITY),
             "team/elsewhere": Want(A.RELEASE, planning.RELEASED, "one node",
                                    nodes={"elsewhere-0": "other-pool", "elsewhere-1": "other-pool"})},
            id="backfill-off-gang-on-nodes-the-blocked-one-cannot-use-starts",
        ),
        pytest.param(
            [EIGHT], [member("bad", size="four")], config(),
            {"team/bad": Want(A.RELEASE_ALONE, planning.INVALID, "'four' is not a positive integer",
                              ungate=["bad"])},
            id="invalid-size-released-with-warning",
        ),
        pytest.param(
            [EIGHT], [member("nameless", labels={})], config(),
            {"team/nameless": Want(A.RELEASE, planning.RELEASED, "placed on big: NVLink score",
                                   nodes={"nameless": "big"}, ungate=["nameless"])},
            id="gated-pod-without-gang-is-placed-as-a-gang-of-one",
        ),
        pytest.param(
            [EIGHT], [member("nameless", labels={}, gpus=0)], config(),
            {"team/nameless": Want(A.RELEASE_ALONE, planning.INVALID, "names no gang and requests no GPU",
                                   ungate=["nameless"])},
            id="gate-without-gang-labels-or-gpus-released-with-warning",
        ),
        pytest.param(
            [EIGHT], [member("p-0", gang="p", size=2), member("p-1", gang="p", size=3)], config(),
            {"team/p-0": Want(A.RELEASE_ALONE, planning.INVALID, "members disagree on the gang size (2, 3)"),
             "team/p-1": Want(A.RELEASE_ALONE, planning.INVALID, "members disagree on the gang size (2, 3)")},
            id="members-disagreeing-on-size-released-with-warning",
        ),
        pytest.param(
            [EIGHT], gang("train", 2, annotations={MARK: "2026-11-21T11:59:30Z"}), config(),
            {"team/train": Want(A.RELEASE_ALONE, planning.ORPHANED, "was complete, now 2 of 4",
                                ungate=["train-0", "train-1"])},
            id="orphaned-members-released-with-warning",
        ),
        pytest.param(
            [EIGHT], gang("train", 2, annotations={MARK: "2026-11-21T11:59:30Z"}, owner="job"), config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "2 of 4 members present", waiting=W.INCOMPLETE)},
            id="lost-members-with-an-owner-wait-for-it-to-recreate-them",
        ),
        pytest.param(
            [EIGHT], gang("train", 2, created=LONG_AGO), config(timeout_seconds=600),
            {"team/train": Want(A.TIMED_OUT, planning.INCOMPLETE, "2 of 4 members present after more than 600s",
                                waiting=W.INCOMPLETE, ungate=[])},
            id="incomplete-past-timeout-warns-and-stays-gated",
        ),
        pytest.param(
            # Restart mid-release: two members already un-gated and bound, two still gated but nominated.
            [EIGHT],
            [member("t-0", gang="t", gated=False, node="big"), member("t-1", gang="t", gated=False, node="big"),
             member("t-2", gang="t", nominated="big"), member("t-3", gang="t", nominated="big")],
            config(),
            {"team/t": Want(A.RESUME, planning.RELEASED, "2 of 4 members already released", ungate=["t-2", "t-3"])},
            id="restart-half-released-gang-resumes",
        ),
        pytest.param(
            # One member never gated (webhook was down) and the gang is still incomplete: keep waiting.
            [EIGHT], [member("t-0", gang="t", gated=False, node="big"), member("t-1", gang="t")], config(),
            {"team/t": Want(A.WAIT, planning.WAITING, "2 of 4 members present", waiting=W.INCOMPLETE)},
            id="started-but-incomplete-gang-waits",
        ),
        pytest.param(
            # Restart after nominating, before un-gating (or someone else nominated them all): the nominations are
            # kept, never re-sent or overwritten, nothing is re-planned elsewhere.
            [EIGHT, builders.gpu_node("also", gpus=8, domains=SPLIT_8)],
            [member("t-0", gang="t", size=2, nominated="also"), member("t-1", gang="t", size=2, nominated="also")],
            config(),
            {"team/t": Want(A.RELEASE, planning.RELEASED, "nominated already, kept: team/t-0 (to also), team/t-1 "
                            "(to also)", nodes={}, ungate=["t-0", "t-1"])},
            id="restart-after-nominating-keeps-the-nominations",
        ),
        pytest.param(
            # Adversarial: one member nominated by someone else (native TAS) to "also", which still has room; the other
            # is placed by us around it, the nomination kept.
            [EIGHT, builders.gpu_node("also", gpus=8, domains=SPLIT_8)],
            [member("t-0", gang="t", size=2, gpus=4, nominated="also"), member("t-1", gang="t", size=2, gpus=4)],
            config(),
            {"team/t": Want(A.RELEASE, planning.RELEASED, "; nominated already, kept: team/t-0 (to also)",
                            nodes={"t-1": "also"}, ungate=["t-0", "t-1"])},
            id="someone-elses-nomination-on-one-member-kept-the-other-placed",
        ),
        pytest.param(
            # A single pod nominated by someone else: released at once without ours, however full its node looks.
            [EIGHT], [member("solo", labels={}, gpus=8, nominated="big"), running("busy", node="big", gpus=8)],
            config(),
            {"team/solo": Want(A.RELEASE, planning.RELEASED, "nominated already, kept: team/solo (to big)", nodes={},
                               ungate=["solo"])},
            id="single-pod-nominated-by-someone-else-released-without-ours",
        ),
        pytest.param(
            [EIGHT], [*gang("k", 1, size=2), member("k-9", gang="k", size=2, gates=[KUEUE_GATE])], config(),
            {"team/k": Want(A.WAIT, planning.WAITING, f"other controllers' gates: {KUEUE_GATE}",
                            waiting=W.OTHER_GATES, ungate=[])},
            id="another-controllers-gate-waited-for",
        ),
        pytest.param(
            # Released earlier, nominated to "big", not bound yet: its 8 GPUs are spoken for.
            [EIGHT],
            [member("early", gang="e", size=1, gated=False, gpus=8, nominated="big"), *gang("late", 2, size=2, gpus=1)],
            config(),
            {"team/late": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/e": Want(A.NONE, None, "no member gated by us")},
            id="released-unbound-pods-hold-their-nominated-node",
        ),
        pytest.param(
            [EIGHT], gang("train", 2, size=2, gpus=16), config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "can run on no node as the cluster stands (requests "
                                "more than the node has: nvidia.com/gpu 16 > 8); reserves no node",
                                waiting=W.CAPACITY, warns=True)},
            id="gang-larger-than-its-nodes-says-it-can-never-fit",
        ),
        pytest.param(
            [EIGHT], [member("s-0", gang="s", gated=False, size=2, node="big"),
                      member("s-1", gang="s", gated=False, size=2, node="big")], config(),
            {"team/s": Want(A.NONE, None, "no member gated by us")},
            id="running-gang-needs-nothing",
        ),
        # Members without GPUs (an MPI launcher counted in the gang size) count, are un-gated, never placed.
        pytest.param(
            [EIGHT], gang("j", 4, size=5, gpus=2), config(),
            {"team/j": Want(A.WAIT, planning.WAITING, "4 of 5 members present", waiting=W.INCOMPLETE, ungate=[])},
            id="gpu-workers-wait-for-their-launcher",
        ),
        pytest.param(
            [EIGHT], [*gang("j", 4, size=5, gpus=2), LAUNCHER], config(),
            {"team/j": Want(A.RELEASE, planning.RELEASED, "4 members on 1 node(s) (big): one node; each member "
                            "within one NVLink domain; un-gated with them, not nominated (no GPU): team/j-launcher",
                            nodes={f"j-{i}": "big" for i in range(4)},
                            ungate=["j-launcher", *(f"j-{i}" for i in range(4))])},
            id="launcher-completes-the-gang-released-together-unpinned",
        ),
        pytest.param(
            [EIGHT], [*gang("j", 4, size=5, gpus=2), member("j-launcher", gang="j", size=5, gpus=0,
                                                            selector={"pool": "cpu"})], config(),
            {"team/j": Want(A.RELEASE, planning.RELEASED, "not nominated (no GPU): team/j-launcher",
                            nodes={f"j-{i}": "big" for i in range(4)})},
            id="launcher-for-cpu-nodes-needs-no-gpu-node",
        ),
        pytest.param(
            [EIGHT], [*gang("j", 2, size=5, gpus=4), running("busy", node="big", gpus=4),
                      member("j-2", gang="j", size=5, gpus=0), member("j-3", gang="j", size=5, gpus=0), LAUNCHER],
            config(),
            {"team/j": Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs (8 needed, 4 free",
                            waiting=W.CAPACITY, ungate=[])},
            id="members-without-gpus-need-no-room",
        ),
        pytest.param(
            [EIGHT], gang("cpu", 2, size=3, gpus=0), config(),
            {"team/cpu": Want(A.WAIT, planning.WAITING, "2 of 3 members present", waiting=W.INCOMPLETE)},
            id="gang-without-gpus-waits-until-complete",
        ),
        pytest.param(
            [EIGHT], [*LARGE_BLOCKED, *gang("cpu", 2, size=2, gpus=0)], config(backfill=False),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/cpu": Want(A.RELEASE, planning.RELEASED, "no member to place: all 2 un-gated together, "
                              "none nominated by us", nodes={}, ungate=["cpu-0", "cpu-1"])},
            id="gang-without-gpus-released-when-complete-never-queued-behind-gpu-gangs",
        ),
    ],
)
def test_plan(
    nodes: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]],
    cfg: settings.Settings,
    expected: Mapping[str, Want],
) -> None:
    decisions = outcome(planning.plan(cluster(nodes, pods), config=cfg, now=NOW))
    assert set(decisions) == set(expected)
    for key, want in expected.items():
        check(decisions[key], want)


def test_demand_lists_only_gangs_waiting_for_capacity() -> None:
    pods = [*LARGE_BLOCKED, *gang("small", 2, size=2, gpus=1),
            *gang("partial", 1, size=3)]
    result = planning.plan(cluster([EIGHT], pods), config=config(), now=NOW)
    assert [(d.gang, d.priority, d.created, d.nodes, d.missing_gpus, sorted(p.name for p in d.members))
            for d in result.shortages] == [("team/large", 10_000, EARLIER, ("big",), 2, ["large-0", "large-1"])]


@pytest.mark.parametrize(
    ("extra_nodes", "size", "want"),
    [
        pytest.param(
            [builders.gpu_node("x1", gpus=4), builders.gpu_node("x2", gpus=4)], 2,
            Want(A.RELEASE, planning.RELEASED, "each member within one NVLink domain",
                 nodes={"train-0": "x1", "train-1": "x2"}),
            id="members-go-where-one-domain-holds-each",
        ),
        pytest.param(
            [], 1,
            Want(A.WAIT, planning.WAITING, "4 GPUs free on its nodes but no simultaneous placement with each "
                 "member inside one NVLink domain and its other requests met (needs 4 GPU in one NVLink domain)",
                 waiting=W.CAPACITY),
            id="split-free-gpus-are-not-enough",
        ),
    ],
)
def test_one_nvlink_domain_per_member(extra_nodes: list[dict[str, Any]], size: int, want: Want) -> None:
    """DCGM says GPUs 0,1 and 4,5 of "big" are taken: 4 free there, but no domain holds a 4-GPU member."""
    pods = [*gang("train", size, size=size, gpus=4), running("a", node="big", gpus=2), running("b", node="big", gpus=2)]
    occupancy = {"big": {0: "other/a", 1: "other/a", 4: "other/b", 5: "other/b"}}
    decisions = outcome(planning.plan(cluster([EIGHT, *extra_nodes], pods, occupancy), config=config(), now=NOW))
    check(decisions["team/train"], want)


def test_demand_for_reclaim_holds_only_the_members_that_need_gpus() -> None:
    """The launcher (priority 0, no tier) is not placed: it must not make the gang's demand yield to anything."""
    pods = [*gang("j", 4, size=5, gpus=2), LAUNCHER, running("busy", node="big", gpus=4)]
    snap = cluster([EIGHT], pods)
    [waiting] = planning.plan(snap, config=config(), now=NOW).shortages
    assert (waiting.gang, sorted(p.name for p in waiting.members), waiting.missing_gpus) == (
        "team/j", [f"j-{i}" for i in range(4)], 4)
    [demand] = cmd_descheduler.gang_demands(config())(snap, NOW)
    assert (demand.key, demand.priority, len(demand.members)) == ("gang:team/j", 10_000, 4)


def test_waiting_gangs_ask_for_the_complete_mark_once() -> None:
    pods = [*gang("large", 2, size=2, gpus=4, created="2026-11-21T11:50:00Z"), running("busy", node="big", gpus=2),
            member("done-0", gang="done", size=2, gpus=8, annotations={MARK: "x"}),
            member("done-1", gang="done", size=2, gpus=8)]
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))
    assert decisions["team/large"].mark == ("team/large-0", "team/large-1")
    assert decisions["team/done"].mark == ("team/done-1",)


def test_place_for_reclaim_without_and_with_the_victims() -> None:
    pods = [*gang("train", 2, size=2, gpus=4), running("idle", node="big", gpus=8)]
    full = cluster([EIGHT], pods)
    members = [full.pods["team/train-0"], full.pods["team/train-1"]]
    assert planning.place(members, cluster=full) is None
    freed = cluster([EIGHT], pods[:2])
    placed = planning.place(members, cluster=freed)
    assert placed is not None and dict(placed.nodes) == {"team/train-0": "big", "team/train-1": "big"}


@pytest.mark.parametrize(
    ("terms", "placed_on"),
    [
        pytest.param(None, "big-a", id="no-required-affinity"),
        pytest.param([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}], "big-b",
                     id="label-in"),
        pytest.param([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["c"]}]},
                      {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["big-b"]}]}], "big-b",
                     id="terms-are-ored"),
        pytest.param([{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["c"]}]}], None,
                     id="no-node-matches"),
        pytest.param([{}], None, id="empty-term-matches-nothing"),
    ],
)
def test_placement_honours_required_node_affinity(terms: list[dict[str, Any]] | None, placed_on: str | None) -> None:
    """The plan only uses nodes the scheduler could bind to (fit.why_not, whose table is in test_fit)."""
    pods = gang("train", 2, size=2, gpus=4)
    if terms is not None:
        for pod in pods:
            pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms}}}
    nodes = [builders.gpu_node(name, gpus=8, domains=SPLIT_8, labels={"pool": pool})
             for name, pool in (("big-a", "a"), ("big-b", "b"))]
    snap = cluster(nodes, pods)
    placed = planning.place([snap.pods["team/train-0"], snap.pods["team/train-1"]], cluster=snap)
    assert (None if placed is None else set(placed.nodes.values())) == (None if placed_on is None else {placed_on})


# --- The documented rules, each as a row that matches, one that does not, one on the boundary ---------------------

ONE_DOMAIN_8 = builders.gpu_node("big", gpus=8)


def solo(name: str, *, gpus: int, created: str = RECENT, priority: int = 10_000) -> dict[str, Any]:
    """A single pod we gated for placement at release (names no gang): a gang of one."""
    return member(name, labels={}, gpus=gpus, created=created, priority=priority)


def leaving(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-11-21T11:59:50Z"
    return pod


def phase(pod: dict[str, Any], value: str) -> dict[str, Any]:
    pod["status"]["phase"] = value
    return pod


def anti_affinity(pod: dict[str, Any], *, required: list[Any] | None = None, preferred: bool = False) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    rule: dict[str, Any] = {}
    if required is not None:
        rule["requiredDuringSchedulingIgnoredDuringExecution"] = required
    if preferred:
        rule["preferredDuringSchedulingIgnoredDuringExecution"] = [{"weight": 10, "podAffinityTerm": term}]
    pod["spec"]["affinity"] = {"podAntiAffinity": rule}
    return pod


ANTI_TERM = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}


def ranked(pod: dict[str, Any], *, priority: int, policy: str | None = None) -> dict[str, Any]:
    pod["spec"]["priority"] = priority
    if policy:
        pod["spec"]["preemptionPolicy"] = policy
    return pod


def busy_above(name: str, *, node: str, gpus: int) -> dict[str, Any]:
    """A running pod no gated pod here may preempt (a higher priority)."""
    return ranked(running(name, node=node, gpus=gpus), priority=1_000_000)


def blocked_large(mark: str) -> list[dict[str, Any]]:
    """A 2x4-GPU gang seen complete at `mark` that does not fit "big" while 2 of its GPUs are busy."""
    return [*gang("large", 2, size=2, gpus=4, created=LONG_AGO, annotations={MARK: mark}),
            running("busy", node="big", gpus=2)]


QUEUED_SMALL = Want(A.WAIT, planning.WAITING, "fits, but queued behind team/large", waiting=W.QUEUED, ungate=[])
STARTED_SMALL = Want(A.RELEASE, planning.RELEASED, "one node", nodes={"small-0": "big", "small-1": "big"})


@pytest.mark.parametrize(
    ("nodes", "pods", "cfg", "expected", "shortages"),
    [
        # With backfill off, a blocked single pod never holds back a smaller gang (single pods reserve nothing).
        pytest.param(
            [EIGHT], [solo("solo", gpus=8, created=EARLIER), busy_above("busy", node="big", gpus=2),
                      *gang("small", 2, size=2, gpus=1)], config(backfill=False),
            {"team/solo": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/small": STARTED_SMALL},
            ["team/solo"],
            id="backfill-off/blocked-single-pod-holds-back-no-gang/match",
        ),
        pytest.param(
            [EIGHT], [member("one-0", gang="one", size=1, gpus=8, created=EARLIER), running("busy", node="big", gpus=2),
                      *gang("small", 2, size=2, gpus=1)], config(backfill=False),
            {"team/one": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/small": Want(A.WAIT, planning.WAITING, "queued behind team/one", waiting=W.QUEUED)},
            ["team/one"],
            id="backfill-off/blocked-gang-of-size-one-does-hold-back/no-match",
        ),
        pytest.param(
            # Just created, of the highest priority: it still reserves nothing, for a gang or for a single pod.
            [EIGHT], [solo("solo", gpus=8, created="2026-11-21T12:00:00Z", priority=100_000),
                      busy_above("busy", node="big", gpus=2), *gang("small", 2, size=2, gpus=1),
                      solo("tiny", gpus=1, created="2026-11-21T12:00:00Z")], config(backfill=False),
            {"team/solo": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY),
             "team/small": STARTED_SMALL,
             "team/tiny": Want(A.RELEASE, planning.RELEASED, "placed on big", nodes={"tiny": "big"})},
            ["team/solo"],
            id="backfill-off/fresh-high-priority-single-pod-reserves-nothing/boundary",
        ),
        # No reservation outlives descheduler.gangs.reservation_seconds (120 s by default, from the complete mark).
        pytest.param(
            [EIGHT], [*blocked_large("2026-11-21T11:59:00Z"), *gang("small", 2, size=2, gpus=1)],
            config(backfill=False),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more", waiting=W.CAPACITY),
             "team/small": QUEUED_SMALL},
            ["team/large"],
            id="reservation/within-the-bound-holds/match",
        ),
        pytest.param(
            [EIGHT], [*blocked_large("2026-11-21T11:57:00Z"), *gang("small", 2, size=2, gpus=1)],
            config(backfill=False),
            {"team/large": Want(A.WAIT, planning.WAITING, "waiting for 2 more", waiting=W.CAPACITY),
             "team/small": STARTED_SMALL},
            ["team/large"],
            id="reservation/past-the-bound-holds-nothing/no-match",
        ),
        pytest.param(
            [EIGHT], [*blocked_large("2026-11-21T11:58:00Z"), *gang("small", 2, size=2, gpus=1)],
            config(backfill=False),
            {"team/small": QUEUED_SMALL},
            ["team/large"],
            id="reservation/exactly-at-the-bound-still-holds/boundary",
        ),
        pytest.param(
            [EIGHT], [*blocked_large("2026-11-21T11:57:59Z"), *gang("small", 2, size=2, gpus=1)],
            config(backfill=False),
            {"team/small": STARTED_SMALL},
            ["team/large"],
            id="reservation/one-second-past-the-bound-holds-nothing/boundary",
        ),
        # A member with required pod anti-affinity is never pinned (the capacity model does not evaluate it).
        pytest.param(
            [EIGHT],
            [member("t-0", size=2, gpus=4), anti_affinity(member("t-1", size=2, gpus=4), required=[ANTI_TERM])],
            config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED,
                                "un-gated with them, not nominated: team/t-1 (required podAntiAffinity (not modelled))",
                                nodes={"t-0": "big"}, ungate=["t-0", "t-1"])},
            [],
            id="anti-affinity/required-member-unpinned/match",
        ),
        pytest.param(
            [EIGHT], [member("t-0", size=2, gpus=4), anti_affinity(member("t-1", size=2, gpus=4), preferred=True)],
            config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "big", "t-1": "big"})},
            [],
            id="anti-affinity/preferred-only-is-pinned/no-match",
        ),
        pytest.param(
            [EIGHT], [member("t-0", size=2, gpus=4), anti_affinity(member("t-1", size=2, gpus=4), required=[])],
            config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "big", "t-1": "big"})},
            [],
            id="anti-affinity/empty-required-list-is-no-rule/boundary",
        ),
        # A terminating member does not count as present.
        pytest.param(
            [EIGHT], [member("t-0", size=2, gpus=2), leaving(member("t-1", size=2, gpus=2))], config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "1 of 2 members present", waiting=W.INCOMPLETE, ungate=[])},
            [],
            id="present/terminating-member-not-counted/match",
        ),
        pytest.param(
            [EIGHT], [member("t-0", size=2, gpus=2), member("t-1", size=2, gpus=2)], config(),
            {"team/train": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "big", "t-1": "big"})},
            [],
            id="present/both-members-alive-released/no-match",
        ),
        pytest.param(
            # Finished (Failed) is no more present than terminating; a started member that is running is.
            [EIGHT], [member("t-0", size=3, gpus=2), phase(member("t-1", size=3, gpus=2, gated=False), "Failed"),
                      member("t-2", size=3, gpus=2, gated=False, node="big")], config(),
            {"team/train": Want(A.WAIT, planning.WAITING, "2 of 3 members present", waiting=W.INCOMPLETE)},
            [],
            id="present/failed-member-not-counted-running-one-is/boundary",
        ),
        # A gang that can never fit as the cluster stands (3x3 GPUs, one 8-GPU node) says so and asks reclaim for
        # nothing: no eviction could ever make room for it.
        pytest.param(
            [ONE_DOMAIN_8], gang("g", 3, size=3, gpus=3), config(),
            {"team/g": Want(A.WAIT, planning.WAITING, "needs 9 GPUs but the nodes it may use have 8 in all: it can "
                            "never fit as the cluster stands; reserves no node", waiting=W.CAPACITY, warns=True)},
            [],
            id="never-fits/3x3-on-one-8-gpu-node-no-demand/match",
        ),
        pytest.param(
            [ONE_DOMAIN_8], [*gang("g", 2, size=2, gpus=3), running("busy", node="big", gpus=4)], config(),
            {"team/g": Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY)},
            ["team/g"],
            id="never-fits/2x3-waits-for-gpus-with-demand/no-match",
        ),
        pytest.param(
            [builders.gpu_node("nine", gpus=9)], [*gang("g", 3, size=3, gpus=3), running("busy", node="nine", gpus=1)],
            config(),
            {"team/g": Want(A.WAIT, planning.WAITING, "waiting for 1 more free GPUs", waiting=W.CAPACITY)},
            ["team/g"],
            id="never-fits/3x3-on-a-9-gpu-node-can-fit-later/boundary",
        ),
    ],
)
def test_documented_rule(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], cfg: settings.Settings,
    expected: dict[str, Want], shortages: list[str],
) -> None:
    result = planning.plan(cluster(nodes, pods), config=cfg, now=NOW)
    decisions = outcome(result)
    for key, want in expected.items():
        check(decisions[key], want)
    assert [s.gang for s in result.shortages] == shortages
    never = [d.gang for d in result.decisions if d.event_type == "Warning" and "never fit" in d.message]
    assert never == [g for g, w in expected.items() if "never fit" in w.says]


# --- Events: no Event before a gang may be complete; every waiting message ends with what the user can do ----------


def seconds_ago(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(NOW - seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("age", "told"),
    [
        pytest.param(11, True, id="incomplete-past-the-grace-is-told/match"),
        pytest.param(2, False, id="incomplete-within-the-grace-is-not-told/no-match"),
        pytest.param(10, True, id="incomplete-exactly-the-grace-is-told/boundary"),
    ],
)
def test_an_incomplete_gang_is_told_only_after_the_grace(age: float, told: bool) -> None:
    [decision] = planning.plan(cluster([EIGHT], gang("train", 2, created=seconds_ago(age))), config=config(),
                               now=NOW).decisions
    assert (decision.action, decision.waiting) == (A.WAIT, W.INCOMPLETE)
    assert (decision.event_type, decision.event_reason) == (("Normal", planning.WAITING) if told else (None, None))


@pytest.mark.parametrize(
    ("pods", "cfg", "gang_key", "what"),
    [
        pytest.param(gang("train", 2), config(), "team/train", planning.TO_DO[W.INCOMPLETE], id="incomplete"),
        pytest.param(gang("train", 2, created=LONG_AGO), config(timeout_seconds=600), "team/train",
                     planning.TO_DO[W.INCOMPLETE], id="incomplete-past-the-timeout"),
        pytest.param([*gang("k", 1, size=2), member("k-9", gang="k", size=2, gates=[KUEUE_GATE])], config(),
                     "team/k", planning.TO_DO[W.OTHER_GATES], id="other-gates"),
        pytest.param([*LARGE_BLOCKED, *gang("small", 2, size=2, gpus=1)], config(backfill=False), "team/small",
                     planning.TO_DO[W.QUEUED], id="queued"),
        pytest.param(LARGE_BLOCKED, config(), "team/large", planning.TO_DO[W.CAPACITY], id="capacity"),
        pytest.param(gang("g", 3, size=3, gpus=3), config(), "team/g", planning.NEVER_TO_DO, id="never-fits"),
    ],
)
def test_every_waiting_message_ends_with_what_to_do(pods: list[dict[str, Any]], cfg: settings.Settings,
                                                    gang_key: str, what: str) -> None:
    decisions = outcome(planning.plan(cluster([ONE_DOMAIN_8 if gang_key == "team/g" else EIGHT], pods), config=cfg,
                                      now=NOW))
    assert decisions[gang_key].message.endswith(f"; what to do: {what}"), decisions[gang_key].message


# --- preemption-aware release: a single pod that only kube-scheduler's preemption can place is released at once -----


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param([solo("urgent", gpus=8), low("low", node="big", gpus=4)],
                     Want(A.RELEASE_ALONE, planning.PREEMPTING, "fits no node now; preempting lower-priority pods on "
                          "big would make room (1 there): released at once without a nomination", nodes={},
                          ungate=["urgent"]),
                     id="lower-priority-pods-in-the-way/match"),
        pytest.param([ranked(solo("urgent", gpus=8), priority=10_000, policy="Never"),
                      low("low", node="big", gpus=4)],
                     Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="preemption-policy-never-waits/no-match"),
        pytest.param([solo("urgent", gpus=8), ranked(running("peer", node="big", gpus=4), priority=10_000)],
                     Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="equal-priority-is-never-preempted/boundary"),
        pytest.param([ranked(solo("urgent", gpus=4), priority=10_000), busy_above("busy", node="big", gpus=2),
                      *gang("large", 2, size=2, gpus=4, priority=20_000, created=EARLIER)],
                     Want(A.WAIT, planning.WAITING, "fits, but queued behind team/large", waiting=W.QUEUED, ungate=[]),
                     id="fits-now-on-nodes-kept-for-a-gang-ahead-is-queued-not-released"),
        pytest.param([solo("urgent", gpus=8), low("low", node="big", gpus=4),
                      busy_above("high", node="big", gpus=2)],
                     Want(A.WAIT, planning.WAITING, "waiting for 6 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="not-enough-lower-priority-pods-to-make-room"),
    ],
)
def test_released_at_once_when_only_preemption_can_place_it(pods: list[dict[str, Any]], want: Want) -> None:
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))
    check(decisions["team/urgent"], want)


# --- preemption-aware release of a gang: planned at once after preemption; members with free room nominated ---

FULL_A, FULL_B = builders.gpu_node("a", gpus=8, domains=SPLIT_8), builders.gpu_node("b", gpus=8, domains=SPLIT_8)


@pytest.mark.parametrize(
    ("nodes", "pods", "want"),
    [
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=4), low("low", node="big", gpus=4)],
                     Want(A.RELEASE, planning.PREEMPTING, "fits no node now; once kube-scheduler preempts "
                          "lower-priority pods on big (1 there): 2 members on 1 node(s) (big): one node",
                          nodes={"g-0": "big"}, ungate=["g-0", "g-1"]),  # g-1 needs the preemption: not nominated
                     id="lower-priority-pod-in-the-way/match"),
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=4)[:1], ranked(gang("g", 2, size=2, gpus=4)[1],
                                                                        priority=10_000, policy="Never"),
                               low("low", node="big", gpus=4)],
                     Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="one-member-with-preemption-policy-never-waits/no-match"),
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=4), low("peer", node="big", gpus=4, priority=10_000)],
                     Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="victim-of-equal-priority-is-never-preempted/boundary"),
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=4), low("peer", node="big", gpus=4, priority=9_999)],
                     Want(A.RELEASE, planning.PREEMPTING, "(1 there)", nodes={"g-0": "big"}),
                     id="victim-one-below-the-gang-is-preempted/boundary"),
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=4)[:1], ranked(gang("g", 2, size=2, gpus=4)[1], priority=0),
                               low("peer", node="big", gpus=4, priority=5_000)],
                     Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY),
                     id="every-member-must-outrank-the-victims"),
        pytest.param([FULL_A, FULL_B], [*gang("g", 2, size=2, gpus=8), low("la", node="a", gpus=8),
                                        low("lb", node="b", gpus=8)],
                     Want(A.RELEASE, planning.PREEMPTING, "preempts lower-priority pods on a (1 there), b (1 there): "
                          "2 members on 2 node(s) (a, b): member by member: free room first, else where preemption "
                          "leaves the best NVLink score", nodes={}),
                     id="members-need-preemption-on-two-nodes"),
        pytest.param([FULL_A, FULL_B], [*gang("g", 2, size=2, gpus=8), low("lb", node="b", gpus=8)],
                     Want(A.RELEASE, planning.PREEMPTING, "preempts lower-priority pods on b (1 there): 2 members",
                          nodes={"g-0": "a"}),
                     id="a-member-with-free-room-takes-it-preempting-nothing"),
        pytest.param([FULL_A, FULL_B], [*gang("g", 2, size=2, gpus=4), low("lb", node="b", gpus=8)],
                     Want(A.RELEASE, planning.RELEASED, "2 members on 1 node(s) (a): one node", nodes={"g-0": "a",
                                                                                                  "g-1": "a"}),
                     id="a-gang-that-fits-free-room-preempts-nothing"),
        pytest.param([FULL_A, FULL_B], [*gang("g", 2, size=2, gpus=4), low("la", node="a", gpus=4, priority=5_000),
                                        busy_above("ha", node="a", gpus=4), low("lb", node="b", gpus=8)],
                     Want(A.RELEASE, planning.PREEMPTING, "preempts lower-priority pods on a (1 there), b (1 there)",
                          nodes={}),
                     id="needs-preemption-on-two-nodes-takes-the-best-domain-on-each"),
        pytest.param([EIGHT], [*gang("g", 2, size=2, gpus=8), low("low", node="big", gpus=8)],
                     Want(A.WAIT, planning.WAITING, "can never fit as the cluster stands", waiting=W.CAPACITY,
                          ungate=[], warns=True),
                     id="only-part-fits-even-after-preemption-waits"),
        pytest.param([FULL_A], [*gang("g", 2, size=2, gpus=4), low("la", node="a", gpus=4),
                                busy_above("ha", node="a", gpus=4)],
                     Want(A.WAIT, planning.WAITING, "waiting for 8 more free GPUs", waiting=W.CAPACITY, ungate=[]),
                     id="one-member-fits-after-preemption-the-other-nowhere-waits"),
    ],
)
def test_a_gang_that_only_preemption_can_place_is_released_at_once(nodes: list[dict[str, Any]],
                                                                  pods: list[dict[str, Any]], want: Want) -> None:
    decisions = outcome(planning.plan(cluster(nodes, pods), config=config(), now=NOW))
    check(decisions["team/g"], want)


def _on_dra_node(*pods: dict[str, Any], low_gpus: int) -> snapshot.Snapshot:
    """`big` with its 8 GPUs as DRA devices; the lower-priority pod `low` (namespace other) holds devices 0 to
    `low_gpus` - 1 through the claim kube-scheduler made for its `nvidia.com/gpu` request."""
    holder = builders.resource_claim("low-x", namespace="other", devices=[("big", i) for i in range(low_gpus)],
                                     reserved_for=["low"], extended=True)
    inv = dra.build(device_classes=[builders.device_class()], slices=[builders.resource_slice("big", 8)],
                    claims=[holder], templates=[], taint_rules=[], gpu_classes=("gpu.nvidia.com",), served=True)
    with_claim = builders.with_extended_claim("low-x")
    victims = [low("low", node="big", gpus=low_gpus)]
    with_claim(victims[0])
    return snapshot_build.build(nodes=[builders.dra_node("big", domains=SPLIT_8)], pods=[*pods, *victims],
                                names=NAMES, taken_at=NOW, inventory=inv)


@pytest.mark.parametrize(("pods", "low_gpus", "gang_key"), [
    pytest.param([solo("urgent", gpus=8)], 4, "team/urgent", id="a-single-pod"),
    pytest.param(gang("g", 2, size=2, gpus=4), 4, "team/g", id="a-gang-with-a-member-that-needs-the-preemption"),
    pytest.param(gang("g", 2, size=2, gpus=4), 8, "team/g", id="a-gang-whose-every-member-needs-it"),
])
def test_on_a_dra_node_nothing_is_released_to_preempt(pods: list[dict[str, Any]], low_gpus: int,
                                                      gang_key: str) -> None:
    """kube-scheduler never preempts for DRA devices (fact 8 of test_nomination_facts_e2e): the same pods that the
    rows above release to preempt on a device-plugin node wait on a DRA node, nothing un-gated to sit Pending (a gang:
    never part-running). Control: the first row of each table above."""
    built = _on_dra_node(*pods, low_gpus=low_gpus)
    assert built.nodes["big"].dra_gpus and built.nodes["big"].free_gpus == 8 - low_gpus, built.problems
    decision = outcome(planning.plan(built, config=config(), now=NOW))[gang_key]
    assert (decision.action, decision.event_reason, decision.waiting, decision.ungate) == (
        A.WAIT, planning.WAITING, W.CAPACITY, ()), decision.message
    assert "preempt" not in decision.message, decision.message


def test_a_gang_preempts_on_no_node_an_earlier_release_of_the_same_pass_took() -> None:
    """A gang ahead (higher priority) placed on the only free node leaves nothing there to count as preemptible."""
    pods = [*gang("first", 1, size=1, gpus=4, priority=20_000), *gang("g", 2, size=2, gpus=4),
            low("low", node="big", gpus=4)]
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))
    check(decisions["team/first"], Want(A.RELEASE, planning.RELEASED, "placed on big", nodes={"first-0": "big"}))
    check(decisions["team/g"], Want(A.WAIT, planning.WAITING, "waiting for", waiting=W.CAPACITY, ungate=[]))


# --- the re-check right before a release's first patch, on the freshest snapshot -----------------------------------


def bound_since(name: str, *, node: str, gpus: int, nominated: bool = False) -> dict[str, Any]:
    """A never-gated pod the scheduler bound (or, `nominated`, reserved by preemption) to `node` after the plan."""
    pod = running(name, node=node, gpus=gpus, priority=0)
    if nominated:
        pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Pending", "nominatedNodeName": node}
    return pod


def cordoned(node: dict[str, Any]) -> dict[str, Any]:
    node["spec"]["unschedulable"] = True
    return node


@pytest.mark.parametrize(
    ("gated", "fresh_nodes", "arrived", "assumed", "want"),
    [
        pytest.param([solo("p", gpus=8)], None, [bound_since("racer", node="big", gpus=1)], {},
                     "node big was taken since the plan by other/racer (short of nvidia.com/gpu)",
                     id="bound-since-and-needs-what-the-plan-left/match"),
        pytest.param([solo("p", gpus=4)], None, [bound_since("racer", node="big", gpus=4)], {}, None,
                     id="bound-since-takes-exactly-what-the-plan-left/boundary"),
        pytest.param([solo("p", gpus=4)], None, [bound_since("racer", node="big", gpus=5)], {},
                     "node big was taken since the plan by other/racer (short of nvidia.com/gpu)",
                     id="one-gpu-more-than-the-plan-left/boundary"),
        pytest.param([solo("p", gpus=4)], None, [], {}, None, id="nothing-arrived/no-match"),
        pytest.param([solo("p", gpus=8)], None, [bound_since("racer", node="big", gpus=1, nominated=True)], {},
                     "node big was taken since the plan by other/racer", id="nominated-since-holds-the-node"),
        pytest.param([solo("p", gpus=8)], None, [bound_since("racer", node="big", gpus=1)], {"other/racer": "big"},
                     None, id="a-pod-this-controller-released-is-counted-already"),
        pytest.param([solo("p", gpus=4)], [cordoned(builders.gpu_node("big", gpus=8, domains=SPLIT_8))], [], {},
                     "node big is gone, cordoned or not ready since the plan", id="node-cordoned-since"),
        pytest.param([solo("p", gpus=4)], [], [], {}, "node big is gone, cordoned or not ready since the plan",
                     id="node-gone-since"),
        pytest.param(gang("g", 2, size=2, gpus=4), None, [bound_since("racer", node="big", gpus=1)], {},
                     "node big was taken since the plan by other/racer", id="a-gang-is-held-back-as-a-unit"),
    ],
)
def test_a_release_is_held_back_when_its_node_was_taken_since_the_plan(
    gated: list[dict[str, Any]], fresh_nodes: list[dict[str, Any]] | None, arrived: list[dict[str, Any]],
    assumed: Mapping[str, str], want: str | None,
) -> None:
    planned = cluster([EIGHT], gated)
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    assert set(decision.nominations.values()) == {"big"}
    fresh = cluster([EIGHT] if fresh_nodes is None else fresh_nodes, [*gated, *arrived])
    said = planning.overtaken(decision, names=NAMES, planned=planned, fresh=fresh, left=result.left, assumed=assumed)
    assert said == want if want is None else said is not None and said.startswith(want), said


def with_port(pod: dict[str, Any], port: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return pod


def bad_quantity(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "lots"}
    return pod


def finished(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["phase"] = "Succeeded"
    return pod


UNBUILT_TAKEN = "node big was taken since the plan by other/racer (not in a snapshot yet)"
NOMINATED_BEFORE = bound_since("early", node="big", gpus=1, nominated=True)  # in the plan's snapshot already


@pytest.mark.parametrize(
    ("gated", "unbuilt", "assumed", "want"),
    [
        pytest.param(solo("p", gpus=8), bound_since("racer", node="big", gpus=1), {},
                     f"{UNBUILT_TAKEN} (short of nvidia.com/gpu)",
                     id="bound-unbuilt-needs-what-the-plan-left/match"),
        pytest.param(solo("p", gpus=4), bound_since("racer", node="big", gpus=4), {}, None,
                     id="bound-unbuilt-takes-exactly-what-the-plan-left/boundary"),
        pytest.param(solo("p", gpus=4), bound_since("racer", node="big", gpus=5), {},
                     f"{UNBUILT_TAKEN} (short of nvidia.com/gpu)",
                     id="one-gpu-more/boundary"),
        pytest.param(solo("p", gpus=8), bound_since("racer", node="big", gpus=1, nominated=True), {},
                     UNBUILT_TAKEN, id="nominated-unbuilt-holds-the-node"),
        pytest.param(solo("p", gpus=8), bound_since("racer", node="other", gpus=1), {}, None,
                     id="bound-to-another-node/no-match"),
        pytest.param(solo("p", gpus=8), bound_since("racer", node="big", gpus=1), {"other/racer": "big"}, None,
                     id="assumed-on-that-node-is-not-an-arrival-there"),
        pytest.param(solo("p", gpus=8), bound_since("racer", node="big", gpus=1), {"other/racer": "elsewhere"},
                     UNBUILT_TAKEN, id="assumed-on-another-node-is-an-arrival-here"),
        pytest.param(solo("p", gpus=7), {**NOMINATED_BEFORE, "spec": {**NOMINATED_BEFORE["spec"], "nodeName": "big"}},
                     {}, None, id="nominated-in-the-plan-now-bound-there-was-counted/no-match"),
        pytest.param(with_port(solo("p", gpus=2), 8080), with_port(bound_since("racer", node="big", gpus=1), 8080),
                     {}, "node big was taken since the plan by other/racer (not in a snapshot yet): host port 8080/TCP "
                     "that team/p needs", id="host-port-taken/match"),
        pytest.param(with_port(solo("p", gpus=2), 8080), with_port(bound_since("racer", node="big", gpus=1), 9090),
                     {}, None, id="another-host-port/no-match"),
        pytest.param(solo("p", gpus=2), with_port(bound_since("racer", node="big", gpus=1), 8080), {}, None,
                     id="a-host-port-no-member-needs/no-match"),
        pytest.param(solo("p", gpus=2), bad_quantity(bound_since("racer", node="big", gpus=1)), {},
                     "node big was taken since the plan by other/racer (not in a snapshot yet; its requests: cpu",
                     id="requests-unreadable-takes-the-node"),
        pytest.param(solo("p", gpus=8), finished(bound_since("racer", node="big", gpus=1)), {}, None,
                     id="a-finished-pod-holds-nothing/no-match"),
    ],
)
def test_a_binding_the_watch_delivered_after_the_snapshot_holds_the_release_back(
    gated: dict[str, Any], unbuilt: dict[str, Any], assumed: Mapping[str, str], want: str | None,
) -> None:
    """`unbuilt`: the feeder's watch has it, no snapshot yet (`fresh` is the plan's own)."""
    planned = cluster([EIGHT], [gated, NOMINATED_BEFORE] if unbuilt["metadata"]["name"] == "early" else [gated])
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    assert set(decision.nominations.values()) == {"big"}
    key = f"{unbuilt['metadata']['namespace']}/{unbuilt['metadata']['name']}"
    said = planning.overtaken(decision, names=NAMES, planned=planned, fresh=planned, left=result.left, assumed=assumed,
                              unbuilt={key: unbuilt})
    assert said == want if want is None else said is not None and said.startswith(want), said


def released(name: str, *, gpus: int) -> dict[str, Any]:
    """A pod this controller released a pass ago: un-gated, neither nominated nor bound in the snapshot yet."""
    pod = solo(name, gpus=gpus)
    del pod["spec"]["schedulingGates"]
    return pod


@pytest.mark.parametrize(
    ("assumed_on", "gpus", "want"),
    [
        pytest.param("big", 4, None, id="assumed-there-the-plan-counted-it-there/no-match"),
        pytest.param("", 5, "node big was taken since the plan by team/mine (not in a snapshot yet) (short of "
                     "nvidia.com/gpu)", id="released-without-a-nomination-the-plan-counted-it-nowhere/match"),
    ],
)
def test_our_own_release_binding_before_the_snapshot_shows_it_counts_only_where_the_plan_did_not(
        assumed_on: str, gpus: int, want: str | None) -> None:
    """`mine` was released a pass ago (`assumed`: nominated to big, or released without a nomination) and is now
    bound to big, which only the watch shows; `p` (4 GPUs) is planned onto big's 8."""
    mine = released("mine", gpus=gpus)
    planned = cluster([EIGHT], [solo("p", gpus=4), mine])
    assumed = {"team/mine": assumed_on}
    result = planning.plan(planned, config=config(), now=NOW, assumed=assumed)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    bound = {**mine, "spec": {**mine["spec"], "nodeName": "big"}}
    said = planning.overtaken(decision, names=NAMES, planned=planned, fresh=planned, left=result.left,
                              assumed=assumed, unbuilt={"team/mine": bound})
    assert said == want


def test_a_pod_the_fresh_snapshot_shows_and_the_watch_still_lists_is_counted_once() -> None:
    """The plan's snapshot is older than the freshest; the racer is in both the fresh one and `unbuilt`: together
    with the member it takes exactly the node's 8 GPUs, so counted twice it would hold the release back."""
    gated = solo("p", gpus=4)
    planned = cluster([EIGHT], [gated])
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    racer = bound_since("racer", node="big", gpus=4)
    fresh = cluster([EIGHT], [gated, racer])
    assert planning.overtaken(decision, names=NAMES, planned=planned, fresh=fresh, left=result.left,
                              unbuilt={"other/racer": racer}) is None
    bigger = bound_since("racer", node="big", gpus=5)
    assert planning.overtaken(decision, names=NAMES, planned=planned, fresh=cluster([EIGHT], [gated, bigger]),
                              left=result.left, unbuilt={"other/racer": bigger}) is not None, "the control"


@pytest.mark.parametrize(("racer_gpus", "held"), [pytest.param(1, True, id="one-device-taken/match"),
                                                   pytest.param(0, False, id="no-device/no-match")])
def test_a_late_pod_s_dra_gpus_count_as_the_snapshot_counts_them(racer_gpus: int, held: bool) -> None:
    """On a DRA node the racer's GPUs come through a claim template, not its containers' requests: they count as
    the snapshot would count them (`snapshot.parse`)."""
    template = builders.claim_template("one", namespace="other", spec=builders.claim_spec(max(racer_gpus, 1)))
    inv = dra.build(device_classes=[builders.device_class()], slices=[builders.resource_slice("big", 8)], claims=[],
                    templates=[template], taint_rules=[], gpu_classes=("gpu.nvidia.com",), served=True)
    gated = solo("p", gpus=8)
    planned = snapshot_build.build(nodes=[builders.dra_node("big", domains=SPLIT_8)], pods=[gated], names=NAMES,
                                   taken_at=NOW, inventory=inv)
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    racer = builders.pod("racer", namespace="other", node="big", phase="Running",
                         mutate=builders.with_claim_template("one") if racer_gpus else None)
    said = planning.overtaken(decision, names=NAMES, planned=planned, fresh=planned, left=result.left,
                              unbuilt={"other/racer": racer})
    assert (said is not None) is held, said
    if held:
        assert said == f"{UNBUILT_TAKEN} (short of nvidia.com/gpu)"


def test_the_plan_s_own_snapshot_is_never_overtaken() -> None:
    planned = cluster([EIGHT], [solo("p", gpus=8)])
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = result.decisions
    assert planning.overtaken(decision, names=NAMES, planned=planned, fresh=planned, left=result.left) is None


def test_a_member_a_filter_refuses_since_the_plan_holds_back_its_release() -> None:
    port = {"containerPort": 80, "hostPort": 8080}
    pod = solo("p", gpus=4)
    pod["spec"]["containers"][0]["ports"] = [port]
    holder = bound_since("web", node="big", gpus=0)
    holder["spec"]["containers"][0]["ports"] = [port]
    planned = cluster([EIGHT], [pod])
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = result.decisions
    said = planning.overtaken(decision, names=NAMES, planned=planned, fresh=cluster([EIGHT], [pod, holder]),
                              left=result.left)
    assert said == "node big refuses team/p since the plan: host port 8080/TCP in use"


def nominated_to(node: str, *, gpus: int, deleting: bool = False) -> dict[str, Any]:
    """A pending pod kube-scheduler nominated to `node` (its preemption reservation)."""
    pod = bound_since("preemptor", node=node, gpus=gpus, nominated=True)
    return leaving(pod) if deleting else pod


@pytest.mark.parametrize(
    ("others", "node"),
    [
        pytest.param([nominated_to("a", gpus=1)], "b", id="a-nominated-pod-holds-its-node/match"),
        pytest.param([], "a", id="no-nomination-the-first-equal-node/no-match"),
        pytest.param([nominated_to("a", gpus=1, deleting=True)], "a",
                     id="a-terminating-nominated-pod-holds-nothing/boundary"),
    ],
)
def test_release_never_pins_onto_room_a_preemption_makes_for_another_pod(others: list[dict[str, Any]],
                                                                        node: str) -> None:
    decisions = outcome(planning.plan(cluster([FULL_A, FULL_B], [solo("p", gpus=8), *others]), config=config(),
                                      now=NOW))
    check(decisions["team/p"], Want(A.RELEASE, planning.RELEASED, f"placed on {node}", nodes={"p": node}))


# --- what a decision carries besides its action: the gang's size, priority, creation, members, Event text ----------


def test_a_decision_carries_the_gang_s_size_priority_creation_and_members() -> None:
    pods = [solo("one", gpus=2, priority=7),
            member("g-0", gang="g", size=2, gpus=2, priority=20, created="2026-11-21T11:50:00Z"),
            member("g-1", gang="g", size=2, gpus=2, priority=30, created="2026-11-21T11:55:00Z"),
            member("s-0", gang="s", size=2, gated=False, node="big", priority=40, created="2026-11-21T11:40:00Z"),
            member("u-0", gang="u", size=None, gated=False, node="big")]
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))

    def fields(d: planning.Decision) -> tuple[object, ...]:
        return (d.action, d.size, d.priority, d.created, d.single, d.message if d.action is A.NONE else d.summary,
                [(m.key, m.uid, m.gated, m.request.full, m.node) for m in d.members])

    assert fields(decisions["team/one"]) == (
        A.RELEASE, 1, 7, RECENT, True, "placed on big: NVLink score 130; 0 GPUs left free there",
        [("team/one", "uid-one", True, 2, "big")])
    assert fields(decisions["team/g"])[:6] == (A.RELEASE, 2, 30, "2026-11-21T11:50:00Z", False,
                                               "2 members on 1 node(s) (big): one node; each member within one "
                                               "NVLink domain")
    assert fields(decisions["team/s"]) == (A.NONE, 2, 40, "2026-11-21T11:40:00Z", False, "no member gated by us",
                                           [("team/s-0", "uid-s-0", False, 1, "big")])
    assert fields(decisions["team/u"])[:2] == (A.NONE, None), "a running gang of no known size"


def test_a_waiting_decision_has_no_short_summary() -> None:
    [decision] = planning.plan(cluster([EIGHT], gang("train", 2)), config=config(), now=NOW).decisions
    assert (decision.action, decision.summary) == (A.WAIT, "")


def test_place_for_reclaim_a_single_pod_by_its_nvlink_score() -> None:
    snap = cluster([EIGHT], [solo("one", gpus=4)])
    placed = planning.place([snap.pods["team/one"]], cluster=snap)
    assert placed is not None and placed.describe().startswith("placed on big: NVLink score 130 (base +50"), placed


# --- the exact messages of releases with members left unpinned ----------------------------------------------------

ANTI = "required podAntiAffinity (not modelled)"


@pytest.mark.parametrize(
    ("pods", "says"),
    [
        pytest.param(gang("t", 2, size=2, gpus=2),
                     "2 members on 1 node(s) (big): one node; each member within one NVLink domain",
                     id="every-member-nominated/nothing-added"),
        pytest.param([member("t-0", gang="t", size=3, gpus=2), member("t-1", gang="t", size=3, gpus=0),
                      member("t-2", gang="t", size=3, gpus=0)],
                     "; 6 GPUs left free there; un-gated with them, not nominated (no GPU): team/t-1, team/t-2",
                     id="two-without-gpus"),
        pytest.param([member("t-0", gang="t", size=3, gpus=2),
                      anti_affinity(member("t-1", gang="t", size=3, gpus=2), required=[ANTI_TERM]),
                      anti_affinity(member("t-2", gang="t", size=3, gpus=2), required=[ANTI_TERM])],
                     f"; 6 GPUs left free there; un-gated with them, not nominated: team/t-1 ({ANTI}), "
                     f"team/t-2 ({ANTI})",
                     id="two-not-modelled"),
        pytest.param([member("t-0", gang="t", size=3, gpus=2), member("t-1", gang="t", size=3, gpus=0),
                      anti_affinity(member("t-2", gang="t", size=3, gpus=2), required=[ANTI_TERM])],
                     f"; un-gated with them, not nominated (no GPU): team/t-1; un-gated with them, not nominated: "
                     f"team/t-2 ({ANTI})", id="one-of-each"),
    ],
)
def test_a_release_names_the_members_it_does_not_nominate(pods: list[dict[str, Any]], says: str) -> None:
    decision = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))["team/t"]
    assert decision.action is A.RELEASE
    assert decision.message.endswith(says) if says.startswith(";") else decision.message == says, decision.message


# --- pods released alone, whatever comes after them; gangs another scheduler or a PodGroup holds ------------------


def elsewhere(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulerName"] = "volcano"
    return pod


BAD_SIZE = Want(A.RELEASE_ALONE, planning.INVALID, "'four' is not a positive integer", ungate=["a-bad"])
B_RELEASED = Want(A.RELEASE, planning.RELEASED, "one node", nodes={"b-0": "big", "b-1": "big"})


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([elsewhere(member("a-0", gang="a", size=1)), *gang("b", 2, size=2)],
                     {"team/a-0": Want(A.RELEASE_ALONE, planning.INVALID, "gang team/a: scheduler volcano places the "
                                       "gang; our gate is not needed", ungate=["a-0"], whole=True),
                      "team/b": B_RELEASED}, id="another-scheduler-holds-the-gang"),
        pytest.param([member("a-0", gang="a", size=None), *gang("b", 2, size=2)],
                     {"team/a-0": Want(A.RELEASE_ALONE, planning.INVALID, "gang team/a: ", ungate=["a-0"]),
                      "team/b": B_RELEASED}, id="a-gang-of-unknown-size"),
        pytest.param([member("a-bad", gang="bad", size="four"), member("a-0", gang="a", size=2),
                      member("a-1", gang="a", size=3), *gang("b", 2, size=2)],
                     {"team/a-bad": BAD_SIZE,
                      "team/a-0": Want(A.RELEASE_ALONE, planning.INVALID, "gang team/a: members disagree on the gang "
                                       "size (2, 3); released", ungate=["a-0"], whole=True),
                      "team/a-1": Want(A.RELEASE_ALONE, planning.INVALID, "members disagree", ungate=["a-1"]),
                      "team/b": B_RELEASED}, id="members-disagreeing-after-an-invalid-pod"),
    ],
)
def test_pods_released_alone_hold_back_nothing_after_them(pods: list[dict[str, Any]],
                                                          expected: Mapping[str, Want]) -> None:
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))
    assert set(decisions) == set(expected)
    for key, want in expected.items():
        check(decisions[key], want)


def test_a_podgroup_without_a_gang_policy_leaves_the_gang_to_our_labels() -> None:
    def grouped(pod: dict[str, Any]) -> dict[str, Any]:
        pod["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        return pod

    snap = snapshot_build.build(nodes=[EIGHT], pods=[grouped(p) for p in gang("t", 2, size=2)], names=NAMES,
                                taken_at=NOW,
                                pod_groups=[{"metadata": {"namespace": "team", "name": "pg"}, "spec": {}}])
    check(outcome(planning.plan(snap, config=config(), now=NOW))["team/t"],
          Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "big", "t-1": "big"}))


# --- before the queue: a started gang resumes, an incomplete one times out, other controllers' gates ---------------


@pytest.mark.parametrize(
    ("pods", "cfg", "want", "mark"),
    [
        pytest.param([member("t-0", gang="t", size=2, gated=False, node="big"), member("t-1", gang="t", size=2)],
                     config(), Want(A.RESUME, planning.RELEASED, "1 of 2 members already released: releasing the "
                                    "other 1 now (an earlier release was interrupted, or a member was replaced)",
                                    ungate=["t-1"], whole=True), (), id="started-complete-unpinned-resumes"),
        pytest.param(gang("t", 2, annotations={MARK: "2026-11-21T11:59:30Z"}), config(),
                     Want(A.RELEASE_ALONE, planning.ORPHANED, "gang was complete, now 2 of 4 members remain and "
                          "nothing will recreate the others; released", whole=True), (), id="orphaned"),
        pytest.param(gang("t", 2, created=LONG_AGO), config(timeout_seconds=600),
                     Want(A.TIMED_OUT, planning.INCOMPLETE, "2 of 4 members present after more than 600s (the "
                          "timeout); kept gated: a partial gang is never released; what to do: "
                          f"{planning.TO_DO[W.INCOMPLETE]}", waiting=W.INCOMPLETE, whole=True), (),
                     id="incomplete-past-the-timeout"),
        pytest.param(gang("t", 2, created="2026-11-21T11:50:00Z"), config(timeout_seconds=600),
                     Want(A.WAIT, planning.WAITING, "2 of 4 members present", waiting=W.INCOMPLETE), (),
                     id="incomplete-exactly-at-the-timeout-still-waits/boundary"),
        pytest.param([member("t-0", gang="t", size=2, gates=["x/one", "x/two"], annotations={MARK: "x"}),
                      member("t-1", gang="t", size=2, gates=["x/two"])], config(),
                     Want(A.WAIT, planning.WAITING, "complete; waiting for other controllers' gates: x/one, x/two; "
                          f"what to do: {planning.TO_DO[W.OTHER_GATES]}", waiting=W.OTHER_GATES, whole=True),
                     ("team/t-1",), id="other-gates-mark-the-unmarked-members"),
    ],
)
def test_before_the_queue(pods: list[dict[str, Any]], cfg: settings.Settings, want: Want,
                          mark: tuple[str, ...]) -> None:
    decision = outcome(planning.plan(cluster([EIGHT], pods), config=cfg, now=NOW))["team/t"]
    check(decision, want)
    assert decision.mark == mark


# --- no pod waits on us forever: released unpinned past its max wait ----------------------------------------------

UNPLACED_SOLO = Want(A.RELEASE_ALONE, planning.UNPLACED, "not placed within 300s (complete; waiting for 2 more free "
                     "GPUs (8 needed, 6 free on its nodes)); released without a nomination so that kube-scheduler's "
                     "preemption and cluster autoscalers can act on it", ungate=["p"], whole=True)
WAITS_SOLO = Want(A.WAIT, planning.WAITING, "waiting for 2 more free GPUs", waiting=W.CAPACITY, ungate=[])


@pytest.mark.parametrize(
    ("pods", "cfg", "key", "want"),
    [
        # Ten minutes: past a single pod's limit (300 s), within a gang's (1800 s).
        pytest.param([solo("p", gpus=8, created=seconds_ago(600))], config(), "team/p", UNPLACED_SOLO,
                     id="single-past-max-wait/match"),
        pytest.param([solo("p", gpus=8)], config(), "team/p", WAITS_SOLO, id="single-within-max-wait/no-match"),
        pytest.param([solo("p", gpus=8, created="2026-11-21T12:00:00Z")], config(max_wait_seconds=0.5), "team/p",
                     WAITS_SOLO, id="single-just-created-under-a-tiny-limit/boundary"),
        pytest.param([solo("p", gpus=8, created="")], config(max_wait_seconds=0.5), "team/p", WAITS_SOLO,
                     id="single-of-unknown-age-waits"),
        pytest.param([solo("p", gpus=16, created=seconds_ago(600))], config(), "team/p",
                     Want(A.RELEASE_ALONE, planning.UNPLACED, "not placed within 300s (complete; team/p can run on no "
                          "node as the cluster stands (requests more than the node has: nvidia.com/gpu 16 > 8)); "
                          "released without a nomination", ungate=["p"]), id="single-that-can-never-fit-past-max-wait"),
        pytest.param(gang("g", 2, size=2, gpus=4, created=LONG_AGO), config(), "team/g",
                     Want(A.RELEASE_ALONE, planning.UNPLACED, "not placed within 1800s", ungate=["g-0", "g-1"]),
                     id="gang-past-max-wait-since-its-newest-member/match"),
        pytest.param(gang("g", 2, size=2, gpus=4, created=LONG_AGO, annotations={MARK: "2026-11-21T11:59:00Z"}),
                     config(), "team/g", Want(A.WAIT, planning.WAITING, "waiting for 2 more", waiting=W.CAPACITY),
                     id="gang-seen-complete-recently-waits/no-match"),
    ],
)
def test_no_pod_waits_on_us_forever(pods: list[dict[str, Any]], cfg: settings.Settings, key: str, want: Want) -> None:
    decisions = outcome(planning.plan(cluster([EIGHT], [*pods, busy_above("busy", node="big", gpus=2)]), config=cfg,
                                      now=NOW))
    check(decisions[key], want)


# --- the re-check before the first patch, on other nodes and resources ---------------------------------------------


def slots(node: dict[str, Any], count: int) -> dict[str, Any]:
    node["status"]["allocatable"]["pods"] = str(count)
    return node


def asking(pod: dict[str, Any], resource: str) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"]["limits"][resource] = "1"
    return pod


A8, B8 = builders.gpu_node("a", gpus=8, domains=SPLIT_8), builders.gpu_node("b", gpus=8, domains=SPLIT_8)


@pytest.mark.parametrize(
    ("nodes", "before", "gated", "arrived", "want"),
    [
        pytest.param([EIGHT], [running("there", node="big", gpus=4)], [solo("p", gpus=4)], [], None,
                     id="a-pod-there-before-the-plan-is-no-newcomer/no-match"),
        pytest.param([EIGHT], [], [solo("p", gpus=4)], [], "node big refuses team/p since the plan: team/p is gone",
                     id="a-member-gone-since"),
        pytest.param([A8, B8], [], gang("g", 2, size=2, gpus=8), [bound_since("racer", node="b", gpus=1)],
                     "node b was taken since the plan by other/racer (short of nvidia.com/gpu)",
                     id="the-second-node-of-a-gang-taken"),
        pytest.param([slots(builders.gpu_node("big", gpus=8, domains=SPLIT_8), 1)], [], [solo("p", gpus=4)],
                     [bound_since("racer", node="big", gpus=0)],
                     "node big was taken since the plan by other/racer (short of pods)", id="its-last-pod-slot-taken"),
        pytest.param([EIGHT], [], [solo("p", gpus=4)], [asking(bound_since("racer", node="big", gpus=1), "x.io/fpga")],
                     "node big was taken since the plan by other/racer (short of x.io/fpga)",
                     id="a-resource-the-node-has-none-of"),
        pytest.param([slots(builders.gpu_node("big", gpus=8, domains=SPLIT_8), 2)], [], [solo("p", gpus=8)],
                     [bound_since("r1", node="big", gpus=1), bound_since("r2", node="big", gpus=1)],
                     "node big was taken since the plan by other/r1, other/r2 (short of nvidia.com/gpu, pods)",
                     id="two-newcomers-short-of-two-resources"),
    ],
)
def test_the_re_check_reads_every_pinned_node_and_resource(
    nodes: list[dict[str, Any]], before: list[dict[str, Any]], gated: list[dict[str, Any]],
    arrived: list[dict[str, Any]], want: str | None,
) -> None:
    planned = cluster(nodes, [*before, *gated])
    result = planning.plan(planned, config=config(), now=NOW)
    [decision] = [d for d in result.decisions if d.action is A.RELEASE]
    present = [] if want and "is gone" in want else gated  # the row whose member is gone: deleted since the plan
    fresh = cluster(nodes, [*before, *present, *arrived])
    assert planning.overtaken(decision, names=NAMES, planned=planned, fresh=fresh, left=result.left) == want


# --- one gang's decision never stops the pass: the gangs queued after it are still decided ----------------------


@pytest.mark.parametrize(
    ("nodes", "pods", "expected"),
    [
        pytest.param([EIGHT], [*gang("cpu", 2, size=2, gpus=0, created=EARLIER), *gang("t", 2, size=2, gpus=2)],
                     {"team/cpu": Want(A.RELEASE, planning.RELEASED, "no member to place"),
                      "team/t": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "big", "t-1": "big"})},
                     id="after-a-gang-with-nothing-to-place"),
        pytest.param([EIGHT, builders.gpu_node("small", gpus=2)],
                     [solo("urgent", gpus=8, created=EARLIER), low("low", node="big", gpus=4),
                      *gang("t", 2, size=2, gpus=1)],
                     {"team/urgent": Want(A.RELEASE_ALONE, planning.PREEMPTING, "preempting lower-priority pods on "
                                          "big"),
                      "team/t": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "small", "t-1": "small"})},
                     id="after-a-single-pod-released-to-preempt"),
        pytest.param([EIGHT, builders.gpu_node("small", gpus=2)],
                     [*gang("g", 2, size=2, gpus=4, created=EARLIER), low("low", node="big", gpus=4),
                      *gang("t", 2, size=2, gpus=1)],
                     {"team/g": Want(A.RELEASE, planning.PREEMPTING, "once kube-scheduler preempts"),
                      "team/t": Want(A.RELEASE, planning.RELEASED, "one node", nodes={"t-0": "small", "t-1": "small"})},
                     id="after-a-gang-released-to-preempt"),
    ],
)
def test_every_gang_in_the_queue_is_decided(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                                            expected: Mapping[str, Want]) -> None:
    decisions = outcome(planning.plan(cluster(nodes, pods), config=config(), now=NOW))
    for key, want in expected.items():
        check(decisions[key], want)


# --- what this controller released that the snapshot does not show yet (`assumed`) -------------------------------


@pytest.mark.parametrize(
    ("pods", "assumed", "expected"),
    [
        # a-0 is still gated in the snapshot but already released onto big: no decision, and it holds its 8 GPUs.
        pytest.param([member("a-0", gang="a", size=1, gpus=8, created=EARLIER), *gang("b", 2, size=2, gpus=2)],
                     {"team/a-0": "big"},
                     {"team/b": Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY)},
                     id="a-released-gang-is-not-planned-again-and-holds-its-node/match"),
        pytest.param([member("a-0", gang="a", size=1, gpus=8, created=EARLIER), *gang("b", 2, size=2, gpus=2)], {},
                     {"team/a": Want(A.RELEASE, planning.RELEASED, "placed on big"),
                      "team/b": Want(A.WAIT, planning.WAITING, "waiting for 4 more free GPUs", waiting=W.CAPACITY)},
                     id="nothing-assumed/no-match"),
        # Only a gated member counts: a started member we released earlier does not hide its gang's gated rest.
        pytest.param([member("a-0", gang="a", size=2, gated=False, node="big"), member("a-1", gang="a", size=2)],
                     {"team/a-0": "big"},
                     {"team/a": Want(A.RESUME, planning.RELEASED, "1 of 2 members already released", ungate=["a-1"])},
                     id="a-released-member-that-is-not-gated/boundary"),
    ],
)
def test_a_release_the_snapshot_does_not_show_yet(pods: list[dict[str, Any]], assumed: Mapping[str, str],
                                                  expected: Mapping[str, Want]) -> None:
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW, assumed=assumed))
    assert set(decisions) == set(expected)
    for key, want in expected.items():
        check(decisions[key], want)


# --- the tie-break: equal nodes go to the one fewer pending never-gated pods prefer (`layout.contested`) ------------


def preferring(name: str, *, node: str) -> dict[str, Any]:
    """A pending GPU pod carrying no gate that prefers `node`, as the webhook writes it for pods it does not gate."""
    pod = running(name, node=node, gpus=1, priority=0)
    pod["spec"].pop("nodeName")
    pod["status"]["phase"] = "Pending"
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}}]}}
    return pod


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([*gang("g", 2, size=2, gpus=8), preferring("q", node="a")],
                     Want(A.RELEASE, planning.RELEASED, "on 2 node(s) (b, c)", nodes={"g-0": "b", "g-1": "c"}),
                     id="placed-away-from-the-contested-node"),
        pytest.param([*gang("g", 2, size=2, gpus=8), low("la", node="a", gpus=8), low("lb", node="b", gpus=8),
                      low("lc", node="c", gpus=8), preferring("q", node="a")],
                     Want(A.RELEASE, planning.PREEMPTING, "on 2 node(s) (b, c)", nodes={}),
                     id="preempting-away-from-the-contested-node"),
    ],
)
def test_a_release_avoids_nodes_pending_pods_prefer(pods: list[dict[str, Any]], expected: Want) -> None:
    nodes = [builders.gpu_node(n, gpus=8, domains=SPLIT_8) for n in "abc"]
    check(outcome(planning.plan(cluster(nodes, pods), config=config(), now=NOW))["team/g"], expected)


def test_gangs_queued_behind_others_name_them_all_and_ask_for_the_mark() -> None:
    """A gang that fits but is queued keeps the nodes it could use for itself too: the next names both. The single
    pod first in the queue (the oldest), released past its max wait, holds back none of them."""
    pods = [*LARGE_BLOCKED, *gang("small", 2, size=2, gpus=1, annotations={MARK: "x"}),
            *gang("tiny", 1, size=1, gpus=1), solo("p", gpus=8, created=seconds_ago(600)),
            *gang("t", 2, size=2, gpus=1)]
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(), now=NOW))
    check(decisions["team/tiny"], Want(
        A.WAIT, planning.WAITING, "complete; fits, but queued behind team/large, team/small, team/t (backfill off: "
        f"the nodes they could use are kept for them); what to do: {planning.TO_DO[W.QUEUED]}", waiting=W.QUEUED,
        whole=True))
    assert (decisions["team/tiny"].mark, decisions["team/small"].mark) == (("team/tiny-0",), ())
    check(decisions["team/p"], Want(A.RELEASE_ALONE, planning.UNPLACED, "not placed within 300s"))
    check(decisions["team/t"], Want(A.WAIT, planning.WAITING, "queued behind team/large, team/small (",
                                    waiting=W.QUEUED))


def test_a_single_pod_waiting_asks_for_no_mark() -> None:
    [decision] = planning.plan(cluster([EIGHT], [solo("p", gpus=16)]), config=config(), now=NOW).decisions
    assert (decision.action, decision.mark) == (A.WAIT, ())


def test_every_blocked_gang_keeps_its_nodes() -> None:
    """Two gangs blocked on different nodes (b first in the queue): a later gang that fits the first one's node is
    queued behind both, the second blocked gang keeping its node does not free the first one's."""
    pool_b = builders.gpu_node("other-pool", gpus=2, labels={"pool": "b"})
    pods = [*LARGE_BLOCKED, *gang("b", 2, size=2, gpus=1, created=EARLIER, selector={"pool": "b"}),
            running("busy-b", node="other-pool", gpus=1),
            *gang("tiny", 1, size=1, gpus=1, selector={"pool": "b"})]
    decisions = outcome(planning.plan(cluster([EIGHT, pool_b], pods), config=config(backfill=False), now=NOW))
    check(decisions["team/b"], Want(A.WAIT, planning.WAITING, "waiting for 1 more free GPUs", waiting=W.CAPACITY))
    check(decisions["team/tiny"], Want(A.WAIT, planning.WAITING, "queued behind team/b, team/large",
                                       waiting=W.QUEUED))


def test_a_gang_that_fits_not_even_on_kept_nodes_is_not_queued_but_waits_for_gpus() -> None:
    pods = [*LARGE_BLOCKED, *gang("second", 2, size=2, gpus=4)]
    decisions = outcome(planning.plan(cluster([EIGHT], pods), config=config(backfill=False), now=NOW))
    check(decisions["team/second"], Want(A.WAIT, planning.WAITING, "complete; waiting for 2 more free GPUs",
                                         waiting=W.CAPACITY))
