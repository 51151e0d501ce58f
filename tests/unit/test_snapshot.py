"""common.snapshot (and common.source): the immutable cluster picture every decision reads."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from common import settings, snapshot, snapshot_build, source
from tests import builders

NAMES = settings.Names()
FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "cluster" / "mixed.json"
EIGHT = [[0, 1, 2, 3], [4, 5, 6, 7]]


def _build(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    *,
    occupancy: snapshot.Occupancy | None = None,
    **kwargs: Any,
) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, occupancy=occupancy, names=NAMES, taken_at=100.0, **kwargs)


def _with_limit(value: str) -> builders.Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": value}}

    return mutate


def test_only_gpu_pods_and_gpu_nodes() -> None:
    snap = _build(
        [builders.gpu_node("gpu", gpus=2), builders.gpu_node("cpu", gpus=0, topology="none")],
        [builders.pod("train", gpus=1, node="gpu"), builders.pod("web", node="gpu"),
         builders.pod("mig", mig={"1g.10gb": 1})],
    )
    assert sorted(snap.nodes) == ["gpu"]
    assert sorted(snap.pods) == ["default/mig", "default/train"]
    assert snap.nodes["gpu"].pods == ("default/train",)


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({NAMES.gang_name: "j", NAMES.gang_size: "5"}, id="ours"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "j"}, id="kueue"),
        pytest.param({"scheduling.x-k8s.io/pod-group": "j"}, id="coscheduling"),
    ],
)
def test_gang_members_without_gpus_are_kept_but_hold_nothing(labels: dict[str, str]) -> None:
    """A gang counts every member (an MPI launcher), but a pod without GPUs takes no GPU anywhere."""
    snap = _build(
        [builders.gpu_node("gpu", gpus=2)],
        [builders.pod("launcher", node="gpu", phase="Running", labels=labels),
         builders.pod("web", node="gpu", phase="Running", labels={"app": "web"})],
    )
    launcher = snap.pods["default/launcher"]
    assert sorted(snap.pods) == ["default/launcher"]
    assert (launcher.bound, launcher.holds_gpus, launcher.gpu_indices) == (True, False, ())
    assert (snap.nodes["gpu"].pods, snap.nodes["gpu"].requested_full) == ((), 0)


@pytest.mark.parametrize(
    ("phase", "holds"),
    [
        pytest.param("Pending", True, id="pending-bound"),
        pytest.param("Running", True, id="running"),
        pytest.param("Unknown", True, id="unknown"),
        pytest.param("Succeeded", False, id="succeeded"),
        pytest.param("Failed", False, id="failed"),
    ],
)
def test_terminal_phases_release_gpus(phase: str, holds: bool) -> None:
    snap = _build([builders.gpu_node("n", gpus=4)], [builders.pod("p", gpus=2, node="n", phase=phase)])
    node, pod = snap.nodes["n"], snap.pods["default/p"]
    assert pod.holds_gpus is holds
    assert (node.pods, sorted(node.used), node.requested_full, node.free_gpus) == (
        (("default/p",), [0, 1], 2, 2) if holds else ((), [], 0, 4)
    )
    assert pod.gpu_indices == ((0, 1) if holds else ())


def test_unbound_pod_holds_nothing() -> None:
    snap = _build([builders.gpu_node("n", gpus=4)], [builders.pod("p", gpus=2)])
    assert (snap.pods["default/p"].holds_gpus, snap.nodes["n"].used, snap.pods["default/p"].gpu_indices) == (
        False, frozenset(), ())


def test_pod_bound_to_unknown_node_is_kept_without_indices() -> None:
    snap = _build([builders.gpu_node("n", gpus=4)], [builders.pod("p", gpus=2, node="elsewhere")])
    assert snap.pods["default/p"].gpu_indices == ()
    assert snap.nodes["n"].used == frozenset()


OLD = "2026-11-21T09:00:00Z"
NEW = "2026-11-21T10:00:00Z"


@pytest.mark.parametrize(
    ("pods", "occupancy", "expected", "observed"),
    [
        pytest.param(
            [builders.pod("a", gpus=1, node="n", created=OLD), builders.pod("b", gpus=2, node="n", created=NEW)],
            None,
            {"default/a": (0,), "default/b": (1, 2)},
            {"default/a": False, "default/b": False},
            id="estimated-oldest-first-smallest-fitting-domain",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n", created=NEW), builders.pod("b", gpus=2, node="n", created=OLD)],
            None,
            {"default/a": (2,), "default/b": (0, 1)},
            {"default/a": False, "default/b": False},
            id="creation-order-not-list-order",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n", created=OLD), builders.pod("b", gpus=2, node="n", created=NEW)],
            {"n": {5: "default/a"}},
            {"default/a": (5,), "default/b": (4, 6)},
            {"default/a": True, "default/b": False},
            id="dcgm-first-then-estimate-around-it",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n", created=OLD), builders.pod("b", gpus=2, node="n", created=NEW)],
            {"n": {0: "default/b", 7: "default/b"}},
            {"default/a": (1,), "default/b": (0, 7)},
            {"default/a": False, "default/b": True},
            id="dcgm-beats-age-order",
        ),
        pytest.param(
            [builders.pod("a", gpus=2, node="n", created=OLD)],
            {"n": {4: "default/a"}},
            {"default/a": (4, 5)},
            {"default/a": True},
            id="partly-observed-rest-estimated",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n")],
            {"n": {0: "default/ghost", 1: "other/gone"}},
            {"default/a": (0,)},
            {"default/a": False},
            id="unknown-occupancy-pods-ignored",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n")],
            {"other-node": {0: "default/a"}},
            {"default/a": (0,)},
            {"default/a": False},
            id="occupancy-of-another-node-ignored",
        ),
        pytest.param(
            [builders.pod("a", gpus=1, node="n")],
            {"n": {9: "default/a"}},
            {"default/a": (0,)},
            {"default/a": False},
            id="index-outside-topology-not-observed",
        ),
    ],
)
def test_gpu_indices(
    pods: list[dict[str, Any]],
    occupancy: snapshot.Occupancy | None,
    expected: dict[str, tuple[int, ...]],
    observed: dict[str, bool],
) -> None:
    snap = _build([builders.gpu_node("n", gpus=8, domains=EIGHT)], pods, occupancy=occupancy)
    assert {k: p.gpu_indices for k, p in snap.pods.items()} == expected
    assert {k: p.indices_observed for k, p in snap.pods.items()} == observed
    assert snap.nodes["n"].used == frozenset(i for held in expected.values() for i in held)


def test_over_committed_node_counts_requests() -> None:
    snap = _build(
        [builders.gpu_node("n", gpus=2)],
        [builders.pod(f"p{i}", gpus=1, node="n", created=f"2026-11-21T10:00:0{i}Z") for i in range(3)],
    )
    node = snap.nodes["n"]
    assert (sorted(node.used), node.requested_full, node.free_gpus) == ([0, 1], 3, 0)
    assert [snap.pods[f"default/p{i}"].gpu_indices for i in range(3)] == [(0,), (1,), ()]


def test_mig_usage() -> None:
    def mig_node(node: dict[str, Any]) -> None:
        node["status"]["allocatable"] = {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}

    snap = _build(
        [builders.gpu_node("m", gpus=1, topology="none", mutate=mig_node)],
        [builders.pod("a", mig={"1g.10gb": 1}, node="m"), builders.pod("b", mig={"1g.10gb": 1, "3g.40gb": 1},
                                                                       node="m"),
         builders.pod("done", mig={"3g.40gb": 1}, node="m", phase="Succeeded")],
    )
    node = snap.nodes["m"]
    assert (dict(node.mig_used), node.free_mig("1g.10gb"), node.free_mig("3g.40gb"), node.free_mig("7g.80gb")) == (
        {"1g.10gb": 2, "3g.40gb": 1}, 0, 0, 0)
    assert (node.requested_full, node.free_gpus, node.used) == (0, 0, frozenset())


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param("500m", "pod default/bad skipped: nvidia.com/gpu: '500m' is not a whole number of devices",
                     id="milli"),
        pytest.param("-1", "pod default/bad skipped: nvidia.com/gpu: '-1' is not a whole number of devices",
                     id="negative"),
        pytest.param("inf", "pod default/bad skipped: nvidia.com/gpu: 'inf' is not a whole number of devices",
                     id="infinite"),
    ],
)
def test_bad_pod_quantity_is_a_problem_not_an_error(value: str, problem: str) -> None:
    snap = _build(
        [builders.gpu_node("n", gpus=2)],
        [builders.pod("bad", node="n", mutate=_with_limit(value)), builders.pod("good", gpus=1, node="n")],
    )
    assert snap.problems == (problem,)
    assert sorted(snap.pods) == ["default/good"]
    assert snap.nodes["n"].pods == ("default/good",)


def test_node_topology_problems_are_reported() -> None:
    node = builders.gpu_node("n", gpus=2, topology="none")
    node["metadata"]["annotations"][NAMES.nvlink_topology] = "[[0],[0]]"
    snap = _build([node], [])
    assert snap.problems == (f"node n: annotation {NAMES.nvlink_topology} ignored: a GPU index appears in two domains",)


def _cordon(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True


def _no_conditions(node: dict[str, Any]) -> None:
    node["status"]["conditions"] = [{"type": "MemoryPressure", "status": "False"}]


def _ready_unknown(node: dict[str, Any]) -> None:
    node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]


@pytest.mark.parametrize(
    ("node", "schedulable"),
    [
        pytest.param(builders.gpu_node("n", gpus=1), True, id="ready"),
        pytest.param(builders.gpu_node("n", gpus=1, ready=False), False, id="not-ready"),
        pytest.param(builders.gpu_node("n", gpus=1, mutate=_ready_unknown), False, id="ready-unknown"),
        pytest.param(builders.gpu_node("n", gpus=1, mutate=_no_conditions), False, id="no-ready-condition"),
        pytest.param(builders.gpu_node("n", gpus=1, mutate=_cordon), False, id="cordoned"),
    ],
)
def test_node_schedulable(node: dict[str, Any], schedulable: bool) -> None:
    assert _build([node], []).nodes["n"].schedulable is schedulable


@pytest.mark.parametrize(
    ("domains", "held", "expected"),
    [
        pytest.param(EIGHT, 0, ((0, 1, 2, 3), (4, 5, 6, 7)), id="empty"),
        pytest.param(EIGHT, 3, ((3,), (4, 5, 6, 7)), id="three-in-first-domain"),
        pytest.param(EIGHT, 8, ((), ()), id="full"),
        pytest.param([[0], [1], [2], [3]], 2, ((), (), (2,), (3,)), id="singletons"),
    ],
)
def test_free_by_domain(domains: list[list[int]], held: int, expected: tuple[tuple[int, ...], ...]) -> None:
    gpus = sum(len(d) for d in domains)
    pods = [builders.pod("p", gpus=held, node="n")] if held else []
    node = _build([builders.gpu_node("n", gpus=gpus, domains=domains)], pods).nodes["n"]
    assert node.free_by_domain() == expected
    assert node.free_by_domain() is node.free_by_domain()  # computed once per immutable node


def test_pod_fields() -> None:
    def details(body: dict[str, Any]) -> None:
        body["metadata"]["ownerReferences"] = [
            {"kind": "Workload", "name": "w"},
            {"kind": "Job", "name": "train", "controller": True},
        ]
        body["metadata"]["deletionTimestamp"] = "2026-11-21T11:00:00Z"
        body["spec"].update(
            priority=10_000,
            priorityClassName="gpu-steward-normal",
            schedulerName="volcano",
            schedulingGates=[{"name": "kueue.x-k8s.io/admission"}, {"name": "gpu-steward.io/gang"}],
        )

    pod = _build([], [builders.pod("p", namespace="ml", gpus=1, labels={"a": "b"}, mutate=details)]).pods["ml/p"]
    assert (pod.uid, pod.priority, pod.priority_class_name, pod.preemption_policy, pod.owner_kind, pod.owner_name,
            pod.scheduler_name, pod.scheduling_gates, pod.deleting, dict(pod.labels), pod.created) == (
        "uid-p", 10_000, "gpu-steward-normal", "PreemptLowerPriority", "Job", "train", "volcano",
        ("kueue.x-k8s.io/admission", "gpu-steward.io/gang"), True, {"a": "b"}, "2026-11-21T10:00:00Z")


def test_pod_defaults() -> None:
    pod = _build([], [builders.pod("p", gpus=1)]).pods["default/p"]
    assert (pod.priority, pod.priority_class_name, pod.owner_kind, pod.scheduler_name, pod.scheduling_gates,
            pod.deleting) == (0, None, None, "default-scheduler", (), False)


def test_priority_classes_and_namespaces() -> None:
    snap = _build(
        [], [],
        priority_classes=[*builders.tier_classes(), {"kind": "PriorityClass", "metadata": {"name": "low"},
                                                     "value": -5, "globalDefault": True}],
        namespaces=[builders.namespace("ml", {"team": "a"}), builders.namespace("plain")],
    )
    assert {n: (c.value, c.preemption_policy, c.global_default) for n, c in snap.priority_classes.items()} == {
        "gpu-steward-critical": (100_000, "PreemptLowerPriority", False),
        "gpu-steward-normal": (10_000, "PreemptLowerPriority", False),
        "gpu-steward-scavenger": (100, "Never", False),
        "low": (-5, "PreemptLowerPriority", True),
    }
    assert snap.namespaces == {"ml": {"team": "a"}, "plain": {}}


@pytest.mark.parametrize(
    ("taken_at", "now", "age"),
    [
        pytest.param(None, 50.0, None, id="never-synced"),
        pytest.param(100.0, 130.0, 30.0, id="thirty-seconds"),
        pytest.param(100.0, 90.0, 0.0, id="clock-behind-clamped"),
    ],
)
def test_age(taken_at: float | None, now: float, age: float | None) -> None:
    snap = snapshot_build.build(nodes=[], pods=[], names=NAMES, taken_at=taken_at)
    assert snap.age(now) == age


def test_empty() -> None:
    assert (snapshot.EMPTY.nodes, snapshot.EMPTY.pods, snapshot.EMPTY.age(1.0)) == ({}, {}, None)


def _fixture() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(FIXTURE.read_text())
    return document


def test_from_list_fixture() -> None:
    snap = snapshot_build.from_list(_fixture(), names=NAMES, taken_at=5.0)
    assert snap.problems == ()
    assert snap.taken_at == 5.0
    assert {n.name: (n.topology.source, n.topology.domains, n.gpu_count, n.schedulable, n.free_by_domain())
            for n in snap.nodes.values()} == {
        "dgx-a100-01": ("annotation", ((0, 1, 2, 3), (4, 5, 6, 7)), 8, True, ((), (4, 5, 6, 7))),
        "a6000-4g-01": ("labels", ((0, 1), (2, 3)), 4, True, ((1,), (2, 3))),
        "a100-pcie-2g-01": ("annotation", ((0, 1),), 2, True, ((1,),)),
        "t4-01": ("annotation", ((0,), (1,), (2,), (3,)), 4, False, ((), (1,), (2,), (3,))),
        "a100-mig-01": ("gpu-count", ((0,),), 0, True, ((0,),)),
    }
    assert {k: (p.node_name, p.phase, p.gpu_indices) for k, p in snap.pods.items()} == {
        "batch/resnet-eval-5kq2x": ("dgx-a100-01", "Succeeded", ()),
        "training/llama-ft-worker-0": ("dgx-a100-01", "Running", (0, 1)),
        "training/llama-ft-worker-1": ("dgx-a100-01", "Running", (2, 3)),
        "inference/triton-llm-7c9f8d6b5-x2x7q": ("a6000-4g-01", "Running", (0,)),
        "inference/triton-llm-7c9f8d6b5-p8wz4": ("a100-pcie-2g-01", "Running", (0,)),
        "batch/hpo-sweep-17-9vmlt": ("t4-01", "Running", (0,)),
        "research/notebook-ana-0": ("a100-mig-01", "Running", ()),
        "training/llama-pt-worker-0": (None, "Pending", ()),
    }
    mig = snap.nodes["a100-mig-01"]
    assert (mig.topology.mig_strategy, mig.free_mig("3g.40gb"), mig.free_mig("1g.10gb")) == ("mixed", 0, 2)
    assert snap.pods["training/llama-pt-worker-0"].scheduling_gates == ("gpu-steward.io/gang",)
    assert sorted(snap.priority_classes) == [
        "gpu-steward-critical", "gpu-steward-normal", "gpu-steward-scavenger", "system-cluster-critical"]
    assert snap.namespaces["inference"] == {"kubernetes.io/metadata.name": "inference", "env": "production",
                                            "team": "serving"}


def test_fixture_matches_default_tier_classes() -> None:
    snap = snapshot_build.from_list(_fixture(), names=NAMES, taken_at=None)
    tiers = settings.Settings().tiers
    for tier in settings.Tier:
        wanted = tiers.for_tier(tier)
        got = snap.priority_classes[wanted.name]
        assert (got.value, got.preemption_policy) == (wanted.value, wanted.preemption_policy)


@pytest.mark.parametrize(
    ("document", "nodes", "pods"),
    [
        pytest.param({"kind": "NodeList", "items": [{k: v for k, v in builders.gpu_node("n", gpus=1).items()
                                                     if k != "kind"}]}, ["n"], [], id="node-list-items-without-kind"),
        pytest.param({"kind": "PodList", "items": [builders.pod("p", gpus=1)]}, [], ["default/p"], id="pod-list"),
        pytest.param({"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "s"}},
                                                builders.pod("p", gpus=1)]}, [], ["default/p"],
                     id="other-kinds-ignored"),
        pytest.param({"kind": "List", "items": []}, [], [], id="empty-list"),
    ],
)
def test_from_list_kinds(document: dict[str, Any], nodes: list[str], pods: list[str]) -> None:
    snap = snapshot_build.from_list(document, names=NAMES, taken_at=None)
    assert (sorted(snap.nodes), sorted(snap.pods)) == (nodes, pods)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(builders.pod("p", gpus=1), "top-level kind is 'Pod'; expected one of List, NodeList, PodList, "
                     "PriorityClassList, NamespaceList", id="single-pod"),
        pytest.param({"items": []}, "top-level kind is None; expected one of List, NodeList, PodList, "
                     "PriorityClassList, NamespaceList", id="no-kind"),
        pytest.param({"kind": "List", "items": "n1"}, "items is a str; expected a list of objects",
                     id="items-a-string"),
        pytest.param({"kind": "NodeList", "items": [builders.gpu_node("n1", gpus=1, domains=[range(1)]), None]},
                     "items[1] is a NoneType; expected an object", id="item-null"),
    ],
)
def test_from_list_rejects_what_is_not_a_list_of_objects(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        snapshot_build.from_list(document, names=NAMES, taken_at=None)


def test_static_source_from_file() -> None:
    now = [7.0]
    loaded = source.from_file(FIXTURE, names=NAMES, clock=lambda: now[0])
    assert loaded.synced is True
    assert loaded.snapshot == snapshot_build.from_list(_fixture(), names=NAMES, taken_at=7.0)
    now[0] = 5_000.0  # a replayed state never ages into "stale" while a process serves it
    assert loaded.snapshot.age(5_000.0) == 0.0


def test_a_builder_reuses_unchanged_pods_and_equals_a_cold_build():
    names = settings.Names()
    nodes = [builders.gpu_node(f"n{i}", gpus=8, domains=[range(4), range(4, 8)]) for i in range(3)]
    pods = [builders.pod(f"p{j}", gpus=1, node=f"n{j % 3}", phase="Running") for j in range(9)]
    builder = snapshot_build.Builder(names=names)
    first = _keep_building(builder, nodes, pods)
    pods[4] = builders.pod("p4", gpus=3, node="n1", phase="Running")  # replaced, as the feeder does
    del pods[0]
    warm = _keep_building(builder, nodes, pods)
    cold = snapshot_build.build(nodes=nodes, pods=pods, names=names, taken_at=0.0)
    assert (warm.pods, warm.nodes) == (cold.pods, cold.nodes)
    assert warm.pods["default/p8"] is first.pods["default/p8"]
    assert warm.pods["default/p4"].request.full == 3 and "default/p0" not in warm.pods


def _keep_building(builder: snapshot_build.Builder, nodes: Sequence[Mapping[str, Any]],
                   pods: Sequence[Mapping[str, Any]]) -> snapshot.Snapshot:
    return builder.build(nodes={n["metadata"]["name"]: n for n in nodes}, pods={snapshot.pod_key(p): p for p in pods},
                         taken_at=0.0)


def _replace_node(nodes: list[dict[str, Any]], name: str) -> None:
    """A new object for the node, equal in content, as the feeder stores a node it was sent again."""
    at = next(i for i, n in enumerate(nodes) if n["metadata"]["name"] == name)
    nodes[at] = json.loads(json.dumps(nodes[at]))


@pytest.mark.parametrize(
    ("previous", "replaced", "parsed"),
    [
        pytest.param(False, (), {"gpu": 4, "topology": 3, "resources": 3}, id="cold-build-parses-every-node"),
        pytest.param(True, (), {"gpu": 0, "topology": 0, "resources": 0}, id="unchanged-objects-not-reparsed"),
        pytest.param(True, ("n1",), {"gpu": 1, "topology": 1, "resources": 1}, id="replaced-gpu-node-only"),
        pytest.param(True, ("cpu",), {"gpu": 1, "topology": 0, "resources": 0}, id="replaced-cpu-node-only"),
        pytest.param(True, ("n0", "n1", "n2", "cpu"), {"gpu": 4, "topology": 3, "resources": 3}, id="all-replaced"),
    ],
)
def test_rebuild_reparses_only_nodes_whose_object_changed(
    monkeypatch: pytest.MonkeyPatch, previous: bool, replaced: tuple[str, ...], parsed: dict[str, int],
) -> None:
    from common import gpu, resources, topology

    nodes = [*(builders.gpu_node(f"n{i}", gpus=8, domains=[range(4), range(4, 8)]) for i in range(3)),
             builders.gpu_node("cpu", gpus=0, topology="none")]
    pods = [builders.pod(f"p{j}", gpus=1, node=f"n{j % 3}", phase="Running") for j in range(6)]
    builder = snapshot_build.Builder(names=NAMES)
    _keep_building(builder, nodes, pods)
    for name in replaced:
        _replace_node(nodes, name)
    calls = {"gpu": 0, "topology": 0, "resources": 0}

    def counted(what: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[what] += 1
            return real(*args, **kwargs)
        return wrapper

    cold = _build(nodes, pods)  # before counting: the reference every warm build must equal
    monkeypatch.setattr(gpu, "node_allocatable", counted("gpu", gpu.node_allocatable))
    monkeypatch.setattr(topology, "from_node", counted("topology", topology.from_node))
    monkeypatch.setattr(resources, "node_allocatable", counted("resources", resources.node_allocatable))
    warm = _keep_building(builder if previous else snapshot_build.Builder(names=NAMES), nodes, pods)
    # topology.from_node reads the node's GPU count itself: count only build's own reads of it.
    calls["gpu"] -= calls["topology"]
    assert calls == parsed
    assert (warm.nodes, warm.pods, warm.problems) == (cold.nodes, cold.pods, cold.problems)
