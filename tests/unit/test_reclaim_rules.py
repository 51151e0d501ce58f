"""The reclaim planner's documented rules, each a table with a row that matches, one that does not and one on
the boundary (issue 21, items 3, 6 and 7), and the issue's wrong evictions in the planner's scope, each a row
that failed before the fix. Every row asserts the decision and its reason."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from common import settings, snapshot_build
from descheduler import reclaim
from tests import builders
from tests.unit.test_reclaim_planner import (
    NOW,
    ONE,
    TWO,
    Raw,
    evicted,
    gang,
    idle,
    pending,
    reason_of,
    run,
    running,
)

WANT = "team-b/want"
GPU_SHORT = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def outcome(plan: reclaim.Plan, demand: str = WANT) -> str:
    return {o.demand: o.reason for o in plan.demands}[demand]


def want(*, priority: int = 10000, message: str | None = GPU_SHORT, spec: dict[str, Any] | None = None,
         annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
         deletion: str | None = None, name: str = "want", created: str | None = None) -> Raw:
    """A pending 1-GPU pod kube-scheduler turned away for a GPU shortage, with extra spec fields."""
    pod = pending(name, priority=priority)
    if message is not None:
        pod["status"]["conditions"][0]["message"] = message
    pod["spec"].update(spec or {})
    if annotations:
        pod["metadata"]["annotations"] = annotations
    if labels:
        pod["metadata"]["labels"] = labels
    if deletion is not None:
        pod["metadata"]["deletionTimestamp"] = deletion
    if created:
        pod["metadata"]["creationTimestamp"] = created
    return pod


def ago(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(NOW - seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ANTI = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}
AFFINITY = {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}
PREFERRED_ANTI = {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                                       "topologyKey": "kubernetes.io/hostname"}}]}}}
SPREAD = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                         "labelSelector": {"matchLabels": {"app": "db"}}}]}
SOFT_SPREAD = {"topologySpreadConstraints": [{**SPREAD["topologySpreadConstraints"][0],
                                              "whenUnsatisfiable": "ScheduleAnyway"}]}
PIN = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}
SERVED = {("team-a/idle", WANT)}


@pytest.mark.parametrize(
    ("pending_pod", "expected", "reason"),
    [
        # Why: "Insufficient nvidia.com/gpu" hides the pod affinity that keeps the pod off the node anyway.
        pytest.param(want(spec=AFFINITY), set(), "team-b/want has constraints the capacity model does not evaluate "
                     "(required podAffinity (not modelled)): freeing GPUs may not let it run",
                     id="why-hidden-pod-affinity-behind-gpu-shortage"),
        pytest.param(want(spec=AFFINITY, message=None), set(), "required podAffinity (not modelled)",
                     id="unevaluated-constraints-veto-even-without-a-message"),
        # Its own required anti-affinity is evaluated (tests/unit/test_reclaim_anti_affinity.py): met on n1 here.
        pytest.param(want(spec=ANTI), SERVED, "1 idle pod(s) evicted on n1", id="own-anti-affinity-met-is-a-demand"),
        pytest.param(want(spec=SPREAD), set(), "topologySpreadConstraints DoNotSchedule (not modelled)",
                     id="hard-topology-spread-is-no-demand"),
        pytest.param(want(spec=PREFERRED_ANTI), SERVED, "1 idle pod(s) evicted on n1",
                     id="boundary-preferred-anti-affinity-is-a-demand"),
        pytest.param(want(spec=SOFT_SPREAD), SERVED, "1 idle pod(s) evicted on n1",
                     id="boundary-soft-topology-spread-is-a-demand"),
        pytest.param(want(), SERVED, "1 idle pod(s) evicted on n1", id="gpu-shortage-alone-is-a-demand"),
        # The message may veto, never enable: our capacity model must find the node too.
        pytest.param(want(spec={"nodeSelector": {"pool": "other"}}), set(),
                     "no node can hold it: team-b/want: n1: nodeSelector pool=other does not match",
                     id="message-never-enables-a-node-the-model-rules-out"),
        # Released without a pin (placed elsewhere than planned, or unplaced): nothing holds it to one node, so it is
        # a demand like any other (release's recovery that used to re-gate such pods is gone).
        pytest.param(want(annotations={"gpu-steward.io/release": "2026-11-28T00:00:00Z unplaced"}), SERVED,
                     "1 idle pod(s) evicted on n1", id="released-unplaced-and-pending-is-a-demand"),
        pytest.param(want(spec=PIN, labels=gang("g")), set(),
                     "gang member pinned to n1 at release and not bound: release reports it",
                     id="gang-member-pinned-and-stuck-is-no-demand"),
        pytest.param(want(spec=PIN), SERVED, "1 idle pod(s) evicted on n1",
                     id="boundary-a-users-own-pin-is-a-demand-there"),
    ],
)
def test_a_demand_is_checked_by_the_capacity_model(pending_pod: Raw, expected: set[tuple[str, str]],
                                                    reason: str) -> None:
    plan = run(ONE, [running("idle", node="n1"), pending_pod], idle("team-a/idle"))
    assert evicted(plan) == expected
    assert reason in outcome(plan)


def port_holder(port: int, *, anti: dict[str, Any] | None = None) -> Raw:
    """A busy pod on n1 that is no victim (no GPU), holding a host port and, optionally, anti-affinity."""
    def mutate(body: Raw) -> None:
        body["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
        body["spec"].update(anti or {})

    return builders.pod("web", namespace="team-b", node="n1", phase="Running", mutate=mutate)


WANTS_PORT = {"containers": [{"name": "main", "image": "x", "ports": [{"containerPort": 8080, "hostPort": 8080}],
                              "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
HOSTNAMED = [builders.gpu_node("n1", gpus=1, labels={"kubernetes.io/hostname": "n1"})]  # the terms' topology
AGAINST_WANT = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "want"}}, "topologyKey": "kubernetes.io/hostname"}]}}}


@pytest.mark.parametrize(
    ("holder", "pending_pod", "expected", "reason"),
    [
        # The filters that read the pods holding the node (NodePorts, existing pods' anti-affinity): evicting the
        # idle GPU pod would not let the pending pod run where another pod keeps its port or rules it out.
        pytest.param(port_holder(8080), want(spec=WANTS_PORT), set(), "n1: host port 8080/TCP in use",
                     id="host-port-taken-by-another-pod-is-no-demand-there"),
        pytest.param(port_holder(9090), want(spec=WANTS_PORT), SERVED, "1 idle pod(s) evicted on n1",
                     id="boundary-another-host-port-is-a-demand"),
        pytest.param(port_holder(9090, anti=AGAINST_WANT), want(labels={"app": "want"}), set(),
                     "n1: pod team-b/web", id="existing-pods-anti-affinity-against-it-is-no-demand-there"),
        pytest.param(port_holder(9090, anti=AGAINST_WANT), want(labels={"app": "other"}), SERVED,
                     "1 idle pod(s) evicted on n1", id="boundary-anti-affinity-selecting-others-is-a-demand"),
    ],
)
def test_a_demand_is_checked_against_the_pods_holding_the_node(holder: Raw, pending_pod: Raw,
                                                               expected: set[tuple[str, str]], reason: str) -> None:
    plan = run(HOSTNAMED, [running("idle", node="n1"), holder, pending_pod], idle("team-a/idle"))
    assert evicted(plan) == expected
    assert reason in outcome(plan)


@pytest.mark.parametrize(
    ("pending_priority", "expected"),
    [
        # Why: the class was re-created with value 10; the victim was admitted at 1000 and keeps that floor.
        pytest.param(500, set(), id="why-class-re-created-lower-lets-no-lower-pod-evict"),
        pytest.param(1000, set(), id="boundary-equal-priority-does-not-evict"),
        pytest.param(1001, SERVED, id="boundary-own-priority-plus-one-evicts"),
    ],
)
def test_default_minimum_preemptable_is_the_victims_own_priority_plus_one(
    pending_priority: int, expected: set[tuple[str, str]]
) -> None:
    plan = run(ONE, [running("idle", node="n1", cls="recreated", priority=1000), want(priority=pending_priority)],
               idle("team-a/idle"))
    assert evicted(plan) == expected
    if not expected:
        assert outcome(plan) == "no node can hold it: team-b/want: n1: its 1 idle pod(s) need a preemptor " \
                                "priority >= 1001"


# --- Item 7: the documented rules no test caught ----------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "expected", "outcomes"),
    [
        pytest.param([want(name="low", priority=6000, created="2026-11-21T11:00:00Z"),
                      want(name="high", priority=9000, created="2026-11-21T11:55:00Z")],
                     {("team-a/idle", "team-b/high")}, ["team-b/high", "team-b/low"],
                     id="higher-priority-served-first-though-younger"),
        pytest.param([want(name="high", priority=9000, created="2026-11-21T11:00:00Z"),
                      want(name="low", priority=6000, created="2026-11-21T11:55:00Z")],
                     {("team-a/idle", "team-b/high")}, ["team-b/high", "team-b/low"],
                     id="higher-priority-served-first-and-older"),
        pytest.param([want(name="young", priority=9000, created="2026-11-21T11:55:00Z"),
                      want(name="old", priority=9000, created="2026-11-21T11:00:00Z")],
                     {("team-a/idle", "team-b/old")}, ["team-b/old", "team-b/young"],
                     id="boundary-equal-priority-older-first"),
    ],
)
def test_demands_are_served_highest_priority_first(pods: list[Raw], expected: set[tuple[str, str]],
                                                   outcomes: list[str]) -> None:
    plan = run(ONE, [running("idle", node="n1"), *pods], idle("team-a/idle"))
    assert evicted(plan) == expected
    assert [o.demand for o in plan.demands] == outcomes
    assert plan.demands[0].served and not plan.demands[1].served


def gang_of(*priorities: int) -> tuple[list[Raw], Any]:
    """A gated gang demand of 1-GPU members with these priorities."""
    pods = [want(name=f"w-{i}", priority=p) for i, p in enumerate(priorities)]

    def make(cluster: Any) -> list[reclaim.Demand]:
        return [reclaim.gang_demand("team-b/g", [cluster.pods[f"team-b/w-{i}"] for i in range(len(priorities))])]

    return pods, make


@pytest.mark.parametrize(
    ("priorities", "served"),
    [
        pytest.param((10000, 10000), True, id="every-member-above-the-floor"),
        pytest.param((10000, 4999), False, id="weakest-member-below-the-floor-holds-the-gang-back"),
        pytest.param((10000, 5000), True, id="boundary-weakest-member-at-the-floor"),
    ],
)
def test_a_gang_demand_is_only_as_strong_as_its_weakest_member(priorities: tuple[int, ...], served: bool) -> None:
    """The victims' class `batch` sets minimum-preemptable-priority 5000."""
    pods, make = gang_of(*priorities)
    plan = run(TWO, [running("a", node="n1"), running("b", node="n2"), *pods], idle("team-a/a", "team-a/b"),
               demands=make)
    assert [(o.priority, o.served) for o in plan.demands] == [(min(priorities), served)]
    if served:
        assert evicted(plan) == {("team-a/a", "gang:team-b/g"), ("team-a/b", "gang:team-b/g")}
    else:
        assert evicted(plan) == set()
        assert "need a preemptor priority >= 5000" in plan.demands[0].reason


