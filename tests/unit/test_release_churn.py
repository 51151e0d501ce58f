"""The pure parts of benchmarks/release_churn.py: the workload sequence, the node churn, and what counts as a pod
bound on its planned node, a stuck pod, a pod someone else deleted and a gang part-running."""

from __future__ import annotations

from typing import Any

import prometheus_client
import pytest

from benchmarks import release_churn as pc
from common import settings, snapshot, snapshot_build
from tests import builders

NAMES = settings.Names()
RELEASED = {NAMES.release: "2026-11-26T12:00:00Z planned=n1 domains=1 placed on n1: by the test"}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports."}


def _raw(name: str, workload: str, *, node: str | None = None, stuck: bool = False, uid: str | None = None,
         owner: str | None = None, labels: dict[str, str] | None = None, released: bool = False) -> dict[str, Any]:
    raw = builders.pod(name, namespace=pc.NAMESPACE, gpus=4, node=node, phase="Running" if node else "Pending",
                       labels={pc.WORKLOAD_LABEL: workload, **(labels or {})},
                       annotations=RELEASED if stuck or released else None)
    raw["metadata"]["uid"] = uid or f"uid-{name}"
    if stuck:
        raw["status"]["conditions"] = [UNSCHEDULABLE]
    if owner:
        raw["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "controller": True,
                                               "apiVersion": "apps/v1", "uid": "rs"}]
    return raw


def _cluster(*pods: dict[str, Any]) -> snapshot.Snapshot:
    nodes = [builders.gpu_node(n, gpus=8, domains=[range(4), range(4, 8)]) for n in ("n1", "n2")]
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0)


def _pod(raw: dict[str, Any]) -> snapshot.Pod:
    return _cluster(raw).pods[f"{pc.NAMESPACE}/{raw['metadata']['name']}"]


# --- the sequence ---------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_workloads_and_another_seed_others() -> None:
    first = pc.workloads(pods=200, seed=1, total_gpus=160)
    assert first == pc.workloads(pods=200, seed=1, total_gpus=160)
    assert first != pc.workloads(pods=200, seed=2, total_gpus=160)
    assert {w.kind for w in first} == set(pc.MIX), "every kind of the mix arrives"
    assert [w.first_pod for w in first] == [sum(w.pods for w in first[:i]) for i in range(len(first))]


@pytest.mark.parametrize(
    ("pods", "workloads"),
    [
        pytest.param(1, 1, id="one-pod-one-workload"),
        pytest.param(0, 0, id="no-pods-no-workloads"),
    ],
)
def test_workloads_stop_once_the_pods_have_arrived(pods: int, workloads: int) -> None:
    got = pc.workloads(pods=pods, seed=3, total_gpus=160)
    assert len(got) == workloads
    assert sum(w.pods for w in got) >= pods
    assert sum(w.pods for w in got[:-1]) < pods or not got


def test_the_mean_lifetime_makes_the_reference_rate_offer_the_reference_load() -> None:
    life = pc.mean_lifetime(160)
    assert pc.REFERENCE_RATE * pc.mean_gpus_per_pod() * life / 160 == pytest.approx(pc.REFERENCE_LOAD)


def test_offered_load_is_the_lifetimes_gpu_seconds_over_the_arrival_span() -> None:
    plan = (pc.Workload("a", "bare", 4, 1, 0, 10.0), pc.Workload("g", "gang", 4, 2, 1, 5.0))
    # 3 pods at 1/s span 3 s; 4x10 + 2x4x5 = 80 GPU-seconds of 8 GPUs x 3 s.
    assert pc.offered_load(plan, rate=1.0, total_gpus=8) == pytest.approx(80 / 24)


