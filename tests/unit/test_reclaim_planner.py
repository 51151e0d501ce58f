"""The pure reclaim planner: pods + nodes + utilisation + demands + cooldowns + limits -> evictions and
spared pods, each asserted with its reason."""

from __future__ import annotations

import dataclasses
import datetime
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from common import capacity, settings, settings_loader, snapshot, snapshot_build, topology
from descheduler import cooldowns, limits, policy, reclaim
from descheduler.reclaim import search, utilisation
from tests import builders

P = policy.PREFIX
NOW = datetime.datetime(2026, 11, 21, 12, 0, tzinfo=datetime.UTC).timestamp()
TWO_HOURS_AGO = "2026-11-21T10:00:00Z"
CLASSES = [
    builders.priority_class("batch", 1000, annotations={
        f"{P}resource-idle-seconds": "3600", f"{P}resource-idle-usage-threshold": "10",
        f"{P}minimum-preemptable-priority": "5000"}),
    builders.priority_class("yielding", 1000, annotations={
        f"{P}gpu-idle-seconds": "3600", f"{P}gpu-idle-usage-threshold": "10",
        f"{P}minimum-preemptable-priority": "500"}),
    builders.priority_class("sticky", 1000),
    # No minimum: the victim's own priority + 1. Its value now is lower than the pods admitted under it had.
    builders.priority_class("recreated", 10, annotations={
        f"{P}resource-idle-seconds": "3600", f"{P}resource-idle-usage-threshold": "10"}),
    builders.priority_class("system-node-critical", 2_000_001_000),
]
Raw = dict[str, Any]
NO_COOLDOWNS = cooldowns.State()