@pytest.mark.parametrize(
    ("pending_priority", "served"),
    [
        pytest.param(5001, True, id="clears-every-members-floor"),
        pytest.param(4999, False, id="clears-one-members-floor-only"),
        pytest.param(5000, True, id="boundary-at-the-highest-members-floor"),
    ],
)
def test_a_gang_of_victims_needs_a_preemptor_clearing_every_members_floor(pending_priority: int,
                                                                          served: bool) -> None:
    """g-0's class `batch` has floor 5000, g-1's class `yielding` 500: the gang goes only for >= 5000 (evicting
    it evicts g-0 too, whose class forbids that to a lower pod)."""
    pods = [running("g-0", node="n1", labels=gang("g")), running("g-1", node="n2", labels=gang("g"), cls="yielding"),
            want(priority=pending_priority)]
    plan = run(TWO, pods, idle("team-a/g-0", "team-a/g-1"))
    assert evicted(plan) == ({("team-a/g-0", WANT), ("team-a/g-1", WANT)} if served else set())
    if not served:
        assert "need a preemptor priority >= 5000" in outcome(plan)


@pytest.mark.parametrize(
    ("pending_priority", "served"),
    [
        pytest.param(5001, True, id="above-the-minimum"),
        pytest.param(4999, False, id="below-the-minimum"),
        pytest.param(5000, True, id="boundary-exactly-at-the-minimum-is-served"),
    ],
)
def test_a_demand_at_the_minimum_preemptable_priority_is_served(pending_priority: int, served: bool) -> None:
    plan = run(ONE, [running("idle", node="n1"), want(priority=pending_priority)], idle("team-a/idle"))
    assert evicted(plan) == (SERVED if served else set())
    assert outcome(plan) == ("1 idle pod(s) evicted on n1" if served else "no node can hold it: team-b/want: n1: its 1 "
                             "idle pod(s) need a preemptor priority >= 5000")


