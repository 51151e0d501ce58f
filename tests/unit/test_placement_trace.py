"""The pure parts of benchmarks/placement_trace.py: trace reading, NVLink mapping, replay plan, metrics; and how it
finds our processes and reads their CPU."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest

from benchmarks import placement_trace as pt
from common import settings, snapshot, snapshot_build, topology
from gpu_steward_lab import localcluster
from tests import builders

NAMES = settings.Names()


@pytest.mark.parametrize(
    ("gpus", "model", "domains"),
    [
        pytest.param(8, "G2", 2, id="8-gpu-two-domains-of-4"),
        pytest.param(4, "V100M16", 2, id="4-gpu-two-pairs"),
        pytest.param(2, "P100", 1, id="2-gpu-p100-one-pair"),
        pytest.param(1, "V100M16", 1, id="1-gpu-one-domain"),
        pytest.param(2, "T4", 2, id="t4-no-nvlink"),
        pytest.param(4, "T4", 4, id="4xt4-no-nvlink"),
        pytest.param(1, "A10", 1, id="a10-no-nvlink"),
    ],
)
def test_nvlink_mapping_follows_the_traces_readme(gpus: int, model: str, domains: int) -> None:
    assert pt.nvlink_domains(gpus=gpus, model=model) == domains


@pytest.mark.parametrize(
    ("gpus", "message"),
    [pytest.param(0, "at least one GPU", id="no-gpu"), pytest.param(6, "no NVLink mapping", id="6-gpu")],
)
def test_nvlink_mapping_refuses_what_it_does_not_know(gpus: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pt.nvlink_domains(gpus=gpus, model="G2")


def test_trace_node_becomes_a_kwok_node_with_our_topology_and_its_own_size() -> None:
    node = pt.trace_node_manifest(pt.TraceNode("openb-node-0007", 96000, 786432, 8, "G2"), names=NAMES)
    topo = topology.from_node(node, names=NAMES)
    assert node["metadata"]["name"] == "openb-node-0007"
    assert node["metadata"]["annotations"][localcluster.KWOK_NODE_ANNOTATION] == "fake"
    assert node["status"]["allocatable"] == {"cpu": "96000m", "memory": "786432Mi", "pods": "110",
                                             "nvidia.com/gpu": "8"}
    assert node["metadata"]["labels"][localcluster.GPU_PRODUCT_LABEL] == "G2"
    assert (topo.source, topo.domains) == (topology.Source.ANNOTATION, ((0, 1, 2, 3), (4, 5, 6, 7)))


@pytest.mark.parametrize(
    ("dra", "allocatable_gpus", "count_label"),
    [
        pytest.param(True, None, None, id="dra-no-device-plugin-gpus-no-count-label"),
        pytest.param(False, "8", "8", id="device-plugin-gpus-in-allocatable"),
    ],
)
def test_trace_node_with_dra_has_no_device_plugin_gpus_and_keeps_its_nvlink_topology(
        dra: bool, allocatable_gpus: str | None, count_label: str | None) -> None:
    node = pt.trace_node_manifest(pt.TraceNode("openb-node-0007", 96000, 786432, 8, "G2"), names=NAMES, dra=dra)
    topo = topology.from_node(node, names=NAMES)
    got = (node["status"]["allocatable"].get("nvidia.com/gpu"), node["status"]["capacity"].get("nvidia.com/gpu"),
           node["metadata"]["labels"].get("nvidia.com/gpu.count"), node["status"]["allocatable"]["cpu"])
    assert got == (allocatable_gpus, allocatable_gpus, count_label, "96000m")
    assert (topo.source, topo.domains) == (topology.Source.ANNOTATION, ((0, 1, 2, 3), (4, 5, 6, 7)))


TRACE_NODES = (pt.TraceNode("g2-8", 96000, 786432, 8, "G2"), pt.TraceNode("v100-4", 32000, 262144, 4, "V100M16"),
               pt.TraceNode("t4-2", 16000, 131072, 2, "T4"), pt.TraceNode("p100-1", 8000, 65536, 1, "P100"))


def test_dra_objects_are_nvidias_class_serving_the_extended_resource_and_a_slice_per_node_in_index_order() -> None:
    device_class, *slices = pt.dra_objects(TRACE_NODES)
    assert device_class == {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                      "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
                 "extendedResourceName": "nvidia.com/gpu"}}
    got = [(s["kind"], s["spec"]["driver"], s["spec"]["nodeName"], s["spec"]["pool"],
            [(d["name"], d["attributes"]["index"], d["attributes"]["type"], d["attributes"]["productName"])
             for d in s["spec"]["devices"]]) for s in slices]
    pool = {"generation": 1, "resourceSliceCount": 1}
    assert got == [("ResourceSlice", "gpu.nvidia.com", n.name, {"name": n.name, **pool},
                    [(f"gpu-{i}", {"int": i}, {"string": "gpu"}, {"string": n.model}) for i in range(n.gpus)])
                   for n in TRACE_NODES]
    assert len({s["metadata"]["name"] for s in slices}) == len(TRACE_NODES)


@pytest.mark.parametrize(
    ("node", "domains"),
    [
        pytest.param(TRACE_NODES[0], ((0, 1, 2, 3), (4, 5, 6, 7)), id="8-gpu-two-domains-of-4"),
        pytest.param(TRACE_NODES[1], ((0, 1), (2, 3)), id="4-gpu-two-pairs"),
        pytest.param(TRACE_NODES[2], ((0,), (1,)), id="t4-a-domain-per-gpu"),
        pytest.param(TRACE_NODES[3], ((0,),), id="1-gpu"),
    ],
)
def test_the_model_reads_each_dra_trace_node_as_its_gpus_in_contiguous_domains_first_fit_by_index(
        node: pt.TraceNode, domains: tuple[tuple[int, ...], ...]) -> None:
    """What our webhook and descheduler (and the tracker) see of a --dra trace node: DRA GPUs, the NVLink domains of
    the device plugin's node, and the allocator's order the slice's index order (so first fit fills a domain first)."""
    built = snapshot_build.from_list({"kind": "List", "items": [
        pt.trace_node_manifest(node, names=NAMES, dra=True), *pt.dra_objects([node])]}, names=NAMES, taken_at=0.0)
    got = built.nodes[node.name]
    assert (got.dra_gpus, got.gpu_count, got.topology.domains, got.device_order) == (
        True, node.gpus, domains, tuple(range(node.gpus)))
    assert not built.problems