def running(
    name: str,
    *,
    node: str,
    gpus: int = 1,
    mig: dict[str, int] | None = None,
    cls: str = "batch",
    priority: int = 1000,
    namespace: str = "team-a",
    created: str = TWO_HOURS_AGO,
    owner: tuple[str, str] | None = ("Job", ""),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
    volumes: list[Raw] | None = None,
) -> Raw:
    """A running pod owned by a Job of its own name (`owner=None`: a bare pod)."""
    def mutate(body: Raw) -> None:
        body["spec"].update(priorityClassName=cls, priority=priority)
        body["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]
        if owner:
            body["metadata"]["ownerReferences"] = [{"kind": owner[0], "name": owner[1] or name, "controller": True}]
        if volumes:
            body["spec"]["volumes"] = volumes
        if deleting:
            body["metadata"]["deletionTimestamp"] = "2026-11-21T11:59:00Z"

    return builders.pod(name, namespace=namespace, gpus=gpus, mig=mig, node=node, phase="Running",
                        labels=labels, annotations=annotations, created=created, mutate=mutate)


def pending(name: str, *, gpus: int = 1, mig: dict[str, int] | None = None, priority: int = 10000,
            preemption_policy: str | None = None, namespace: str = "team-b") -> Raw:
    def mutate(body: Raw) -> None:
        body["spec"]["priority"] = priority
        if preemption_policy:
            body["spec"]["preemptionPolicy"] = preemption_policy
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    return builders.pod(name, namespace=namespace, gpus=gpus, mig=mig, created="2026-11-21T11:50:00Z",
                        mutate=mutate)


def gang(name: str) -> dict[str, str]:
    return {"gpu-steward.io/gang-name": name, "gpu-steward.io/gang-size": "2"}


def mig_node(name: str, *, profiles: dict[str, int], state: str = "success") -> Raw:
    def mutate(body: Raw) -> None:
        body["status"]["allocatable"] = {**{f"nvidia.com/mig-{p}": str(c) for p, c in profiles.items()},
                                         "cpu": "64", "memory": "512Gi", "pods": "110"}
        body["metadata"]["labels"][topology.MIG_CONFIG_STATE_LABEL] = state

    return builders.gpu_node(name, gpus=1, topology="none", mutate=mutate)


ONE = [builders.gpu_node("n1", gpus=1)]
TWO = [builders.gpu_node("n1", gpus=1), builders.gpu_node("n2", gpus=1)]
QUAD = [builders.gpu_node("n1", gpus=4, domains=[[0, 1], [2, 3]], topology="annotation")]
# Estimated indices, oldest first: a->0 and b->1 (domain 0), c->2 and d->3 (domain 1).
QUAD_PODS = [
    running("a", node="n1", priority=10, created="2026-11-21T09:00:00Z"),
    running("b", node="n1", priority=30, created="2026-11-21T09:01:00Z"),
    running("c", node="n1", priority=5, created="2026-11-21T09:02:00Z"),
    running("d", node="n1", priority=5, created="2026-11-21T09:03:00Z"),
    pending("want", gpus=2),
]


def idle(*pods: str, util: float = 2.1) -> dict[str, utilisation.Assessment]:
    return {p: utilisation.Assessment(True, util, f"GPU utilisation {util}% < 10% over 3600s") for p in pods}


def busy(pod: str) -> dict[str, utilisation.Assessment]:
    return {pod: utilisation.Assessment(False, 50.0, "GPU utilisation 50.0% >= 10% over 3600s")}


def run(
    nodes: Sequence[Raw],
    pods: Sequence[Raw],
    assessments: Mapping[str, utilisation.Assessment],
    *,
    overrides: dict[str, Any] | None = None,
    state: cooldowns.State = NO_COOLDOWNS,
    demands: Callable[[snapshot.Snapshot], list[reclaim.Demand]] | None = None,
    leaving: Mapping[str, str | None] | None = None,
    pod_groups: Mapping[str, str] | None = None,
    groups: Sequence[Raw] = (),
    budgets: Sequence[Raw] = (),
    refused: Mapping[str, str] | None = None,
) -> reclaim.Plan:
    """`groups`: native PodGroup objects in the snapshot; `pod_groups`: disruption modes given to the planner;
    `budgets`: PodDisruptionBudget objects in the snapshot."""
    config = settings_loader.load(overrides=overrides or {})
    cluster = snapshot_build.build(nodes=nodes, pods=pods, priority_classes=CLASSES, names=config.names, taken_at=NOW,
                                   pod_groups=groups, disruption_budgets=budgets)
    policies = policy.parse_all(cluster.priority_classes, default_threshold_percent=5.0)
    wanted = demands(cluster) if demands else reclaim.demands_from_snapshot(cluster)
    return reclaim.plan(cluster=cluster, policies=policies, assessments=assessments, demands=wanted,
                        state=state, config=config, now=NOW, leaving=leaving, pod_groups=pod_groups, refused=refused)


def reason_of(result: reclaim.Plan, pod: str) -> str:
    for eviction in result.evictions:
        if eviction.pod == pod:
            return eviction.reason
    return {s.pod: s.reason for s in result.spared}[pod]


def evicted(result: reclaim.Plan) -> set[tuple[str, str | None]]:
    return {(e.pod, e.preemptor) for e in result.evictions}


@pytest.mark.parametrize(
    ("pods", "assessments", "expected", "about", "reason"),
    [
        pytest.param(
            [running("idle-1", node="n1"), pending("train-7")], idle("team-a/idle-1"),
            {("team-a/idle-1", "team-b/train-7")}, "team-a/idle-1",
            "GPU utilisation 2.1% < 10% over 3600s; reclaimed for team-b/train-7 (priority 10000)",
            id="idle-pod-reclaimed-for-pending-pod",
        ),
        pytest.param(
            [running("busy-1", node="n1"), pending("train-7")], busy("team-a/busy-1"), set(), "team-a/busy-1",
            "not idle: GPU utilisation 50.0% >= 10% over 3600s", id="busy-pod-spared",
        ),
        pytest.param(
            [running("idle-1", node="n1"), pending("train-7")], {}, set(), "team-a/idle-1",
            "not idle: no utilisation reading this cycle", id="fail-closed-without-reading",
        ),
        pytest.param(
            [running("idle-1", node="n1"), pending("train-7")],
            {"team-a/idle-1": utilisation.failed("no DCGM series for the pod over 3600s")}, set(),
            "team-a/idle-1", "not idle: no DCGM series", id="fail-closed-no-series",
        ),
        pytest.param(
            [running("idle-1", node="n1")], idle("team-a/idle-1"), set(), "team-a/idle-1",
            "but no pending pod can use its GPUs", id="no-demand-no-eviction",
        ),
        pytest.param(
            [running("young", node="n1", created="2026-11-21T11:30:00Z"), pending("train-7")],
            idle("team-a/young"), set(), "team-a/young",
            "scheduled 1800s ago, needs more than 3600s", id="scheduled-too-recently",
        ),
        pytest.param(
            [running("sticky", node="n1", cls="sticky"), pending("train-7")], idle("team-a/sticky"), set(),
            "team-a/sticky", "PriorityClass sticky sets no idle window", id="class-without-window",
        ),
        pytest.param(
            [running("idle-1", node="n1"), pending("train-7", priority=4000)], idle("team-a/idle-1"), set(),
            "team-a/idle-1", "no pending pod can use", id="preemptor-below-minimum-preemptable",
        ),
        pytest.param(
            [running("idle-1", node="n1", cls="yielding"), pending("train-7", priority=600)],
            idle("team-a/idle-1"), {("team-a/idle-1", "team-b/train-7")}, "team-a/idle-1",
            "reclaimed for team-b/train-7 (priority 600)", id="minimum-lower-than-class-value",
        ),
        pytest.param(
            [running("idle-1", node="n1"), pending("train-7", preemption_policy="Never")],
            idle("team-a/idle-1"), set(), "team-a/idle-1", "no pending pod can use", id="preemptor-never",
        ),
    ],
)
def test_candidates_and_matching(
    pods: list[Raw], assessments: dict[str, utilisation.Assessment],
    expected: set[tuple[str, str | None]], about: str, reason: str,
) -> None:
    result = run(ONE, pods, assessments)
    assert evicted(result) == expected
    assert reason in reason_of(result, about)


@pytest.mark.parametrize(
    ("pod", "node", "reason"),
    [
        pytest.param(running("ds", node="n1", owner=("DaemonSet", "dcgm")), ONE, "owned by a DaemonSet",
                     id="daemonset"),
        pytest.param(running("static", node="n1", annotations={"kubernetes.io/config.mirror": "x"}), ONE,
                     "mirror (static) pod", id="mirror"),
        pytest.param(running("crit", node="n1", cls="system-node-critical"), ONE,
                     "system-critical PriorityClass system-node-critical", id="system-critical"),
        pytest.param(running("going", node="n1", deleting=True), ONE, "already terminating", id="terminating"),
        pytest.param(running("mine", node="n1", annotations={"gpu-steward.io/skip": "true"}), ONE,
                     "opted out by gpu-steward.io/skip='true'", id="skip-annotation"),
        pytest.param(running("mine", node="n1", labels={"gpu-steward.io/skip": "yes"}), ONE,
                     "opted out by gpu-steward.io/skip='yes'", id="skip-label"),
        pytest.param(running("mine", node="n1", annotations={
            "descheduler.alpha.kubernetes.io/prefer-no-eviction": ""}), ONE,
            "opted out by descheduler.alpha.kubernetes.io/prefer-no-eviction=''", id="prefer-no-eviction"),
        pytest.param(running("slice", node="m1", gpus=0, mig={"1g.10gb": 1}),
                     [mig_node("m1", profiles={"1g.10gb": 1}, state="pending")],
                     "node m1 has nvidia.com/mig.config.state=pending", id="mig-config-pending"),
    ],
)
def test_protections(pod: Raw, node: list[Raw], reason: str) -> None:
    key = f"team-a/{pod['metadata']['name']}"
    result = run(node, [pod, pending("want", gpus=0, mig={"1g.10gb": 1}), pending("want-full")], idle(key))
    assert evicted(result) == set()
    assert reason_of(result, key) == reason


@pytest.mark.parametrize(
    ("nodes", "pods", "assessments", "expected", "outcome"),
    [
        pytest.param(
            [mig_node("m1", profiles={"1g.10gb": 1, "3g.40gb": 1})],
            [running("small", node="m1", gpus=0, mig={"1g.10gb": 1}),
             running("big", node="m1", gpus=0, mig={"3g.40gb": 1}),
             pending("want", gpus=0, mig={"1g.10gb": 1})],
            idle("team-a/small", "team-a/big"), {("team-a/small", "team-b/want")}, "1 idle pod(s) evicted on m1",
            id="mig-same-profile-freed",
        ),
        pytest.param(
            [mig_node("m1", profiles={"1g.10gb": 1, "3g.40gb": 1})],
            [running("small", node="m1", gpus=0, mig={"1g.10gb": 1}),
             running("big", node="m1", gpus=0, mig={"3g.40gb": 1}),
             pending("want", gpus=0, mig={"3g.40gb": 1})],
            idle("team-a/small"), set(), "m1: its idle pods free no 1x MIG 3g.40gb",
            id="mig-other-profile-does-not-help",
        ),
        pytest.param(
            [mig_node("m1", profiles={"1g.10gb": 1})],
            [running("small", node="m1", gpus=0, mig={"1g.10gb": 1}), pending("want")],
            idle("team-a/small"), set(), "m1: requests more than the node has: nvidia.com/gpu 1 > 0",
            id="full-gpu-preemptor-not-on-mig-node",
        ),
        pytest.param(
            [builders.gpu_node("n1", gpus=4)],
            [running("a", node="n1", gpus=2, priority=100), running("b", node="n1", gpus=1, priority=50),
             running("c", node="n1", gpus=1, priority=10), pending("want", gpus=2)],
            idle("team-a/a", "team-a/b", "team-a/c"), {("team-a/a", "team-b/want")}, "1 idle pod(s)",
            id="minimal-set-one-big-victim",
        ),
        pytest.param(
            [builders.gpu_node("n1", gpus=4)],
            [running("a", node="n1", gpus=2, priority=100), running("b", node="n1", gpus=1, priority=50),
             running("c", node="n1", gpus=1, priority=10), pending("want", gpus=3)],
            idle("team-a/a", "team-a/b", "team-a/c"), {("team-a/a", "team-b/want"), ("team-a/c", "team-b/want")},
            "2 idle pod(s)", id="minimal-set-lowest-priority-filler",
        ),
        pytest.param(
            QUAD,
            QUAD_PODS,
            idle("team-a/a", "team-a/b", "team-a/c"), {("team-a/a", "team-b/want"), ("team-a/b", "team-b/want")},
            "2 idle pod(s)", id="nvlink-domain-drops-unneeded-victim",
        ),
        pytest.param(
            QUAD,
            QUAD_PODS,
            idle("team-a/a", "team-a/c"), set(), "needs 2 GPU in one NVLink domain",
            id="nvlink-split-domains-do-not-fit",
        ),
        pytest.param(
            [builders.gpu_node("n1", gpus=2)],
            [running("a", node="n1"), pending("want")], idle("team-a/a"), set(),
            "fits without evictions on n1", id="already-fits",
        ),
    ],
)
def test_matching(
    nodes: list[Raw], pods: list[Raw], assessments: dict[str, utilisation.Assessment],
    expected: set[tuple[str, str | None]], outcome: str,
) -> None:
    result = run(nodes, pods, assessments)
    assert evicted(result) == expected
    assert [o.reason for o in result.demands if outcome in o.reason], [o.reason for o in result.demands]


IDLE_GANG = [running("g-0", node="n1", labels=gang("g")), running("g-1", node="n2", labels=gang("g"))]


def launcher(*, gang_name: str = "g", phase: str = "Running", annotations: dict[str, str] | None = None) -> Raw:
    """A gang member without GPUs on a CPU node (not in the snapshot's GPU nodes), with no tier."""
    pod = running(f"{gang_name}-launcher", node="cpu-1", gpus=0, cls="", priority=0, labels=gang(gang_name),
                  annotations=annotations)
    pod["status"]["phase"] = phase
    return pod


def gang_demand(*pending_names: str) -> Callable[[snapshot.Snapshot], list[reclaim.Demand]]:
    def make(cluster: snapshot.Snapshot) -> list[reclaim.Demand]:
        return [reclaim.gang_demand("team-b/g", [cluster.pods[f"team-b/{n}"] for n in pending_names])]

    return make


@pytest.mark.parametrize(
    ("pods", "assessments", "demands", "expected", "about", "reason"),
    [
        pytest.param(
            [running("g-0", node="n1", labels=gang("g")), running("g-1", node="n2", labels=gang("g")),
             pending("want")],
            idle("team-a/g-0", "team-a/g-1"), None,
            {("team-a/g-0", "team-b/want"), ("team-a/g-1", "team-b/want")}, "team-a/g-1",
            "reclaimed for team-b/want (priority 10000); with its gang team-a/g", id="idle-gang-evicted-whole",
        ),
        pytest.param(
            [running("g-0", node="n1", labels=gang("g")), running("g-1", node="n2", labels=gang("g")),
             pending("want")],
            {**idle("team-a/g-0"), **busy("team-a/g-1")}, None, set(), "team-a/g-0",
            "gang team-a/g is reclaimed only as a whole: team-a/g-1 is not reclaimable (not idle",
            id="gang-with-busy-member-spared",
        ),
        pytest.param(
            [running("a", node="n1"), running("b", node="n2"), pending("w-0"), pending("w-1")],
            idle("team-a/a", "team-a/b"), gang_demand("w-0", "w-1"),
            {("team-a/a", "gang:team-b/g"), ("team-a/b", "gang:team-b/g")}, "team-a/b",
            "reclaimed for gang:team-b/g", id="gang-demand-placed-as-a-unit",
        ),
        pytest.param(
            [running("a", node="n1"), running("b", node="n2"), pending("w-0"), pending("w-1")],
            {**idle("team-a/a"), **busy("team-a/b")}, gang_demand("w-0", "w-1"), set(), "team-a/a",
            "no pending pod can use its GPUs", id="gang-demand-partly-placeable-takes-nothing",
        ),
        # A member without GPUs (an MPI launcher, no tier, on a CPU node) goes with its gang's idle GPU members.
        pytest.param(
            [*IDLE_GANG, launcher(), pending("want")], idle("team-a/g-0", "team-a/g-1"), None,
            {("team-a/g-0", "team-b/want"), ("team-a/g-1", "team-b/want"), ("team-a/g-launcher", "team-b/want")},
            "team-a/g-launcher", "requests no GPU, goes with its gang's idle GPU members; reclaimed for team-b/want "
            "(priority 10000); with its gang team-a/g", id="idle-gang-evicted-whole-with-its-launcher",
        ),
        pytest.param(
            [*IDLE_GANG, launcher(annotations={"descheduler.alpha.kubernetes.io/prefer-no-eviction": "true"}),
             pending("want")], idle("team-a/g-0", "team-a/g-1"), None, set(), "team-a/g-0",
            "gang team-a/g is reclaimed only as a whole: team-a/g-launcher is not reclaimable (opted out by "
            "descheduler.alpha.kubernetes.io/prefer-no-eviction='true')", id="protected-launcher-spares-its-gang",
        ),
        pytest.param(
            [*IDLE_GANG, launcher(phase="Pending"), pending("want")], idle("team-a/g-0", "team-a/g-1"), None, set(),
            "team-a/g-1", "team-a/g-launcher is not reclaimable (not running (phase Pending))",
            id="launcher-still-starting-spares-its-gang",
        ),
    ],
)
def test_gangs(
    pods: list[Raw], assessments: dict[str, utilisation.Assessment],
    demands: Callable[[snapshot.Snapshot], list[reclaim.Demand]] | None,
    expected: set[tuple[str, str | None]], about: str, reason: str,
) -> None:
    result = run(TWO, pods, assessments, demands=demands)
    assert evicted(result) == expected
    assert reason in reason_of(result, about)


COOLING = NOW + 100


@pytest.mark.parametrize(
    ("state", "expected", "reason"),
    [
        pytest.param(cooldowns.State({"preemptor:team-b/want": COOLING}), set(), "preemptor cooldown for 100s more",
                     id="preemptor-cooldown"),
        pytest.param(cooldowns.State({"node:n1": COOLING}), {("team-a/b", "team-b/want")}, None,
                     id="node-cooldown-moves-to-other-node"),
        pytest.param(cooldowns.State({"workload:team-a/ReplicaSet/rs-a": COOLING}), {("team-a/b", "team-b/want")},
                     None, id="workload-cooldown"),
        pytest.param(cooldowns.State({"node:n1": NOW - 1}), {("team-a/a", "team-b/want")}, None,
                     id="expired-cooldown-ignored"),
    ],
)
def test_cooldowns(state: cooldowns.State, expected: set[tuple[str, str]], reason: str | None) -> None:
    pods = [running("a", node="n1", owner=("ReplicaSet", "rs-a"), priority=10),
            running("b", node="n2", owner=("ReplicaSet", "rs-b"), priority=20), pending("want")]
    result = run(TWO, pods, idle("team-a/a", "team-a/b"), state=state)
    assert evicted(result) == expected
    if reason:
        assert [o.reason for o in result.demands] == [reason]
    spared = {s.pod: s.reason for s in result.spared}
    if "node:n1" in state.until and state.until["node:n1"] > NOW:
        assert spared["team-a/a"] == "node cooldown for 100s more"
    if "workload:team-a/ReplicaSet/rs-a" in state.until:
        assert spared["team-a/a"] == "workload cooldown for 100s more"


def test_cooldown_record_merges_and_expires() -> None:
    config = settings.Cooldowns(preemptor_seconds=30, node_seconds=300, workload_seconds=0)
    before = cooldowns.State({"node:old": NOW - 1, "node:n1": NOW + 1000})
    after = cooldowns.record(before, preemptors=["team-b/want"], nodes=["n1", "n2"],
                             workloads=["workload:team-a/Job/j"], config=config, now=NOW)
    assert after.until == {"preemptor:team-b/want": NOW + 30, "node:n1": NOW + 1000, "node:n2": NOW + 300}
    assert cooldowns.decode(cooldowns.encode(after)) == (after, None)
    assert cooldowns.decode("[1]") == (cooldowns.State(), "cooldown annotation ignored: not a JSON object")


LIMIT_PODS = [
    running("a", node="n1", gpus=1, namespace="team-a"), running("b", node="n1", gpus=1, namespace="team-c"),
    running("c", node="n2", gpus=1, namespace="team-a"), running("d", node="n2", gpus=1, namespace="team-c"),
    pending("w1", gpus=2), pending("w2", gpus=2),
]


@pytest.mark.parametrize(
    ("limits", "evictions", "reason"),
    [
        pytest.param({"per_cycle": 10, "per_node": 2, "per_namespace": 5}, 4, None, id="within-limits"),
        pytest.param({"per_cycle": 3, "per_node": 2, "per_namespace": 5}, 2,
                     "per-cycle limit of 3 eviction decisions reached", id="per-cycle"),
        pytest.param({"per_cycle": 10, "per_node": 1, "per_namespace": 5}, 0,
                     "per-node limit of 1 eviction decisions reached on n", id="per-node"),
        pytest.param({"per_cycle": 10, "per_node": 2, "per_namespace": 1}, 2,
                     "per-namespace limit of 1 eviction decisions reached in team-", id="per-namespace"),
    ],
)
def test_limits(limits: dict[str, int], evictions: int, reason: str | None) -> None:
    nodes = [builders.gpu_node("n1", gpus=2), builders.gpu_node("n2", gpus=2)]
    result = run(nodes, LIMIT_PODS, idle("team-a/a", "team-c/b", "team-a/c", "team-c/d"),
                 overrides={"descheduler": {"reclaim": {"limits": limits}}})
    assert len(result.evictions) == evictions
    if reason:
        assert any(reason in o.reason for o in result.demands), [o.reason for o in result.demands]


def test_spent_cycle_budget_is_the_reason_for_later_demands() -> None:
    nodes = [builders.gpu_node("n1", gpus=2), builders.gpu_node("n2", gpus=2)]
    result = run(nodes, LIMIT_PODS, idle("team-a/a", "team-c/b", "team-a/c", "team-c/d"),
                 overrides={"descheduler": {"reclaim": {"limits": {"per_cycle": 2}}}})
    assert [(o.demand, o.served, o.reason) for o in result.demands] == [
        ("team-b/w1", True, "2 idle pod(s) evicted on n1"),
        ("team-b/w2", False, "no node can hold it: team-b/w2: per-cycle limit of 2 eviction decisions reached"),
    ]


def test_windows_needed_groups_screened_pods_by_idle_window() -> None:
    config = settings_loader.load()
    pods = [running("a", node="n1"), running("b", node="n1", cls="yielding"), running("c", node="n1", cls="sticky"),
            running("d", node="n1", deleting=True), pending("w")]
    cluster = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=4)], pods=pods, priority_classes=CLASSES,
                                   names=config.names, taken_at=NOW)
    policies = policy.parse_all(cluster.priority_classes, default_threshold_percent=5.0)
    screened = reclaim.screen_all(cluster, policies=policies, state=NO_COOLDOWNS, config=config, now=NOW)
    assert {k: v if isinstance(v, str) else v.class_name for k, v in screened.items()} == {
        "team-a/a": "batch", "team-a/b": "yielding", "team-a/c": "PriorityClass sticky sets no idle window",
        "team-a/d": "already terminating",
    }
    assert reclaim.windows_needed(screened) == {3600: ["team-a/a", "team-a/b"]}