@pytest.mark.parametrize(
    ("seconds", "served", "reason"),
    [
        pytest.param(3601, True, "reclaimed for team-b/want", id="scheduled-more-than-a-window-ago"),
        pytest.param(3599, False, "scheduled 3599s ago, needs more than 3600s (toleration and idle window)",
                     id="scheduled-less-than-a-window-ago"),
        pytest.param(3600, False, "scheduled 3600s ago, needs more than 3600s (toleration and idle window)",
                     id="boundary-scheduled-exactly-one-window-ago-is-not-reclaimed"),
    ],
)
def test_a_pod_scheduled_exactly_one_idle_window_ago_is_not_reclaimed(seconds: int, served: bool,
                                                                      reason: str) -> None:
    plan = run(ONE, [running("idle", node="n1", created=ago(seconds)), want()], idle("team-a/idle"))
    assert evicted(plan) == (SERVED if served else set())
    assert reason in reason_of(plan, "team-a/idle")


@pytest.mark.parametrize(
    ("deletion", "demands"),
    [
        pytest.param(None, [WANT], id="pending-pod-is-a-demand"),
        pytest.param("2026-11-21T11:59:00Z", [], id="terminating-pending-pod-is-no-demand"),
        pytest.param("", [WANT], id="boundary-empty-deletion-timestamp-is-not-terminating"),
    ],
)
def test_a_terminating_pending_pod_is_no_demand(deletion: str | None, demands: list[str]) -> None:
    plan = run(ONE, [running("idle", node="n1"), want(deletion=deletion)], idle("team-a/idle"))
    assert [o.demand for o in plan.demands] == demands
    assert evicted(plan) == (SERVED if demands else set())


