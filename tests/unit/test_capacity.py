"""The one capacity model (common/capacity.py, common/resources.py, what common/snapshot.py counts): each
row an input that would hurt a user if it were counted wrong, with the answer and its reason."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from common import capacity, placement, resources, settings, snapshot, snapshot_build
from tests import builders

NAMES = settings.Names()
both = builders.both
EIGHT = [range(4), range(4, 8)]


def build(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=nodes, pods=pods, names=NAMES, taken_at=0.0)


def with_requests(cpu: str | None = None, memory: str | None = None) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        container = pod["spec"]["containers"][0]
        container.setdefault("resources", {})["requests"] = {
            **(container.get("resources", {}).get("limits") or {}), **requests}

    return mutate


def status(**fields: Any) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["status"].update(fields)

    return mutate


def deleting(pod: dict[str, Any]) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-11-21T10:05:00Z"


def pinned(node: str, *, gated: bool = False) -> builders.Mutator:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        if gated:
            pod["spec"]["schedulingGates"] = [{"name": NAMES.gate}]

    return mutate


def prefers(*weighted: tuple[str, int]) -> builders.Mutator:
    """Preferred terms naming nodes by metadata.name, as the webhook writes them."""
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": w, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}}
            for n, w in weighted]}}

    return mutate


# --- resources: the scheduler's arithmetic ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "resource", "expected"),
    [
        pytest.param("2", "cpu", 2000, id="cpu-cores-in-millicores"),
        pytest.param("250m", "cpu", 250, id="cpu-millicores"),
        pytest.param("0.1", "cpu", 100, id="cpu-decimal"),
        pytest.param("1n", "cpu", 1, id="cpu-rounds-up-like-MilliValue"),
        pytest.param("1Gi", "memory", 2**30, id="binary-suffix"),
        pytest.param("1G", "memory", 10**9, id="decimal-suffix"),
        pytest.param("1e3", "memory", 1000, id="exponent"),
        pytest.param("1.5Ki", "memory", 1536, id="fraction-of-binary"),
        pytest.param("500m", "memory", 1, id="fractional-bytes-round-up"),
        pytest.param(110, "pods", 110, id="integer-value"),
    ],
)
def test_quantity(value: Any, resource: str, expected: int) -> None:
    assert resources.parse(value, resource=resource) == expected


@pytest.mark.parametrize("value", ["", "1.2.3", "1Gb", "-1", "one", "1 Gi"])
def test_bad_quantity_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(resources.QuantityError, match="memory"):
        resources.parse(value, resource="memory")


def container(requests: Mapping[str, str] | None = None, limits: Mapping[str, str] | None = None,
              **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = dict(requests)
    if limits:
        res["limits"] = dict(limits)
    return {"name": "c", "resources": res, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [container({"cpu": "1"}), container({"cpu": "500m", "memory": "1Gi"})]},
                     {"cpu": 1500, "memory": 2**30}, id="containers-add-up"),
        pytest.param({"containers": [container(limits={"cpu": "2", "nvidia.com/gpu": "1"})]},
                     {"cpu": 2000, "nvidia.com/gpu": 1}, id="limits-stand-in-for-missing-requests"),
        pytest.param({"containers": [container({"cpu": "1"})], "initContainers": [container({"cpu": "4"})]},
                     {"cpu": 4000}, id="an-init-container-alone-may-need-more"),
        pytest.param({"containers": [container({"cpu": "1"})],
                      "initContainers": [container({"cpu": "1"}, restartPolicy="Always"), container({"cpu": "1"})]},
                     {"cpu": 2000}, id="sidecars-run-beside-everything-after-them"),
        pytest.param({"containers": [container({"cpu": "1"})], "overhead": {"cpu": "250m"}},
                     {"cpu": 1250}, id="runtime-overhead-counts"),
        pytest.param({"containers": [container({"cpu": "1", "nvidia.com/gpu": "2"})],
                      "resources": {"requests": {"cpu": "8"}}},
                     {"cpu": 8000, "nvidia.com/gpu": 2}, id="pod-level-resources-replace-cpu-and-memory-only"),
        pytest.param({"containers": [container({"cpu": "0"})]}, {}, id="zero-requests-vanish"),
    ],
)
def test_pod_requests(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert resources.pod_requests({"spec": spec}) == expected


# --- what a node holds -----------------------------------------------------------------------------


NODE = builders.gpu_node("n", gpus=8, domains=EIGHT)


@pytest.mark.parametrize(
    ("pods", "gpus_held", "cpu_held", "slots", "reserved"),
    [
        pytest.param([builders.pod("run", gpus=4, node="n", phase="Running")], 4, 0, 1, (), id="bound"),
        pytest.param([builders.pod("bye", gpus=4, node="n", phase="Running", mutate=deleting)], 4, 0, 1, (),
                     id="terminating-holds-until-gone"),
        pytest.param([builders.pod("done", gpus=4, node="n", phase="Succeeded")], 0, 0, 0, (),
                     id="finished-holds-nothing"),
        pytest.param([builders.pod("pre", gpus=8, mutate=status(nominatedNodeName="n"))], 8, 0, 1,
                     ("default/pre",), id="nominated-preemptor-holds-its-reservation"),
        pytest.param([builders.pod("pin", gpus=2, mutate=pinned("n"))], 2, 0, 1, ("default/pin",),
                     id="released-pinned-not-bound-holds"),
        pytest.param([builders.pod("gated", gpus=2, mutate=pinned("n", gated=True))], 0, 0, 0, (),
                     id="pinned-but-still-gated-holds-nothing"),
        pytest.param([builders.pod("lost", gpus=2, mutate=both(pinned("n"), status(conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}])))], 0, 0, 0, (),
                     id="pinned-but-its-node-went-to-another-pod-holds-nothing"),
        pytest.param([builders.pod("pre", gpus=2, mutate=both(status(nominatedNodeName="n"), deleting))], 0, 0, 0,
                     (), id="deleted-before-binding-holds-nothing"),
        pytest.param([builders.pod("web", node="n", phase="Running", mutate=with_requests(cpu="60"))], 0, 60_000, 1,
                     (), id="a-cpu-pod-on-a-gpu-node-holds-cpu-and-a-slot"),
        pytest.param([builders.pod("other", gpus=1, node="elsewhere", phase="Running")], 0, 0, 0, (),
                     id="pods-on-other-nodes-do-not-count"),
        # Tried and measured on the quick placement replay (2 runs each): counting such a pod on the node it
        # prefers kept gated 8-GPU pods off nodes the 1-GPU pods did not need (24, 25 of them bound against 27-31
        # without): unlike a pin, it may still go elsewhere.
        pytest.param([builders.pod("next", gpus=1, mutate=prefers(("n", 100)))], 0, 0, 0, (),
                     id="pending-pod-never-gated-preferring-the-node-holds-nothing"),
    ],
)
def test_what_a_node_holds(pods: list[dict[str, Any]], gpus_held: int, cpu_held: int, slots: int,
                           reserved: tuple[str, ...]) -> None:
    node = build([NODE], pods).nodes["n"]
    assert (node.requested_full, node.requested.get("cpu", 0), node.requested["pods"], node.reserved) == (
        gpus_held, cpu_held, slots, reserved)
    assert len(node.used) == gpus_held, "GPU indices of held GPUs are taken too"


# --- what a pod could get ----------------------------------------------------------------------------


def room_for(pods: list[dict[str, Any]], node: dict[str, Any] = NODE, **kwargs: Any) -> capacity.Room:
    snap = build([node], pods)
    return capacity.Room.of(snap.nodes[node["metadata"]["name"]], cluster=snap, **kwargs)


def asks(gpus: int = 1, cpu: str | None = None, memory: str | None = None) -> snapshot.Pod:
    return build([], [builders.pod("ask", gpus=gpus, mutate=with_requests(cpu, memory))]).pods["default/ask"]


SMALL_NODE = builders.gpu_node("n", gpus=8, domains=EIGHT, mutate=lambda n: n["status"]["allocatable"].update(
    {"cpu": "8", "memory": "16Gi", "pods": "3"}))


@pytest.mark.parametrize(
    ("pods", "node", "pod", "expected"),
    [
        pytest.param([], NODE, asks(4), (0, 1, 2, 3), id="empty-node-one-domain"),
        pytest.param([builders.pod("a", gpus=2, node="n", phase="Running")], NODE, asks(4), (4, 5, 6, 7),
                     id="the-free-domain"),
        pytest.param([builders.pod("a", gpus=2, node="n", phase="Running"),
                      builders.pod("b", gpus=2, node="n", phase="Running", created="2026-11-21T10:01:00Z",
                                   mutate=lambda p: None)],
                     NODE, asks(4), (4, 5, 6, 7), id="two-pods-fill-the-first-domain"),
        pytest.param([builders.pod("web", node="n", phase="Running", mutate=with_requests(cpu="6"))], SMALL_NODE,
                     asks(1, cpu="4"), "Insufficient cpu", id="short-of-cpu-gpus-free"),
        pytest.param([], SMALL_NODE, asks(1, memory="32Gi"), "Insufficient memory", id="short-of-memory"),
        pytest.param([builders.pod(f"w{i}", node="n", phase="Running") for i in range(3)], SMALL_NODE, asks(1),
                     "Too many pods", id="no-pod-slot-left"),
        pytest.param([builders.pod("bye", gpus=8, node="n", phase="Running", mutate=deleting)], NODE, asks(1),
                     "needs 1 GPU, 0 free", id="terminating-pod-still-holds-its-gpus"),
        pytest.param([builders.pod("pre", gpus=8, mutate=status(nominatedNodeName="n"))], NODE, asks(1),
                     "needs 1 GPU, 0 free", id="a-preemptor-nominated-here-holds-them"),
        pytest.param([builders.pod("a", gpus=2, node="n", phase="Running"),
                      builders.pod("b", gpus=2, node="n", phase="Running",
                                   mutate=lambda p: p["spec"].update(priority=1))],
                     NODE, asks(4), (4, 5, 6, 7), id="indices-estimated-by-the-policy"),
    ],
)
def test_place(pods: list[dict[str, Any]], node: dict[str, Any], pod: snapshot.Pod,
               expected: tuple[int, ...] | str) -> None:
    got = room_for(pods, node).place(pod.requests, pod.request)
    assert (got.indices if isinstance(got, placement.Allocation) else got) == expected


def test_split_free_gpus_do_not_hold_a_pod_one_domain_could() -> None:
    pods = [builders.pod("a", gpus=3, node="n", phase="Running"),
            builders.pod("b", gpus=1, node="n", phase="Running", created="2026-11-21T10:01:00Z")]
    # DCGM saw the device plugin put b on GPU 4: free 3 | 5,6,7.
    snap = snapshot_build.build(nodes=[NODE], pods=pods, names=NAMES, taken_at=0.0,
                                occupancy={"n": {0: "default/a", 1: "default/a", 2: "default/a", 4: "default/b"}})
    room = capacity.Room.of(snap.nodes["n"])
    pod = asks(4)
    assert room.place(pod.requests, pod.request) == "needs 4 GPU in one NVLink domain"
    spanning = room.place(pod.requests, pod.request, one_domain=False)
    assert isinstance(spanning, placement.Allocation) and spanning.spanned == 2


def test_leaving_pods_give_back_what_they_hold() -> None:
    pods = [builders.pod("idle", gpus=4, node="n", phase="Running", mutate=with_requests(cpu="60")),
            builders.pod("busy", gpus=4, node="n", phase="Running", created="2026-11-21T10:01:00Z")]
    pod = asks(4, cpu="8")
    assert room_for(pods).place(pod.requests, pod.request) == "needs 4 GPU, 0 free"
    freed = room_for(pods, leaving={"default/idle"}).place(pod.requests, pod.request)
    assert isinstance(freed, placement.Allocation) and freed.indices == (0, 1, 2, 3)


def test_take_counts_against_later_pods() -> None:
    room = room_for([])
    pod = asks(4)
    first = room.place(pod.requests, pod.request)
    assert isinstance(first, placement.Allocation)
    room.take(pod.requests, first)
    second = room.place(pod.requests, pod.request)
    assert isinstance(second, placement.Allocation) and second.indices == (4, 5, 6, 7)
    room.take(pod.requests, second)
    assert room.place(pod.requests, pod.request) == "needs 4 GPU, 0 free"
    assert room.free["pods"] == 108


def _gpus(count: int) -> dict[str, Any]:
    """A spec whose one container asks `count` device-plugin GPUs (what the `requests` vector says)."""
    return {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(count)}}}]}


@pytest.mark.parametrize(
    ("spec", "requests", "expected"),
    [
        pytest.param(_gpus(16), {"nvidia.com/gpu": 16}, "requests more than the node has: nvidia.com/gpu 16 > 8",
                     id="more-gpus-than-the-node"),
        pytest.param({}, {"nvidia.com/gpu": 2},
                     "asks 2 GPU of DRA device classes; the node's GPUs are a device plugin's",
                     id="gpus-asked-through-claims-on-a-device-plugin-node"),
        pytest.param({}, {"cpu": 128_000}, "requests more than the node has: cpu 128000 > 64000", id="more-cpu"),
        pytest.param({}, {"example.com/fpga": 1}, "requests more than the node has: example.com/fpga 1 > 0",
                     id="a-resource-the-node-lacks"),
        pytest.param({"nodeSelector": {"pool": "x"}}, {}, "nodeSelector pool=x does not match", id="filters-first"),
        pytest.param(_gpus(8), {"nvidia.com/gpu": 8, "cpu": 64_000}, None, id="exactly-everything-fits"),
    ],
)
def test_never(spec: dict[str, Any], requests: dict[str, int], expected: str | None) -> None:
    node = build([NODE], []).nodes["n"]
    assert capacity.never(spec, requests, node) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, None, id="plain"),
        pytest.param({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}},
                     "required podAntiAffinity (not modelled)", id="pod-anti-affinity"),
        pytest.param({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{}]}}},
                     None, id="preferred-pod-affinity-is-harmless"),
        pytest.param({"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}]}, None,
                     id="soft-spread"),
        pytest.param({"topologySpreadConstraints": [{"maxSkew": 1}]},
                     "topologySpreadConstraints DoNotSchedule (not modelled)", id="hard-spread-by-default"),
        pytest.param({"resourceClaims": [{"name": "gpu"}]}, "spec.resourceClaims (not modelled)", id="dra-claims"),
        pytest.param({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
                     "volume data is persistentVolumeClaim (volume filters not modelled)", id="claim"),
        pytest.param({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]},
                     "volume scratch is ephemeral (volume filters not modelled)", id="generic-ephemeral-claim"),
        pytest.param({"volumes": [{"name": "disk", "gcePersistentDisk": {"pdName": "d"}}]},
                     "volume disk is gcePersistentDisk (volume filters not modelled)", id="inline-cloud-disk"),
        pytest.param({"volumes": [{"name": "odd", "someFutureSource": {}}]},
                     "volume odd is someFutureSource (volume filters not modelled)", id="unknown-source"),
        pytest.param({"volumes": [{"name": "cfg", "configMap": {"name": "c"}}, {"name": "tmp", "emptyDir": {}},
                                  {"name": "tok", "projected": {"sources": []}}, {"name": "x", "csi": {}}]},
                     None, id="simple-volumes"),
        pytest.param({"volumes": [{"name": "defaulted"}]}, None, id="no-source-is-emptyDir-boundary"),
        *(pytest.param({"volumes": [{"name": "v", source: {}}]}, None, id=f"simple-{source}")
          for source in ("secret", "downwardAPI", "hostPath", "nfs", "image", "gitRepo")),
        pytest.param({"volumes": ["junk"]}, "a volume that is no object (volume filters not modelled)",
                     id="not-an-object"),
    ],
)
def test_ungoverned(spec: dict[str, Any], expected: str | None) -> None:
    assert capacity.ungoverned(spec) == expected


# --- properties --------------------------------------------------------------------------------------

_pod_specs = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 16), st.sampled_from(["Running", "Pending", "Succeeded"]),
              st.booleans(), st.booleans()),
    max_size=8,
)


def _pods(specs: list[tuple[int, int, str, bool, bool]]) -> list[dict[str, Any]]:
    out = []
    for i, (gpus, cpu, phase, bound, terminating) in enumerate(specs):
        mutators = [with_requests(cpu=str(cpu))]
        if terminating:
            mutators.append(deleting)
        if not bound:
            mutators.append(status(nominatedNodeName="n"))
        out.append(builders.pod(f"p{i}", gpus=gpus, node="n" if bound else None, phase=phase,
                                created=f"2026-11-21T10:{i:02d}:00Z", mutate=both(*mutators)))
    return out


@hypothesis.given(specs=_pod_specs, want_gpus=st.integers(1, 8), want_cpu=st.integers(0, 64))
@hypothesis.settings(max_examples=300, deadline=None)
def test_a_placement_never_overcommits_and_leaving_never_shrinks_the_room(
    specs: list[tuple[int, int, str, bool, bool]], want_gpus: int, want_cpu: int
) -> None:
    snap = build([NODE], _pods(specs))
    node = snap.nodes["n"]
    pod = asks(want_gpus, cpu=str(want_cpu))
    got = capacity.Room.of(node, cluster=snap).place(pod.requests, pod.request, one_domain=False)
    # The oracle, from the generated specs alone: bound and unfinished pods hold (terminating too); nominated
    # ones hold unless deleted or finished.
    holding = [(gpus, cpu) for gpus, cpu, phase, bound, terminating in specs
               if phase != "Succeeded" and (bound or not terminating)]
    fits = (sum(g for g, _ in holding) + want_gpus <= 8 and sum(c for _, c in holding) + want_cpu <= 64
            and len(holding) < 110)
    assert isinstance(got, placement.Allocation) == fits, got
    if isinstance(got, placement.Allocation):
        assert not set(got.indices) & node.used, "never a GPU another pod holds"
        freed = capacity.Room.of(node, cluster=snap, leaving=set(node.pods) | set(node.reserved))
        assert isinstance(freed.place(pod.requests, pod.request, one_domain=False), placement.Allocation), \
            "whatever leaves, the room only grows"