def _dra_cluster(pods: list[dict[str, Any]], claims: dict[str, tuple[int, ...]],
                 *extra: dict[str, Any]) -> snapshot.Snapshot:
    """Nodes big and small of ROOMS as --dra nodes; `claims`: pod name -> the devices its claim was allocated."""
    nodes = [pt.TraceNode("big", 64000, 524288, 8, "G2"), pt.TraceNode("small", 8000, 524288, 4, "V100M16")]
    where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    made = [builders.resource_claim(f"{name}-x", spec=builders.claim_spec(len(devices)),
                                    devices=[(where[name], i) for i in devices], reserved_for=[name], extended=True)
            for name, devices in claims.items()]
    return snapshot_build.from_list({"kind": "List", "items": [
        *(pt.trace_node_manifest(n, names=NAMES, dra=True) for n in nodes), *pt.dra_objects(nodes), *pods, *made,
        *extra]},
        names=NAMES, taken_at=0.0)


def _dra_pod(name: str, gpus: int, node: str, second: int) -> dict[str, Any]:
    return _pod(name, gpus, node, second, mutate=builders.with_extended_claim(f"{name}-x"))


@pytest.mark.parametrize(
    ("orphans", "expected"),
    [
        # A deleted pod's claim still holds devices 0-1 (the controller has not deallocated it): the allocator cannot
        # give them, so they are not free before y, nor in the samples.
        pytest.param(((0, 1), "gone"), ((2, 4), pt.Fragmentation(12, 8, 0, 4)), id="a-deleted-pods-claim-holds-0-1"),
        pytest.param(((0, 1), None), ((2, 4), pt.Fragmentation(12, 8, 0, 4)), id="allocated-reserved-for-no-pod"),
        pytest.param(None, ((4, 4), pt.Fragmentation(12, 10, 2, 6)), id="no-other-claim"),
    ],
)
def test_tracker_on_dra_nodes_counts_devices_claimed_for_no_pod_as_taken(
        orphans: tuple[tuple[int, ...], str | None] | None, expected: tuple[tuple[int, ...], pt.Fragmentation]) -> None:
    extra = [] if orphans is None else [builders.resource_claim(
        "gone-x", spec=builders.claim_spec(len(orphans[0])), devices=[("big", i) for i in orphans[0]],
        reserved_for=[orphans[1]] if orphans[1] else [], extended=True)]
    tracker = pt.Tracker(rooms=ROOMS, requests={})
    tracker.observe(_dra_cluster([_dra_pod("y", 2, "big", 1)], {"y": (2, 3)}, *extra), now=1.0)
    assert (tracker.bindings["default/y"].free_before, tracker.sample(now=1.0)) == expected