def held_pods(count: int) -> list[Raw]:
    """Pods without GPUs on n1, each taking a pod slot."""
    return [builders.pod(f"side-{i}", namespace="team-a", node="n1", phase="Running") for i in range(count)]


def slots(pods: int) -> list[Raw]:
    def mutate(body: Raw) -> None:
        body["status"]["allocatable"]["pods"] = str(pods)

    return [builders.gpu_node("n1", gpus=1, mutate=mutate)]


@pytest.mark.parametrize(
    ("allocatable_pods", "others", "served", "reason"),
    [
        pytest.param(2, 1, True, "1 idle pod(s) evicted on n1", id="full-node-the-victims-slot-is-freed"),
        pytest.param(2, 2, False, "Too many pods", id="over-full-node-one-slot-freed-is-not-enough"),
        pytest.param(3, 2, True, "1 idle pod(s) evicted on n1", id="boundary-exactly-the-victims-slot-left"),
    ],
)
def test_evicting_a_pod_frees_its_pod_slot(allocatable_pods: int, others: int, served: bool, reason: str) -> None:
    plan = run(slots(allocatable_pods), [running("idle", node="n1"), *held_pods(others), want()],
               idle("team-a/idle"))
    assert evicted(plan) == (SERVED if served else set())
    assert reason in outcome(plan)


def cpu(limit: str, *, request: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": "1", "cpu": limit}}
    if request is not None:
        resources["requests"] = {"cpu": request}
    return {"containers": [{"name": "main", "image": "cuda:12", "resources": resources}]}


def cpu_hog() -> Raw:
    """Holds 8 of n1's 64 CPUs."""
    def mutate(body: Raw) -> None:
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "8"}}

    return builders.pod("hog", namespace="team-a", node="n1", phase="Running", mutate=mutate)


@pytest.mark.parametrize(
    ("spec", "served"),
    [
        pytest.param(cpu("50"), True, id="limit-within-free-cpu"),
        pytest.param(cpu("57"), False, id="limit-without-request-counts-as-request"),
        pytest.param(cpu("56"), True, id="boundary-limit-exactly-the-free-cpu"),
        pytest.param(cpu("57", request="8"), True, id="an-explicit-request-wins-over-the-limit"),
    ],
)
def test_limits_without_requests_count_as_requests(spec: dict[str, Any], served: bool) -> None:
    plan = run(ONE, [running("idle", node="n1"), cpu_hog(), want(spec=spec, message=None)], idle("team-a/idle"))
    assert evicted(plan) == (SERVED if served else set())
    assert ("1 idle pod(s) evicted on n1" if served else "Insufficient cpu") in outcome(plan)


# --- Item 4: PodDisruptionBudgets in the plan -------------------------------------------------------------