@pytest.mark.parametrize(
    ("end", "cycles"),
    [
        pytest.param(10 + 60 * 0.75, 1, id="boundary-last-cycle-completes-at-the-end"),
        pytest.param(10 + 60 * 0.75 - 0.1, 0, id="no-cycle-that-would-outlast-the-arrivals"),
        pytest.param(10 + 60 + 60 * 0.75, 2, id="two-cycles"),
    ],
)
def test_node_churn_cordons_deletes_uncordons_and_creates_again(end: float, cycles: int) -> None:
    got = pc.node_churn(["a", "b", "c"], start=10, end=end, period=60, seed=1)
    assert len(got) == 4 * cycles
    for i in range(cycles):
        cordon, delete, uncordon, create = got[4 * i: 4 * i + 4]
        assert [e.action for e in (cordon, delete, uncordon, create)] == ["cordon", "delete", "uncordon", "create"]
        assert [e.at for e in (cordon, delete, uncordon, create)] == [10 + 60 * i + d for d in (0, 15, 30, 45)]
        assert cordon.node == uncordon.node != delete.node == create.node
    assert got == pc.node_churn(["a", "b", "c"], start=10, end=end, period=60, seed=1)


def test_node_churn_needs_two_nodes() -> None:
    assert pc.node_churn(["a"], start=0, end=100, period=10, seed=1) == ()


@pytest.mark.parametrize(
    ("kind", "gpus", "labels", "port"),
    [
        pytest.param("gang", 4, {NAMES.gang_name: "w", NAMES.gang_size: "2"}, False, id="gang-members-labelled"),
        pytest.param("prefer", 2, {NAMES.placement: "prefer"}, False, id="prefer-labelled"),
        pytest.param("hostport-one-gpu", 1, {}, True, id="host-port"),
        pytest.param("bare", 8, {}, False, id="bare"),
    ],
)
def test_pod_manifests_carry_the_kind(kind: pc.Kind, gpus: int, labels: dict[str, str], port: bool) -> None:
    workload = pc.Workload("w", kind, gpus, pc.MIX[kind].pods, 0, 10.0)
    pods = pc.manifests(workload, namespace="ns")
    assert [p["metadata"]["name"] for p in pods] == (["w-0", "w-1"] if kind == "gang" else ["w"])
    for pod in pods:
        assert pod["metadata"]["labels"] == {pc.WORKLOAD_LABEL: "w", **labels}
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": str(gpus)}
        assert ("ports" in container) == port


def test_a_replicaset_workload_is_one_replicaset_whose_pods_carry_the_workload() -> None:
    [rs] = pc.manifests(pc.Workload("w", "replicaset", 2, 1, 0, 10.0), namespace="ns")
    assert (rs["kind"], rs["spec"]["replicas"]) == ("ReplicaSet", 1)
    assert rs["spec"]["selector"]["matchLabels"] == {pc.WORKLOAD_LABEL: "w"}
    assert rs["spec"]["template"]["metadata"]["labels"] == {pc.WORKLOAD_LABEL: "w"}


# --- what counts ----------------------------------------------------------------------------------


def _gated(raw: dict[str, Any]) -> None:
    raw["spec"]["schedulingGates"] = [{"name": NAMES.gate}]


@pytest.mark.parametrize(
    ("change", "stuck"),
    [
        pytest.param(lambda raw: None, True, id="released-unschedulable"),
        pytest.param(lambda raw: raw["status"].update(conditions=[]), False, id="not-yet-reported"),
        pytest.param(lambda raw: raw["status"].update(conditions=[{**UNSCHEDULABLE, "reason": "SchedulingGated"}]),
                     False, id="other-reason"),
        pytest.param(lambda raw: raw["metadata"].pop("annotations"), False, id="not-released-by-us"),
        pytest.param(_gated, False, id="still-gated"),
        pytest.param(lambda raw: raw["metadata"].update(deletionTimestamp="2026-11-26T12:00:01Z"), False,
                     id="being-deleted"),
        pytest.param(lambda raw: raw["spec"].update(nodeName="n2"), False, id="bound"),
    ],
)
def test_a_stuck_pod_is_a_released_pod_the_scheduler_calls_unschedulable(change: Any, stuck: bool) -> None:
    raw = _raw("p", "w", stuck=True)
    change(raw)
    assert pc.stuck(_pod(raw)) is stuck