def test_tracker_on_dra_nodes_judges_the_allocators_devices_once_the_claim_is_seen() -> None:
    """--dra: a pod is judged by its claim's devices. The allocator's first fit gave x devices 3-6 (both domains of
    big) while 4-7 was free: spanned 2 where 1 was possible; the policy would have said 4-7 (one domain)."""
    tracker = pt.Tracker(rooms=ROOMS, requests={})
    pods = [_dra_pod("a", 1, "big", 1), _dra_pod("b", 2, "big", 2), _dra_pod("x", 4, "big", 3)]
    tracker.observe(_dra_cluster(pods, {"a": (0,), "b": (1, 2)}), now=1.0)
    assert sorted(tracker.bindings) == ["default/a", "default/b"]  # x bound, its claim not seen allocated: not yet
    assert tracker.sample(now=1.0) == pt.Fragmentation(12, 9, 1, 5)
    tracker.observe(_dra_cluster(pods, {"a": (0,), "b": (1, 2), "x": (3, 4, 5, 6)}), now=2.0)
    assert tracker.bindings["default/x"] == pt.Binding("default/x", 4, "big", 2.0, 2, 1, free_before=(1, 4))
    assert tracker.sample(now=2.0) == pt.Fragmentation(12, 5, 1, 1)


def test_gpu_node_refuses_domains_that_do_not_divide_the_gpus() -> None:
    with pytest.raises(ValueError, match="do not divide"):
        localcluster.gpu_node("n", gpus=6, domains=4, product="X", names=NAMES, cpu="1", memory="1Gi")


def _nodes(*spec: tuple[str, int, int]) -> list[pt.TraceNode]:
    out = []
    for model, gpus, count in spec:
        out += [pt.TraceNode(f"{model}-{gpus}-{i}", 64000, 262144, gpus, model) for i in range(count)]
    return out


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        pytest.param(10, {("G2", 8): 5, ("T4", 2): 4, ("P100", 2): 1}, id="proportional"),
        pytest.param(3, {("G2", 8): 2, ("T4", 2): 1}, id="largest-remainder"),
        pytest.param(100, {("G2", 8): 10, ("T4", 2): 8, ("P100", 2): 2}, id="all-when-more-asked"),
    ],
)
def test_stratified_sample_is_proportional_by_model_and_gpu_count(count: int, expected: dict[Any, int]) -> None:
    nodes = _nodes(("G2", 8, 10), ("T4", 2, 8), ("P100", 2, 2))
    sample = pt.stratified_sample(nodes, count)
    got: dict[Any, int] = {}
    for node in sample:
        got[node.gpu_class] = got.get(node.gpu_class, 0) + 1
    assert got == expected
    assert sample == [n for n in nodes if n in sample]  # file order kept, first of each class


HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
DEFAULT_CSV = HEADER + """
p-0,8000,16384,1,1000,,LS,Running,50,150,50
p-1,4000,8192,1,500,,LS,Running,10,20,10
p-2,0,1024,0,0,,BE,Running,5,6,5
p-3,16000,32768,2,1000,,LS,Running,20,420,20
"""
MULTI_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
p-0,8000,16384,1,1000
p-1,4000,8192,1,500
p-3,16000,32768,2,1000
p-4,16000,32768,2,1000
"""


def _write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_read_pods_keeps_whole_gpu_pods_in_creation_order_and_counts_the_rest(tmp_path: pathlib.Path) -> None:
    got = pt.read_pods(_write(tmp_path, pt.POD_FILES["default"], DEFAULT_CSV))
    assert got.pods == (pt.TracePod("p-3", 16000, 32768, 2, 20, 420), pt.TracePod("p-0", 8000, 16384, 1, 50, 150))
    assert got.skipped == {"fractional GPU (sharing is out of scope)": 1, "no GPU": 1}


def test_untimed_rows_take_times_by_name_else_from_a_twin_with_the_same_requests(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, pt.POD_FILES["default"], DEFAULT_CSV)
    _write(tmp_path, pt.POD_FILES["multigpu50"], MULTI_CSV)
    got = pt.load_pods("multigpu50", directory=tmp_path)
    assert [(p.name, p.created, p.deleted) for p in got.pods] == [
        ("p-3", 20, 420), ("p-4", 20, 420), ("p-0", 50, 150)]


def test_untimed_row_without_a_twin_is_an_error(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,4,1000\n")
    with pytest.raises(ValueError, match="no timed pod with the same requests"):
        pt.read_pods(path, timed=())


def test_a_gpu_model_constraint_is_refused_not_silently_dropped(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, "d.csv", DEFAULT_CSV.replace("p-0,8000,16384,1,1000,,", "p-0,8000,16384,1,1000,V100M16,"))
    with pytest.raises(ValueError, match="gpu_spec 'V100M16'"):
        pt.read_pods(path)


def test_replay_plan_paces_arrivals_compresses_lifetimes_and_drops_deletions_after_the_end() -> None:
    pods = [pt.TracePod("a", 1, 1, 1, 0, 400), pt.TracePod("b", 1, 1, 1, 0, 10),
            pt.TracePod("c", 1, 1, 1, 0, 10**6)]
    plan = pt.replay_plan(pods, arrival_rate=2.0, compression=100.0)
    assert plan == [
        pt.Action(0.0, "create", 0),
        pt.Action(0.5, "create", 1),
        pt.Action(1.0, "create", 2),
        pt.Action(2.5, "delete", 1),  # 0.1 s raised to the minimum lifetime
        pt.Action(4.0, "delete", 0),  # 400 s / 100
    ]  # c lives past the last arrival + drain: runs to the end


@pytest.mark.parametrize(
    ("drain", "deleted"),
    [
        pytest.param(3.0, [0, 1, 2], id="all-leave-within-the-drain"),
        pytest.param(2.0, [0, 1, 2], id="boundary-a-deletion-at-the-end-is-kept"),
        pytest.param(1.9, [0, 1], id="a-deletion-after-the-end-is-dropped"),
        pytest.param(0.5, [], id="a-short-drain-drops-every-deletion"),
    ],
)
def test_replay_plan_ends_drain_seconds_after_the_last_arrival(drain: float, deleted: list[int]) -> None:
    pods = [pt.TracePod("a", 1, 1, 1, 0, 300), pt.TracePod("b", 1, 1, 1, 0, 10), pt.TracePod("c", 1, 1, 1, 0, 10)]
    plan = pt.replay_plan(pods, arrival_rate=1.0, compression=100.0, drain_seconds=drain)
    # arrivals at 0, 1, 2 (the end: 2 + drain); a leaves at 3 (300 s / 100), b at 3 and c at 4 (minimum lifetime 2 s)
    assert [a.pod for a in plan if a.kind == "delete"] == deleted


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        pytest.param({}, pt.Fragmentation(12, 12, 0, 0), id="empty"),
        pytest.param({"big": {0}}, pt.Fragmentation(12, 11, 3, 7), id="one-gpu-strands-its-domain-and-node"),
        pytest.param({"big": {0, 1, 2, 3}}, pt.Fragmentation(12, 8, 0, 4), id="full-domain-strands-only-the-node"),
        pytest.param({"big": set(range(8)), "pair": {0, 1}, "t4": {0, 1}}, pt.Fragmentation(12, 0, 0, 0),
                     id="full"),
        pytest.param({"t4": {1}}, pt.Fragmentation(12, 11, 0, 1), id="t4-domains-are-single-gpus"),
    ],
)
def test_fragmentation_counts_free_gpus_stranded_in_partly_used_domains_and_nodes(
    used: dict[str, set[int]], expected: pt.Fragmentation
) -> None:
    nodes = {"big": [[0, 1, 2, 3], [4, 5, 6, 7]], "pair": [[0, 1]], "t4": [[0], [1]]}
    assert pt.fragmentation(nodes, used) == expected


ROOMS = {
    "big": pt.NodeRoom(((0, 1, 2, 3), (4, 5, 6, 7)), 64000, 524288),
    "small": pt.NodeRoom(((0, 1), (2, 3)), 8000, 524288),
}


def _cluster(pods: list[dict[str, Any]]) -> snapshot.Snapshot:
    nodes = [builders.gpu_node("big", gpus=8, domains=[range(4), range(4, 8)]),
             builders.gpu_node("small", gpus=4, domains=[range(2), range(2, 4)])]
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0)


def _pod(name: str, gpus: int, node: str, second: int, **kw: Any) -> dict[str, Any]:
    return builders.pod(name, gpus=gpus, node=node, phase="Running", created=f"2026-01-01T00:00:{second:02d}Z", **kw)


def _tracker_with_big_nearly_full(**requests: tuple[int, int]) -> tuple[pt.Tracker, list[dict[str, Any]]]:
    """Pods a and b (3 GPUs each) on big, observed at 1.0: one GPU left free in each of big's domains."""
    asks = {"default/a": (1000, 1), "default/b": (1000, 1), **{f"default/{k}": v for k, v in requests.items()}}
    tracker = pt.Tracker(rooms=ROOMS, requests=asks)
    pods = [_pod("a", 3, "big", 1), _pod("b", 3, "big", 2)]
    tracker.observe(_cluster(pods), now=1.0)
    return tracker, pods