def test_mode_always_needs_no_preemptor_and_honours_limits() -> None:
    pods = [running("a", node="n1", priority=5), running("b", node="n2", priority=9),
            running("c", node="n2", priority=1, cls="sticky")]
    result = run(TWO, pods, idle("team-a/a", "team-a/b", "team-a/c"),
                 overrides={"descheduler": {"reclaim": {"mode": "always", "limits": {"per_cycle": 1}}}})
    assert evicted(result) == {("team-a/a", None)}
    assert reason_of(result, "team-a/a").endswith("mode always, no preemptor needed")
    assert reason_of(result, "team-a/b") == "idle but spared: per-cycle limit of 1 eviction decisions reached"
    assert reason_of(result, "team-a/c") == "PriorityClass sticky sets no idle window"


ALWAYS = {"descheduler": {"reclaim": {"mode": "always"}}}


@pytest.mark.parametrize(
    ("pods", "assessments", "overrides", "expected", "about", "reason"),
    [
        pytest.param(
            [running("idle-1", node="n1"), builders.pod("g-0", namespace="team-a", gpus=1, labels=gang("g")),
             launcher()], idle("team-a/idle-1"), ALWAYS, {"team-a/idle-1"}, "team-a/idle-1",
            "mode always, no preemptor needed", id="launcher-of-a-gang-holding-no-gpu-is-never-a-victim",
        ),
        pytest.param(
            [*IDLE_GANG, launcher()], idle("team-a/g-0", "team-a/g-1"),
            {"descheduler": {"reclaim": {"mode": "always", "limits": {"per_cycle": 1, "per_node": 1}}}},
            {"team-a/g-0", "team-a/g-1", "team-a/g-launcher"}, "team-a/g-0", "mode always",
            id="a-gang-with-its-launcher-is-one-decision",
        ),
        pytest.param(
            [*IDLE_GANG, launcher()], idle("team-a/g-0", "team-a/g-1"),
            {"descheduler": {"reclaim": {"mode": "always", "limits": {"per_cycle": 0}}}}, set(), "team-a/g-0",
            "idle but spared: per-cycle limit of 0 eviction decisions reached; spares the whole gang team-a/g",
            id="a-limit-spares-the-whole-gang-and-says-so",
        ),
    ],
)
def test_members_without_gpus_go_only_with_their_gang(
    pods: list[Raw], assessments: dict[str, utilisation.Assessment], overrides: dict[str, Any],
    expected: set[str], about: str, reason: str,
) -> None:
    result = run(TWO, pods, assessments, overrides=overrides)
    assert {e.pod for e in result.evictions} == expected
    assert reason in reason_of(result, about)
    assert result.candidates == len(assessments), "a pod without GPUs is never measured nor a candidate"