def pdb(match: dict[str, str] | None = None, *, allowed: int | None = 0, name: str = "db",
        namespace: str = "team-a") -> Raw:
    return builders.disruption_budget(name, namespace=namespace, match={"app": "db"} if match is None else match,
                                      allowed=allowed)


DB = {"app": "db"}


@pytest.mark.parametrize(
    ("budgets", "expected", "about", "reason"),
    [
        # Why: the PDB'd pod on n1 was chosen every cycle (n1 sorts first) and refused; n2's was never tried.
        pytest.param([pdb(allowed=0)], {("team-c/b", WANT)}, "team-a/a",
                     "idle but spared: PodDisruptionBudget team-a/db allows 0 disruption(s); evicting team-a/a needs 1",
                     id="why-budget-at-zero-the-equally-idle-neighbour-is-tried"),
        pytest.param([pdb(allowed=1)], {("team-a/a", WANT)}, "team-a/a", "reclaimed for team-b/want",
                     id="boundary-budget-allows-one"),
        pytest.param([pdb({"app": "web"}, allowed=0)], {("team-a/a", WANT)}, "team-a/a", "reclaimed for team-b/want",
                     id="budget-selecting-other-pods"),
        pytest.param([pdb(allowed=0, namespace="team-c")], {("team-a/a", WANT)}, "team-a/a",
                     "reclaimed for team-b/want", id="budget-in-another-namespace"),
        pytest.param([pdb(allowed=None)], {("team-c/b", WANT)}, "team-a/a", "allows 0 disruption(s)",
                     id="budget-without-status-allows-none"),
        pytest.param([pdb({}, allowed=0)], {("team-c/b", WANT)}, "team-a/a", "allows 0 disruption(s)",
                     id="empty-selector-selects-the-whole-namespace"),
        pytest.param([pdb(allowed=5), pdb({}, allowed=5, name="all")], {("team-c/b", WANT)}, "team-a/a",
                     "team-a/a is selected by 2 PodDisruptionBudgets (team-a/all, team-a/db): the Eviction API "
                     "refuses it", id="two-budgets-on-one-pod-never-evicted"),
    ],
)
def test_a_budget_that_allows_no_disruption_makes_no_victim(budgets: list[Raw], expected: set[tuple[str, str]],
                                                            about: str, reason: str) -> None:
    pods = [running("a", node="n1", labels=DB), running("b", node="n2", namespace="team-c"), want()]
    plan = run(TWO, pods, idle("team-a/a", "team-c/b"), budgets=budgets)
    assert evicted(plan) == expected
    assert reason in reason_of(plan, about)


def test_a_null_selector_selects_no_pod() -> None:
    null = pdb(allowed=0)
    null["spec"]["selector"] = None
    plan = run(TWO, [running("a", node="n1", labels=DB), running("b", node="n2"), want()],
               idle("team-a/a", "team-a/b"), budgets=[null])
    assert evicted(plan) == {("team-a/a", WANT)}


TWO_ON_ONE = [builders.gpu_node("n1", gpus=2)]


@pytest.mark.parametrize(
    ("allowed", "labelled", "served", "reason"),
    [
        pytest.param(2, ("a", "b"), True, "2 idle pod(s) evicted on n1", id="budget-allows-every-victim"),
        # Why: the second victim was evicted though the first was refused. Now the demand takes none.
        pytest.param(1, ("a", "b"), False, "PodDisruptionBudget team-a/db allows 1 disruption(s); evicting "
                     "team-a/a, team-a/b needs 2", id="why-budget-allows-one-of-two-victims-none-is-planned"),
        pytest.param(1, ("a",), True, "2 idle pod(s) evicted on n1", id="boundary-one-victim-under-a-budget-of-one"),
    ],
)
def test_a_demands_victims_are_planned_all_or_none(allowed: int, labelled: tuple[str, ...], served: bool,
                                                   reason: str) -> None:
    pods = [running(n, node="n1", labels=DB if n in labelled else None) for n in ("a", "b")]
    plan = run(TWO_ON_ONE, [*pods, pending("want", gpus=2)], idle("team-a/a", "team-a/b"),
               budgets=[pdb(allowed=allowed)])
    assert evicted(plan) == ({("team-a/a", WANT), ("team-a/b", WANT)} if served else set())
    assert reason in outcome(plan)