def test_tracker_judges_each_pod_against_the_cluster_the_earlier_pods_left() -> None:
    tracker, (a, b) = _tracker_with_big_nearly_full(c=(1000, 1))
    # a took domain 0; b then still fit domain 1 and got it.
    assert tracker.bindings["default/a"] == pt.Binding("default/a", 3, "big", 1.0, 1, 1, free_before=(4, 4))
    assert tracker.bindings["default/b"] == pt.Binding("default/b", 3, "big", 1.0, 1, 1, free_before=(1, 4))
    c = _pod("c", 2, "small", 3, annotations={pt.DECISION: "…"})
    tracker.observe(_cluster([a, b, c]), now=2.0)
    # With a and b on big, 1 GPU is free per big domain: only small's pairs could hold c in one domain.
    assert tracker.bindings["default/c"] == pt.Binding("default/c", 2, "small", 2.0, 1, 1, steered=True,
                                                       free_before=(2, 2))


def test_tracker_marks_a_pod_spread_over_two_domains_while_a_whole_pair_was_free_elsewhere() -> None:
    tracker, pods = _tracker_with_big_nearly_full(x=(1000, 1))
    x = _pod("x", 2, "big", 3)  # big has one free GPU per domain; small's pairs are both free
    tracker.observe(_cluster([*pods, x]), now=2.0)
    assert tracker.bindings["default/x"] == pt.Binding("default/x", 2, "big", 2.0, 2, 1, free_before=(1, 1))
    assert tracker.bindings["default/x"].fittable
    assert pt.placement_summary(list(tracker.bindings.values()))["one_domain_share"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param("2026-01-01T00:00:03Z planned=big domains=1 placed on big",
                     ("2026-01-01T00:00:03Z planned=big domains=1 placed on big", True),
                     id="released-and-bound-on-its-nominated-node/match"),
        pytest.param(None, (None, None), id="never-gated/not-judged"),
        pytest.param("2026-01-01T00:00:03Z placed without a nomination", ("2026-01-01T00:00:03Z placed without a "
                                                                          "nomination", None),
                     id="released-without-a-nomination/not-judged"),
        pytest.param("2026-01-01T00:00:03Z planned=small placed on small",
                     ("2026-01-01T00:00:03Z planned=small placed on small", False),
                     id="nominated-to-another-node/no-match"),
    ],
)
def test_tracker_records_our_release_and_whether_the_pod_bound_on_its_nominated_node(
    record: str | None, expected: tuple[str | None, bool | None],
) -> None:
    tracker = pt.Tracker(rooms=ROOMS, requests={})
    pod = _pod("r", 2, "big", 3, annotations={NAMES.release: record} if record else None)
    tracker.observe(_cluster([pod]), now=1.0)
    got = tracker.bindings["default/r"]
    assert (got.released, got.on_plan) == expected


def test_tracker_respects_cpu_when_asking_where_a_pod_could_have_gone() -> None:
    tracker, (a, b) = _tracker_with_big_nearly_full(c=(20000, 1))
    # c asks 2 GPUs and 20 cores: small has its pairs free but only 8 cores, so only big could take it,
    # where 1 GPU is free per domain: the fewest domains possible was 2, it is not domain-fittable.
    c = _pod("c", 2, "big", 3)
    tracker.observe(_cluster([a, b, c]), now=2.0)
    assert tracker.bindings["default/c"] == pt.Binding("default/c", 2, "big", 2.0, 2, 2, free_before=(1, 1))
    assert not tracker.bindings["default/c"].fittable


def test_tracker_samples_fragmentation_from_the_assigned_indices() -> None:
    tracker = pt.Tracker(rooms=ROOMS, requests={"default/a": (1000, 1)})
    tracker.observe(_cluster([_pod("a", 1, "small", 1)]), now=1.0)
    assert tracker.sample(now=1.0) == pt.Fragmentation(12, 11, 1, 3)
    assert tracker.resident() == 1


def _binding(gpus: int, spanned: int, fewest: int | None) -> pt.Binding:
    return pt.Binding(f"default/p{gpus}{spanned}{fewest}", gpus, "n", 0.0, spanned, fewest)


def test_placement_summary_counts_one_domain_placements_among_fittable_pods() -> None:
    got = pt.placement_summary([_binding(1, 1, 1), _binding(2, 1, 1), _binding(2, 2, 1), _binding(4, 2, 2),
                                _binding(8, 2, 2), _binding(8, 3, None)])
    assert got["multi_gpu_pods_bound"] == 5
    assert (got["fittable_in_one_domain"], got["in_one_domain_of_fittable"], got["one_domain_share"]) == (2, 1, 0.5)
    assert got["mean_domains_spanned"] == pytest.approx(10 / 5)
    assert got["mean_extra_domains"] == pytest.approx(1 / 4)
    assert got["by_size"]["8"] == {"pods": 2, "mean_domains_spanned": 2.5, "fittable_in_one_domain": 0,
                                   "in_one_domain_of_fittable": 0}