def test_a_launcher_goes_after_its_gpu_members_and_reports_no_utilisation() -> None:
    """GPU members first: the evictor stops a unit at its first member not evicted."""
    result = run(TWO, [*IDLE_GANG, launcher()], idle("team-a/g-0", "team-a/g-1"), overrides=ALWAYS)
    assert [(e.pod, e.unit, e.utilization, e.window_seconds) for e in result.evictions] == [
        ("team-a/g-0", "gang:team-a/g", 2.1, 3600), ("team-a/g-1", "gang:team-a/g", 2.1, 3600),
        ("team-a/g-launcher", "gang:team-a/g", None, None)]
    assert reason_of(result, "team-a/g-launcher") == (
        "requests no GPU, goes with its gang's idle GPU members; mode always, no preemptor needed; "
        "with its gang team-a/g")
    assert result.as_json()["evictions"][-1]["utilization"] is None


def test_plan_json_shape() -> None:
    result = run(ONE, [running("idle-1", node="n1"), pending("train-7")], idle("team-a/idle-1"))
    assert result.as_json() == {
        "evictions": [{
            "pod": "team-a/idle-1", "node": "n1", "preemptor": "team-b/train-7", "utilization": 2.1,
            "threshold": 10.0, "window_seconds": 3600,
            "reason": "GPU utilisation 2.1% < 10% over 3600s; reclaimed for team-b/train-7 (priority 10000)",
        }],
        "spared": [],
    }