@pytest.mark.parametrize(
    ("node", "on_plan"),
    [pytest.param("n1", 1, id="bound-where-nominated"), pytest.param("n2", 0, id="bound-elsewhere")],
)
def test_pods_bound_on_their_planned_node_are_counted_by_their_first_binding(node: str, on_plan: int) -> None:
    watch = pc.Watch(PLAN)
    watch.observe(_cluster(_raw("bare", "bare", released=True)), now=1.0)
    watch.observe(_cluster(_raw("bare", "bare", released=True, node=node)), now=2.0)
    watch.observe(_cluster(_raw("rs-x", "rs", node="n1", owner="rs")), now=3.0)  # never gated: not counted
    summary = pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=3.0)
    assert (summary["bound_on_planned_node"], summary["nominated_and_bound"]) == (on_plan, 1)
    assert summary["bound_on_planned_node_share"] == on_plan


PLAN = {w.name: w for w in (pc.Workload("bare", "bare", 4, 1, 0, 10.0), pc.Workload("rs", "replicaset", 4, 1, 1, 10.0),
                            pc.Workload("gang", "gang", 4, 2, 2, 10.0))}


def test_a_pod_deleted_by_someone_else_has_vanished_and_its_replacement_is_the_same_arrival() -> None:
    """What gpu-steward must never do: a pod gone that the benchmark neither ended nor deleted is counted."""
    watch = pc.Watch(PLAN)
    watch.observe(_cluster(_raw("bare", "bare", stuck=True)), now=1.0)
    watch.observe(_cluster(), now=21.0)  # deleted by someone else
    started = watch.observe(_cluster(_raw("bare", "bare", node="n2", uid="again")), now=23.0)
    [held] = watch.stuck.values()
    assert (held.outcome, held.since, held.until) == ("vanished", 1.0, 21.0)
    assert watch.vanished == [f"{pc.NAMESPACE}/bare"]
    assert started == ["bare"], "its lifetime starts at its first binding"
    assert watch.arrival_bound == {"bare": 23.0}
    assert pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=30.0)["deleted_or_recreated_by_gpu_steward"] == 1


@pytest.mark.parametrize(
    "how",
    [pytest.param("ended", id="its-workload-ended"), pytest.param("deleted", id="deleted-with-its-node")],
)
def test_a_pod_the_benchmark_deleted_is_ended_not_vanished(how: str) -> None:
    watch = pc.Watch(PLAN)
    watch.observe(_cluster(_raw("bare", "bare", stuck=True)), now=1.0)
    if how == "ended":
        watch.end("bare", now=2.0)
    else:
        watch.deleting(["uid-bare"])
    watch.observe(_cluster(), now=3.0)
    assert [(p.outcome, p.until) for p in watch.stuck.values()] == [("ended", 3.0)]
    assert watch.vanished == []


def test_a_stuck_pod_the_scheduler_binds_after_all_is_bound() -> None:
    """Each stuck pod keeps what explains it: the node planned, the scheduler's word, where it bound in the end."""
    watch = pc.Watch(PLAN)
    raw = _raw("bare", "bare", stuck=True)
    watch.observe(_cluster(raw), now=1.0)
    raw["spec"]["nodeName"] = "n2"
    watch.observe(_cluster(raw), now=1.5)
    assert [(p.outcome, p.until, p.planned, p.message, p.bound_on) for p in watch.stuck.values()] == [
        ("bound", 1.5, "n1", UNSCHEDULABLE["message"], "n2")]


def test_a_replicaset_pod_stands_for_its_replicaset() -> None:
    watch = pc.Watch(PLAN)
    watch.observe(_cluster(_raw("rs-abcde", "rs", node="n1", owner="rs")), now=4.0)
    assert watch.arrival_bound == {"rs": 4.0}
    summary = pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=10.0)
    assert summary["waits"]["gated"]["bound"] == 1
    assert summary["waits"]["gated"]["wait_p50_seconds"] == pytest.approx(3.0), "arrived at 1 s (rate 1/s)"
    assert summary["arrivals_unplaced_at_end"] == {"gated": 3, "not_gated": 0}, "bare and both gang members"