@pytest.mark.parametrize(
    ("bound_at", "counted"),
    [
        pytest.param(3.0, True, id="bound-during-the-replay/match"),
        pytest.param(12.0, False, id="bound-while-the-replay-pods-are-deleted/no-match"),
        pytest.param(10.0, True, id="bound-at-the-end/boundary"),
    ],
)
def test_only_bindings_seen_by_the_replays_end_are_its_placements(bound_at: float, counted: bool) -> None:
    early = pt.Binding("trace/a", 2, "n", 1.0, 1, 1)
    late = pt.Binding("trace/b", 4, "n", bound_at, 2, 1)
    replayed, teardown = pt.split_at_end([early, late], ended_at=10.0)
    assert (replayed, teardown) == (([early, late], []) if counted else ([early], [late]))


def test_table_reports_the_pods_bound_after_the_replay_apart() -> None:
    arm = {"placement": pt.placement_summary([]), "fragmentation": pt.fragmentation_summary([]),
           "placement_at_teardown": pt.placement_summary([_binding(2, 2, 1), _binding(4, 1, 1), _binding(8, 2, 2)]),
           "pending": {"never_scheduled": 0, "pending_at_end": 0, "pending_pod_seconds": 0.0,
                       "wait_p50_seconds": 0.1, "wait_p99_seconds": 7.0, "waits": {}},
           "burst": {"pods_per_second": 50.0}}
    lines = pt.table({"default": arm})
    assert any(line.startswith("  after the replay (not counted)") and "3: 1/2 in one" in line for line in lines)


@pytest.mark.parametrize(("dra", "shown"), [pytest.param(True, "true", id="dra"),
                                             pytest.param(None, "false", id="device-plugin-or-an-older-result")])
def test_table_says_whether_the_gpus_were_dra_devices(dra: bool | None, shown: str) -> None:
    arm = {"placement": pt.placement_summary([]), "fragmentation": pt.fragmentation_summary([]),
           "pending": {"never_scheduled": 0, "pending_at_end": 0, "pending_pod_seconds": 0.0,
                       "wait_p50_seconds": 0.1, "wait_p99_seconds": 7.0, "waits": {}},
           "burst": {"pods_per_second": 50.0}, **({} if dra is None else {"dra": dra})}
    (line,) = [line for line in pt.table({"default": arm, "gpu-steward": arm}) if line.startswith("dra")]
    assert line.split()[-2:] == [shown, shown]