def test_gated_pods_are_not_single_demands() -> None:
    gated = pending("held")
    gated["spec"]["schedulingGates"] = [{"name": "gpu-steward.io/gang"}]
    cluster = snapshot_build.build(nodes=ONE, pods=[gated, pending("free")], names=settings.Names(), taken_at=NOW)
    assert [d.key for d in reclaim.demands_from_snapshot(cluster)] == ["team-b/free"]
    demand = reclaim.gang_demand("team-b/g", [cluster.pods["team-b/held"], cluster.pods["team-b/free"]])
    assert dataclasses.astuple(demand)[0] == "gang:team-b/g"


# --- The fast victim search decides exactly as the plain one ----------------------------------------


def reference_best_node(
    index: Any, member: reclaim.Member, demand: reclaim.Demand, trial: dict[str, Any], taken: set[str],
    budget: limits.Budget, spared: dict[str, str],
) -> Any:
    """The rule as written: every allowed node gets the full minimal-victim-set search; cheapest wins."""
    cluster, request = index.cluster, member.request
    best = None
    for name, node in sorted(cluster.nodes.items()):
        if capacity.never(member.spec, member.requests, node) or (request.full and node.allocatable.mig):
            continue
        eligible = [
            u for u in index.by_node.get(name, ()) if u.key not in taken
            and any(p.request.full if request.full else set(p.request.mig) & set(request.mig) for p in u.on(name))
            and demand.priority >= u.minimum_preemptable and budget.refuse([u]) is None
        ]
        choice = search.minimal_set(node, member, eligible, cluster, trial.get(name) or search.NodeState())
        if not isinstance(choice, str) and (best is None or choice.cost() < best.cost()):
            best = choice
    return best or "no node fits"