def test_a_budget_is_shared_by_the_demands_of_one_plan() -> None:
    """One disruption allowed: the first demand takes it, the second is told so (not planned to be refused)."""
    nodes = [builders.gpu_node("n1", gpus=1), builders.gpu_node("n2", gpus=1)]
    pods = [running("a", node="n1", labels=DB), running("b", node="n2", labels=DB),
            want(name="w1", priority=9000), want(name="w2", priority=8000)]
    plan = run(nodes, pods, idle("team-a/a", "team-a/b"), budgets=[pdb(allowed=1)])
    assert evicted(plan) == {("team-a/a", "team-b/w1")}
    assert outcome(plan, "team-b/w2") == (
        "no node can hold it: team-b/w2: n2: needs 1 GPU, more than is free even after evicting every eligible "
        "idle pod (PodDisruptionBudget team-a/db allows 1 disruption(s), 1 taken earlier in this plan; evicting "
        "team-a/b needs 1)")


def test_a_pod_refused_earlier_this_cycle_is_no_victim_and_the_next_candidate_is() -> None:
    plan = run(TWO, [running("a", node="n1"), running("b", node="n2"), want()], idle("team-a/a", "team-a/b"),
               refused={"team-a/a": "a PodDisruptionBudget blocks the eviction"})
    assert evicted(plan) == {("team-a/b", WANT)}
    assert reason_of(plan, "team-a/a") == ("eviction refused earlier this cycle: a PodDisruptionBudget blocks the "
                                           "eviction")




def test_a_demand_is_told_which_budget_keeps_the_only_idle_pod() -> None:
    plan = run(ONE, [running("a", node="n1", labels=DB), want()], idle("team-a/a"), budgets=[pdb(allowed=0)])
    assert evicted(plan) == set()
    assert outcome(plan) == ("no node can hold it: team-b/want: n1: its idle pods are no victims: PodDisruptionBudget "
                             "team-a/db allows 0 disruption(s); evicting team-a/a needs 1")


@pytest.mark.parametrize(
    ("condition", "demands"),
    [
        pytest.param({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}, [WANT],
                     id="unschedulable-is-a-demand"),
        pytest.param({"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}, [],
                     id="not-yet-tried-by-the-scheduler-is-no-demand"),
        pytest.param({"type": "PodScheduled", "status": "True", "reason": "Unschedulable"}, [],
                     id="boundary-scheduled-condition-true-is-no-demand"),
        pytest.param({"type": "Ready", "status": "False", "reason": "Unschedulable"}, [],
                     id="another-condition-says-nothing"),
    ],
)
def test_only_a_pod_the_scheduler_found_no_room_for_is_a_demand(condition: dict[str, str],
                                                                demands: list[str]) -> None:
    pod = want()
    pod["status"]["conditions"] = [condition]
    plan = run(ONE, [running("idle", node="n1"), pod], idle("team-a/idle"))
    assert [o.demand for o in plan.demands] == demands


@pytest.mark.parametrize(
    ("spec", "served", "reason"),
    [
        pytest.param({}, True, "2 idle pod(s) evicted on n1, n2", id="gang-of-modelled-members"),
        pytest.param(ANTI, False, "team-b/w-1 has constraints the capacity model does not evaluate (required "
                     "podAntiAffinity (not modelled)): freeing GPUs may not let it run",
                     id="one-member-with-hidden-anti-affinity-holds-the-gang"),
        pytest.param(PREFERRED_ANTI, True, "2 idle pod(s) evicted on n1, n2",
                     id="boundary-preferred-anti-affinity-in-a-member"),
    ],
)
def test_a_gang_demand_is_checked_by_the_capacity_model(spec: dict[str, Any], served: bool, reason: str) -> None:
    pods, make = gang_of(10000, 10000)
    pods[1]["spec"].update(spec)
    plan = run(TWO, [running("a", node="n1"), running("b", node="n2"), *pods], idle("team-a/a", "team-a/b"),
               demands=make)
    assert [(o.demand, o.served, o.reason) for o in plan.demands] == [("gang:team-b/g", served, reason)]


def test_budgets_come_from_a_listed_cluster_too() -> None:
    """`explain --cluster` reads `kubectl get ...,poddisruptionbudgets -A -o json`."""
    listed = snapshot_build.from_list({"kind": "List", "items": [pdb(allowed=2), pdb({}, allowed=None, name="all")]},
                                      names=settings.Names(), taken_at=NOW)
    assert {k: (b.disruptions_allowed, b.selector) for k, b in listed.disruption_budgets.items()} == {
        "team-a/db": (2, {"matchLabels": {"app": "db"}}), "team-a/all": (0, {"matchLabels": {}})}