def test_pending_summary_separates_pods_given_up_from_pods_still_waiting() -> None:
    got = pt.pending_summary(created={"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0}, deleted={"b": 5.0, "a": 9.0},
                             bound={"a": 0.5, "d": 4.0}, end=10.0)
    assert got["never_scheduled"] == 2
    assert (got["gave_up_while_pending"], got["pending_at_end"]) == (1, 1)
    assert got["pending_pod_seconds"] == pytest.approx(0.5 + 4.0 + 8.0 + 1.0)
    assert got["wait_max_seconds"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("gated", "expected"),
    [
        pytest.param({"g1", "g2"}, {"gated": (2, 3.0, 3.0), "not_gated": (2, 0.5, 0.5)}, id="split-by-gate"),
        pytest.param(set(), {"gated": (0, None, None), "not_gated": (4, 2.0, 3.0)}, id="nothing-gated"),
        pytest.param({"g1", "g2", "s1", "s2"}, {"gated": (4, 2.0, 3.0), "not_gated": (0, None, None)},
                     id="all-gated"),
    ],
)
def test_pending_summary_reports_gated_waits_apart(gated: set[str], expected: dict[str, tuple[Any, ...]]) -> None:
    got = pt.pending_summary(created={"g1": 0.0, "g2": 1.0, "g3": 2.0, "s1": 0.0, "s2": 1.0},
                             deleted={}, bound={"g1": 2.0, "g2": 4.0, "s1": 0.5, "s2": 1.5}, end=10.0,
                             gated=gated | ({"g3"} if "g1" in gated else set()))
    waits = {kind: (w["pods_bound"], w["wait_p50_seconds"], w["wait_max_seconds"]) for kind, w in got["waits"].items()}
    assert waits == {k: (n, p50 if p50 is None else pytest.approx(p50), top if top is None else pytest.approx(top))
                     for k, (n, p50, top) in expected.items()}
    assert got["never_scheduled_gated"] == (1 if "g1" in gated else 0)


def test_table_prints_gated_and_one_gpu_waits_per_arm() -> None:
    waits = {"gated": {"pods_bound": 3, "wait_p50_seconds": 0.3, "wait_p99_seconds": 7.0},
             "not_gated": {"pods_bound": 9, "wait_p50_seconds": 0.1, "wait_p99_seconds": 0.4}}
    arm = {"placement": pt.placement_summary([]), "fragmentation": pt.fragmentation_summary([]),
           "pending": {"never_scheduled": 0, "pending_at_end": 0, "pending_pod_seconds": 0.0,
                       "wait_p50_seconds": 0.1, "wait_p99_seconds": 7.0, "waits": waits},
           "burst": {"pods_per_second": 50.0}}
    lines = pt.table({"default": arm})
    assert any(line.startswith("  gated pods (2+ GPUs)") and "0.30 / 7.00 (3)" in line for line in lines)
    assert any(line.startswith("  1-GPU pods") and "0.10 / 0.40 (9)" in line for line in lines)


def _arm(share: float | None, never: int, rate: float, p99: float = 2.0) -> dict[str, Any]:
    return {"placement": {"one_domain_share": share}, "pending": {"never_scheduled": never, "wait_p99_seconds": p99},
            "burst": {"pods_per_second": rate}}


@pytest.mark.parametrize(
    ("ours", "met"),
    [
        pytest.param(_arm(0.996, 3, 95.0), [True, True, True, True], id="all-met"),
        pytest.param(_arm(0.99, 3, 95.0), [False, True, True, True], id="share-below-99.5"),
        pytest.param(_arm(0.996, 4, 95.0), [True, False, True, True], id="more-pending-than-best-baseline"),
        pytest.param(_arm(0.996, 3, 89.0), [True, True, False, True], id="throughput-below-90-percent"),
        pytest.param(_arm(None, 3, 95.0), [False, True, True, True], id="nothing-fittable-is-not-met"),
        pytest.param(_arm(0.996, 3, 95.0, p99=3.5), [True, True, True, False], id="p99-wait-over-1s-above-default"),
    ],
)
def test_goals_compare_gpu_steward_with_the_baselines(ours: dict[str, Any], met: list[bool]) -> None:
    arms = {"default": _arm(0.5, 5, 100.0), "binpack": _arm(0.6, 3, 98.0), "gpu-steward": ours}
    assert [g["met"] for g in pt.goals(arms)] == met


def test_our_processes_are_found_by_their_settings_file_and_their_cpu_read(tmp_path: pathlib.Path) -> None:
    """A process shaped like `python -m gpu_steward webhook --config FILE` (it burns 0.2 s of CPU, then sleeps)."""
    config_file = tmp_path / "gpu-steward.yaml"
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\ntime.sleep(60)"
    other = tmp_path / "other.yaml"
    argv = [sys.executable, "-c", burn, "gpu_steward", "webhook", "--config"]
    with subprocess.Popen([*argv, str(config_file)]) as ours, subprocess.Popen([*argv, str(other)]) as theirs:
        try:
            found = pt.steward_processes(config_file)
            assert found == {"webhook": localcluster.Pid.of(ours.pid)}
            deadline = time.monotonic() + 30
            while (found["webhook"].cpu_seconds() or 0.0) < 0.2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (found["webhook"].cpu_seconds() or 0.0) >= 0.2
        finally:
            ours.kill()
            theirs.kill()
    assert found["webhook"].cpu_seconds() is None  # gone


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], ("200", 2000, 0, 12.0, 10.0, list(pt.ARMS)), id="full-defaults"),
        pytest.param(["--quick"], ("20", 150, 1750, 20.0, 5.0, ["default", "gpu-steward"]), id="quick"),
        pytest.param(["--quick", "--arms", "gpu-steward", "--skip", "0", "--pods", "100"],
                     ("20", 100, 0, 20.0, 5.0, ["gpu-steward"]), id="quick-keeps-what-is-given"),
        pytest.param(["--skip", "2000", "--arms", "default,binpack"], ("200", 2000, 2000, 12.0, 10.0,
                     ["default", "binpack"]), id="full-with-a-slice"),
    ],
)
def test_the_quick_run_and_the_full_run_defaults(argv: list[str], expected: tuple[Any, ...]) -> None:
    args = pt.parse_args(argv)
    assert (args.nodes, args.pods, args.skip, args.arrival_rate, args.drain_seconds, args.arms) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["--quick", "--dra", "--arms", "default,gpu-steward"],
                     (True, "20", 150, 1750, ["default", "gpu-steward"], "placement_trace_quick_dra.json"),
                     id="dra-quick-with-arms"),
        pytest.param(["--dra", "--nodes", "60", "--pods", "600", "--skip", "300", "--arms", "gpu-steward"],
                     (True, "60", 600, 300, ["gpu-steward"], "placement_trace_dra.json"), id="dra-a-slice"),
        pytest.param(["--quick"], (False, "20", 150, 1750, ["default", "gpu-steward"], "placement_trace_quick.json"),
                     id="device-plugin-by-default"),
    ],
)
def test_dra_composes_with_the_other_options_and_never_overwrites_a_device_plugin_result(
        argv: list[str], expected: tuple[Any, ...]) -> None:
    args = pt.parse_args(argv)
    assert (args.dra, args.nodes, args.pods, args.skip, args.arms, args.out.name) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["--quick", "--out", "/tmp/x/result.json"], "/tmp/x/result.png",
                     id="quick-with-out-leaves-the-tree-alone"),
        pytest.param(["--out", "/tmp/y/slice.json"], "/tmp/y/slice.png", id="a-named-run-never-overwrites-another"),
        pytest.param(["--quick"], str(pt.DEFAULT_PICTURE.with_name("placement_domains_quick.png")), id="quick-default"),
        pytest.param(["--out", "/tmp/z/r.json", "--picture", "/tmp/p.png"], "/tmp/p.png", id="picture-given"),
    ],
)
def test_the_picture_goes_beside_the_json(argv: list[str], expected: str) -> None:
    assert str(pt.parse_args(argv).picture) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], {}, id="nothing-given-the-defaults"),
        pytest.param(["--release-min-gpus", "4"], {"admission": {"release_min_gpus": 4}}, id="release-min-gpus"),
        pytest.param(["--rebuild-interval", "0.1", "--release-min-gpus", "2"],
                     {"admission": {"release_min_gpus": 2}, "kubernetes": {"rebuild_interval_seconds": 0.1}},
                     id="both"),
        pytest.param(["--no-early-rebuilds"], {"descheduler": {"gangs": {"early_rebuilds": False}}},
                     id="no-early-rebuilds"),
    ],
)
def test_our_arms_get_the_settings_the_command_line_gives(argv: list[str], expected: dict[str, Any]) -> None:
    settings.Settings.model_validate(pt.steward_settings(pt.parse_args(argv)))  # each one is a real setting
    assert pt.steward_settings(pt.parse_args(argv)) == expected