# Preemptor priorities: on each class floor (yielding 500, batch 5000, recreated: a victim's own priority + 1 with
# victims at 5..100), one below and one above, so that `>=` against a floor is exercised both ways.
PRIORITIES = [499, 500, 501, 600, 4000, 4999, 5000, 5001, 10000, 6, 11, 31, 101, 100]


def random_cluster(
    rng: random.Random, *, most_nodes: int
) -> tuple[list[Raw], list[Raw], dict[str, utilisation.Assessment], list[Raw]]:
    """Full-GPU and MIG nodes filled with pods of random size, class, priority, age, owner and gang;
    a random share of them idle; pending pods and a gated gang of random size and priority."""
    nodes: list[Raw] = []
    pods: list[Raw] = []
    for n in range(rng.randint(1, most_nodes)):
        name = f"n{n}"
        if rng.random() < 0.25:
            profiles = {"1g.10gb": rng.randint(1, 4), "3g.40gb": rng.randint(0, 2)}
            nodes.append(mig_node(name, profiles=profiles))
            slots = [p for p, c in profiles.items() for _ in range(c)]
            sizes = [{p: 1} for p in slots if rng.random() < 0.8]
        else:
            gpus = rng.choice([1, 2, 4, 8])
            cut = rng.randint(1, gpus)
            domains = [range(cut), range(cut, gpus)] if cut < gpus else [range(gpus)]
            taint = rng.random() < 0.15

            def mutate(body: Raw, taint: bool = taint) -> None:
                if taint:
                    body["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]

            nodes.append(builders.gpu_node(name, gpus=gpus, domains=domains, mutate=mutate,
                                           topology=rng.choice(["labels", "annotation", "none"])))
            left, sizes = gpus - rng.randint(0, 1), []
            while left > 0:
                take = rng.randint(1, min(4, left))
                sizes.append({"": take})
                left -= take
        for size in sizes:
            i = len(pods)
            gang_labels = gang(f"g{i % 3}") if rng.random() < 0.15 else None
            pods.append(running(
                f"p{i}", node=name, gpus=size.get("", 0), mig={k: v for k, v in size.items() if k} or None,
                cls=rng.choice(["batch", "yielding", "yielding", "sticky", "recreated"]),
                priority=rng.choice([5, 10, 30, 100]),
                namespace=rng.choice(["team-a", "team-c"]), created=f"2026-11-21T0{rng.randint(0, 9)}:00:00Z",
                owner=("ReplicaSet", f"rs-{rng.randint(0, 3)}") if rng.random() < 0.5 else None, labels=gang_labels,
            ))
    assessments = idle(*(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods if rng.random() < 0.7))
    waiting = [
        pending(f"w{i}", gpus=0 if mig else rng.choice([1, 1, 2, 3, 4, 8]), mig={mig: 1} if mig else None,
                priority=rng.choice(PRIORITIES), preemption_policy="Never" if rng.random() < 0.1 else None)
        for i in range(rng.randint(0, most_nodes)) for mig in [rng.choice([None, None, None, "1g.10gb", "3g.40gb"])]
    ]
    gated = [pending(f"g{i}", gpus=rng.choice([1, 2]), priority=rng.choice(PRIORITIES))
             for i in range(rng.choice([0, 0, 2, 3]))]
    for pod in gated:
        pod["spec"]["schedulingGates"] = [{"name": "gpu-steward.io/gang"}]
    return nodes, pods + waiting + gated, assessments, gated


@pytest.mark.parametrize(("seed", "most_nodes"), [*((s, 7) for s in range(300)), *((s, 40) for s in range(300, 320))])
def test_fast_search_decides_as_the_plain_one(seed: int, most_nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    nodes, pods, assessments, gated = random_cluster(rng, most_nodes=most_nodes)
    limits = {"per_cycle": rng.choice([2, 5, 100]), "per_node": rng.choice([1, 2, 10]),
              "per_namespace": rng.choice([1, 3, 100])}
    state = cooldowns.State({f"node:n{rng.randint(0, most_nodes)}": COOLING} if rng.random() < 0.2 else {})

    def demands(cluster: snapshot.Snapshot) -> list[reclaim.Demand]:
        gang_pods = [cluster.pods[f"team-b/{g['metadata']['name']}"] for g in gated]
        return reclaim.demands_from_snapshot(cluster) + ([reclaim.gang_demand("team-b/g", gang_pods)] if gated else [])

    def decide() -> tuple[Any, ...]:
        result = run(nodes, pods, assessments, overrides={"descheduler": {"reclaim": {"limits": limits}}},
                     state=state, demands=demands)
        # A demand nobody can serve lists a few nodes' reasons; which few is the search's business.
        outcomes = [(o.demand, o.served, o.victims, o.reason if o.served else None) for o in result.demands]
        # So does whether an idle pod left alone is told a limit kept it from a node the search looked at.
        spared = [(s.pod, "idle, left" if s.reason.startswith(("idle (", "idle but spared: per-")) else s.reason)
                  for s in result.spared]
        return result.evictions, spared, outcomes

    fast = decide()
    monkeypatch.setattr(search, "best_node", reference_best_node)
    assert fast == decide()



def _untouched_both_ways(seed: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """A random plan in which every `Index.untouched` answer is compared with the former path's, which screened
    every node exactly before sorting; returns how many options were compared."""
    rng = random.Random(seed)
    nodes, pods, assessments, gated = random_cluster(rng, most_nodes=rng.choice([7, 40]))
    lazy = search.Index.untouched
    compared = []

    def both(index: search.Index, member: reclaim.Member, priority: int, *, evicting: bool,
             skip: frozenset[str] | set[str] = frozenset()) -> Any:
        new = list(lazy(index, member, priority, evicting=evicting, skip=skip))
        maybe = index._may_hold(member.request, evicting=evicting)
        screened = (search._screen(index, name, member, priority) if name in maybe else None
                    for name in index.nodes_for(member))
        old = [o for o in sorted(o for o in screened if isinstance(o, search.Option)) if o.node not in skip]
        assert [(o.bound, o.units, o.free) for o in new] == [(o.bound, o.units, o.free) for o in old], seed
        compared.append(len(old))
        return iter(new)

    def demands(cluster: snapshot.Snapshot) -> list[reclaim.Demand]:
        gang_pods = [cluster.pods[f"team-b/{g['metadata']['name']}"] for g in gated]
        return reclaim.demands_from_snapshot(cluster) + ([reclaim.gang_demand("team-b/g", gang_pods)] if gated else [])

    with monkeypatch.context() as patch:
        patch.setattr(search.Index, "untouched", both)
        run(nodes, pods, assessments, demands=demands)
    return sum(compared)


def test_untouched_options_checked_when_reached_are_those_checked_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Index.untouched` checks a node's capacity exactly only when a search reaches its option: the options it
    yields, in order, are those the former path kept, on random clusters (and they are not all empty)."""
    assert sum(_untouched_both_ways(seed, monkeypatch) for seed in range(120)) > 200