GANG = {NAMES.gang_name: "gang", NAMES.gang_size: "2"}


@pytest.mark.parametrize(
    ("second_bound_at", "over"),
    [
        pytest.param(5.0, 0, id="part-running-4s-under-the-threshold"),
        pytest.param(6.0, 0, id="boundary-5s-is-not-over"),
        pytest.param(6.5, 1, id="part-running-5.5s-over"),
    ],
)
def test_a_gang_is_part_running_while_one_member_is_bound_and_another_not(second_bound_at: float, over: int) -> None:
    watch = pc.Watch(PLAN)
    one = _raw("gang-0", "gang", node="n1", labels=GANG)
    watch.observe(_cluster(one, _raw("gang-1", "gang", labels=GANG)), now=1.0)
    watch.observe(_cluster(one, _raw("gang-1", "gang", node="n2", labels=GANG)), now=second_bound_at)
    watch.finish(now=20.0)
    assert watch.workload_bound == {"gang": second_bound_at}, "its lifetime starts once it runs whole"
    summary = pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=20.0)
    assert summary["longest_part_running_seconds"] == pytest.approx(second_bound_at - 1.0)
    assert (summary["gangs_part_running_over_threshold"], summary["gangs"]) == (over, 1)


def test_a_gang_the_benchmark_ended_is_not_part_running_while_it_goes() -> None:
    watch = pc.Watch(PLAN)
    watch.observe(_cluster(_raw("gang-0", "gang", node="n1", labels=GANG), _raw("gang-1", "gang", node="n2",
                                                                                 labels=GANG)), now=1.0)
    watch.end("gang", now=10.0)
    watch.observe(_cluster(_raw("gang-0", "gang", node="n1", labels=GANG)), now=10.5)
    watch.finish(now=30.0)
    assert watch.part_running == {}


def test_stuck_pods_are_counted_per_thousand_arrivals_with_their_times() -> None:
    watch = pc.Watch(PLAN)
    rs = _raw("rs-x", "rs", stuck=True, owner="rs")
    watch.observe(_cluster(_raw("bare", "bare", stuck=True), rs), now=1.0)
    watch.observe(_cluster(_raw("bare", "bare", stuck=True, node="n2"), rs), now=21.0)
    summary = pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=30.0)
    assert (summary["arrivals"], summary["stuck_pods"]) == (4, 2)
    assert summary["stuck_per_1000_arrivals"] == pytest.approx(500.0)
    assert summary["stuck_outcomes"] == {"bound": 1, "still stuck": 1}
    assert summary["still_stuck_at_end"] == 1
    assert summary["stuck_to_bound_seconds"] == {"p50": 20.0, "p99": 20.0, "max": 20.0}
    assert summary["deleted_or_recreated_by_gpu_steward"] == 0


def test_release_outcomes_are_read_by_cause_from_the_descheduler_metrics() -> None:
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter(pc.OUTCOMES, "help", ["cause"], registry=registry)
    counter.labels("placed-elsewhere").inc(2)
    counter.labels("not-bound").inc()
    counter.labels("gang-spread")  # seen, never counted
    text = prometheus_client.generate_latest(registry).decode()
    assert pc.release_outcomes_by_cause(text) == {"placed-elsewhere": 2.0, "not-bound": 1.0}
    assert pc.release_outcomes_by_cause("") == {}


def test_the_table_shows_outcomes_by_cause_and_none_for_the_arm_without_a_descheduler() -> None:
    watch = pc.Watch(PLAN)
    base = pc.summary(watch, plan=tuple(PLAN.values()), rate=1.0, end=1.0) | {"offered_load": 0.9}
    lines = pc.table({"ours": base | {"release_outcomes": {"placed-elsewhere": 2.0}},
                      "default": base | {"release_outcomes": None}})
    [total] = [line.split() for line in lines if line.startswith("release outcomes")]
    [elsewhere] = [line.split() for line in lines if line.strip().startswith("placed-elsewhere")]
    assert (total[-2:], elsewhere[-2:]) == (["2", "-"], ["2", "-"])