def _gated(waits: dict[str, float]) -> dict[str, Any]:
    return {"placement": {"one_domain_share": 1.0}, "pending": {"never_scheduled": 0, "wait_p99_seconds": 1.0,
                                                                "gated_waits": waits},
            "burst": {"pods_per_second": 50.0}}


@pytest.mark.parametrize(
    ("ours", "default", "expected"),
    [
        pytest.param({"a": 0.3, "b": 0.5, "c": 0.7}, {"a": 0.2, "b": 0.25, "c": 0.3}, (3, 0.5, 0.25, True),
                     id="twice-is-met"),
        pytest.param({"a": 0.3, "b": 0.6, "c": 0.7}, {"a": 0.2, "b": 0.25, "c": 0.3}, (3, 0.6, 0.25, False),
                     id="over-twice-is-missed"),
        # Pods only our arm bound (they waited for room the default scheduler never found) compare with nothing.
        pytest.param({"a": 0.3, "b": 0.5, "c": 0.7, "late": 30.0, "later": 40.0}, {"a": 0.2, "b": 0.25, "c": 0.3},
                     (3, 0.5, 0.25, True), id="pods-bound-in-one-arm-only-are-left-out"),
        pytest.param({"a": 0.4}, {"b": 0.3}, (0, None, None, None), id="no-pod-bound-in-both"),
    ],
)
def test_gated_waits_compare_the_same_pods(ours: dict[str, float], default: dict[str, float],
                                           expected: tuple[Any, ...]) -> None:
    arms = {"default": _gated(default), "gpu-steward": _gated(ours)}
    same = pt.same_pods_gated(arms, arm="gpu-steward")
    assert same is not None
    pods, p50, base, met = expected
    assert (same["pods"], same["wait_p50_seconds"], same["default_wait_p50_seconds"]) == (
        pods, p50 if p50 is None else pytest.approx(p50), base if base is None else pytest.approx(base))
    goal = [g for g in pt.goals(arms) if "same pods" in g["goal"]]
    assert [g["met"] for g in goal] == ([] if met is None else [met])


def test_a_result_without_per_pod_waits_has_no_same_pods_comparison() -> None:
    arm = _gated({})
    del arm["pending"]["gated_waits"]
    assert pt.same_pods_gated({"default": arm, "gpu-steward": _gated({"a": 1.0})}, arm="gpu-steward") is None


def test_pending_summary_keeps_each_gated_pods_wait() -> None:
    got = pt.pending_summary(created={"g1": 0.0, "g2": 1.0, "s1": 0.0}, deleted={}, bound={"g1": 2.0, "s1": 0.5},
                             end=10.0, gated={"g1", "g2"})
    assert got["gated_waits"] == {"g1": pytest.approx(2.0)}
