"""Placement quality on a real trace: the real kube-scheduler alone, bin packing, and gpu-steward.

    python benchmarks/placement_trace.py [--nodes N|all] [--pods N] [--trace multigpu50|default]
        [--skip N] [--time-compression X] [--arrival-rate R] [--arms default,binpack,gpu-steward] [--dra] [--quick]
        [--out FILE]

One run, three arms one after another, each on a fresh local control plane (kube-apiserver, etcd,
kube-scheduler, kube-controller-manager via kwokctl; kwok plays the kubelets) with the same nodes
and the same pod sequence:
  * default       — kube-scheduler as shipped, no webhook;
  * binpack       — kube-scheduler with NodeResourcesFit MostAllocated (cpu 1, memory 1,
                    nvidia.com/gpu 3: the weights of Kubernetes' own bin-packing example);
  * gpu-steward   — kube-scheduler as shipped plus our webhook (`python -m gpu_steward webhook`),
                    registered with the API server, and our descheduler (`python -m gpu_steward
                    descheduler`, gang release only: reclaim off), each reading the cluster through its
                    watch feeder and GPU-index occupancy from a real Prometheus (see "GPU indices"
                    below). The webhook gates the pods whose placement we govern; the release
                    controller nominates each to its node and un-gates it;
  * gpu-steward+binpack — the same in front of the bin-packing scheduler.

Nodes: `openb_node_list_gpu_node.csv` (1,213 nodes), or a stratified sample: every (GPU model,
GPU count) class gets its share of N by largest remainder, its first nodes in file order. NVLink
domains follow benchmarks/data/README.md: T4/A10 none (one domain per GPU), 1 GPU one domain, 2 GPUs one
domain of 2, 4 GPUs two of 2, 8 GPUs two of 4. The model goes to `nvidia.com/gpu.product`.

Pods: GPU pods that ask for whole GPUs (num_gpu >= 1, gpu_milli 1000), with the trace's cpu and
memory requests. Fractional-GPU pods (gpu_milli < 1000) are skipped and counted: GPU sharing/MIG is
out of scope and the device plugin would not give them a whole GPU. `gpu_spec` is empty for every
pod of both files (checked at load: a pod with one is refused), so no model constraint applies.
`multigpu50` has no times: its first 8,152 rows are `default`'s rows (same names and requests) and
take their times; each of the 909 extra multi-GPU rows copies the times of a `default` pod with
the same requests (round robin among them), so it sits next to its twin in creation order.

Replay (a documented departure from wall-clock trace time): the trace's own timestamps never load
the cluster — at most 65 GPUs of 6,212 are in use at once over its 149 days (whole and fractional
pods together) — so a literal time replay would measure an empty cluster. Pods therefore arrive in
creation order at `--arrival-rate` pods/s and each lives its trace lifetime (deletion - creation)
divided by `--time-compression` (at least `MIN_LIFETIME_SECONDS`, so every binding is observed). A
pod still pending when its lifetime ends is deleted anyway, as its user did in the trace. The replay
ends `DRAIN_SECONDS` (--quick: 5 s) after the last arrival. Then all pods are deleted and a burst of pods (the
sequence's first 1-GPU pods, up to `BURST_GPU_SHARE` of the cluster's GPUs) is created at once: the burst's
pods bound per second is the scheduling throughput (it includes the webhook call in arm c).

GPU indices inside a node: kwok has no device plugin, so `gpu_steward_lab.devicesim.Assignments` (the one
policy: smallest free NVLink domain that fits, else fewest domains; a pod keeps its indices) assigns
them in every arm (with --dra, below, kube-scheduler's allocator does, and devicesim reports its choice),
updated on every cluster change this benchmark sees, and the same object is served
as DCGM series to a real Prometheus in every arm (same load everywhere). In arm c the webhook reads
those series like it reads dcgm-exporter in production. Why not let the webhook estimate indices
itself: its estimate re-places every pod of a node oldest first at each rebuild, while a device
plugin keeps a pod's GPUs; after departures the two differ (free GPUs per domain (3, 2) versus
(1, 4) for the same pods), so only the observed series make the webhook see what is measured.

--dra: every trace node's GPUs are DRA devices (`resource.k8s.io/v1`), as with NVIDIA's DRA driver: the node has no
`nvidia.com/gpu` in its allocatable (nor the `nvidia.com/gpu.count` label), and a ResourceSlice of its own (driver
`gpu.nvidia.com`, pool = the node) lists its GPUs `gpu-0`.. with the attributes `type: gpu` and `index`, in index order,
so that each NVLink domain is a run of devices in the slice; one DeviceClass `gpu.nvidia.com` (NVIDIA's selector) has
`extendedResourceName: nvidia.com/gpu` (all from `gpu_steward_lab.dra_devices`). Pods are unchanged (`nvidia.com/gpu:
N`): kube-scheduler makes each pod's claim and its allocator picks the devices, first fit in slice order, knowing
nothing of NVLink (docs/placement.md). Which GPUs a pod holds is then its claim's allocation
(`status.extendedResourceClaimStatus.resourceClaimName` -> the ResourceClaim's `status.allocation.devices.results`,
their `index`), read by the model (`common.dra`, `snapshot.Pod.indices_observed`), not chosen by devicesim: a pod is
judged, and counted in the fragmentation samples, from the first cluster change at which its claim is seen allocated;
devices a claim holds for no pod of the node (a deleted pod's claim not yet deallocated) count as taken, as they are
for the allocator.
The DCGM stand-in still serves every GPU, now labelled with the pod its claim gave it (as dcgm-exporter 4.8.4 and later
label DRA-allocated GPUs; its `dra_*` labels are left out), so Prometheus has the same load as without --dra; our
webhook and descheduler read DRA allocations from the claims, not from those series (settings `dra.gpu_device_classes`
names the class in our arms). The binpack arms' MostAllocated weight on `nvidia.com/gpu` has nothing in allocatable to
weigh on DRA nodes: not measured with --dra. kube-scheduler binds DRA pods more slowly (it writes each pod's claim and
its allocation before binding; Kubernetes' DRA documentation warns of it): on this machine the default arm's burst
bound 9.7 (quick) and 8.5 (60 nodes) pods/s with --dra against 35.4 and 34.2 without (load average 5-9), and 12.6 on
the quick slice with the scheduler's client limit raised from qps 50 to 500, so at the replay's arrival rates pods
queue that would not queue without DRA, and the never-scheduled and wait rows weigh the scheduler's throughput as much
as placement.

Measured per arm: for every multi-GPU pod, the NVLink domains its GPUs span and the fewest it could
have spanned on any node that could hold it (GPUs, cpu, memory) at the moment it was bound; the share
of domain-fittable pods (fewest == 1) placed in one domain, counting the pods bound during the replay (like the
waits); the pods still pending at its end that bind while the replay's pods are all being deleted are reported apart
(`placement_at_teardown`; on the quick slice most multi-GPU pods); each binding in `bindings` (node, free GPUs per
domain before it, domains spanned, fewest possible, our release record and whether it bound on the node the release
nominated it to); GPU fragmentation sampled every `SAMPLE_SECONDS` (free GPUs in partly used domains / partly used
nodes); pods never scheduled and create-to-bound waits, for all pods and split into the pods our webhook gates
(`admission.release_min_gpus` whole GPUs or more, 2 by default: placed at release in our arms) and the rest (1-GPU
pods, preferred terms only), in every arm, so the release path's own wait is seen apart; nominations missed: of the
pods our release nominated that bound, those bound on another node (the nominated node was taken first); burst
throughput; in our arms, the CPU seconds our webhook and descheduler processes used during the replay and the burst
(from /proc). Prints a table, writes JSON (--out) and a PNG bar chart (--picture), and each arm's wall time by step
(control plane and nodes, until the feeder and our processes are ready, replay, burst, stop; `phases` in the JSON)
beside the load average. The JSON and the table say `dra` (true: --dra).

--quick (CI): the default scheduler against gpu-steward (unless --arms), each on its own control plane as above,
20 nodes (102 GPUs) and 150 pods from #1750 of multigpu50 (109 1-GPU, 28 2-GPU and 13 4-GPU pods: 41 pods that
our webhook gates, domain-fittable on the 8-GPU and P100 nodes) at 20 pods/s, the replay ending 5 s after the last
arrival (12.5 s), then a burst of 61 1-GPU pods. Every row of the table is measured; the numbers are small-sample:
the cluster is full 4-6 s into the replay, so its one-domain share is of the 7-10 4-GPU pods bound before that (no
2-GPU pod binds until the teardown), and its fragmentation rows average ratios of 2-3 free GPUs (RESULTS.md).
CI (scripts/test) runs --quick without --dra: `--quick --dra` took 125 and 134 s against 99 and 93 s for --quick in two
back-to-back pairs (load average 2.9-6.9), and its small sample is dominated by the scheduler's DRA throughput (above);
run it by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import csv
import dataclasses
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from aiohttp import web  # noqa: E402
from kubernetes_asyncio import client  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from common import feeder, gpu, kube, placement, settings, snapshot  # noqa: E402
from descheduler.release import outcomes  # noqa: E402
from gpu_steward_lab import demo, devicesim, dra_devices, localcluster, localprometheus, localsteward  # noqa: E402

TRACES = ROOT / "benchmarks" / "data" / "alibaba-openb"  # the public traces (benchmarks/data/README.md)
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILES = {"default": "openb_pod_list_default.csv", "multigpu50": "openb_pod_list_multigpu50.csv"}
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "placement_trace.json"
DEFAULT_PICTURE = ROOT / "benchmarks" / "results" / "placement_domains.png"
ARMS = ("default", "binpack", "gpu-steward", "gpu-steward+binpack")
OURS = ("gpu-steward", "gpu-steward+binpack")  # arms with our webhook; the rest are baselines
BINPACKING = ("binpack", "gpu-steward+binpack")
NAMESPACE = "trace"
BURST_NAMESPACE = "burst"
DECISION = settings.Names().decision
RELEASE = settings.Names().release
NO_NVLINK_MODELS = frozenset({"T4", "A10"})
MIN_LIFETIME_SECONDS = 2.0
DRAIN_SECONDS = 10.0
SAMPLE_SECONDS = 2.0
SCRAPE_SECONDS = 2
BURST_GPU_SHARE = 0.6
BURST_MAX_PODS = 400
BURST_TIMEOUT_SECONDS = 120.0
CREATE_CONCURRENCY = 32
API_TIMEOUT_SECONDS = 30.0
# Deleting a namespace's pods at once (before the burst): the API server deletes them one by one before it answers;
# seen taking over 30 s for ~300 pods with --dra (60 nodes, load average 9 on 2 cores).
COLLECTION_TIMEOUT_SECONDS = 180.0
# --quick (CI's target: about a minute): a baseline against our arm, each on its own control plane, on a slice with
# 1-, 2- and 4-GPU pods (the first 250 pods hold only 1- and 8-GPU pods: no domain-fittable pod).
QUICK = {"nodes": "20", "pods": 150, "skip": 1750, "arrival_rate": 20.0, "drain_seconds": 5.0,
         "arms": "default,gpu-steward"}
GOALS = {"one_domain_share": 0.995, "throughput_ratio": 0.90, "wait_p99_over_default_seconds": 1.0,
         "gated_p50_over_default": 2.0}
LEASE_NAMESPACE = "gpu-steward"
GPU_DEVICE_CLASSES = (dra_devices.NVIDIA_DRIVER,)  # --dra: the DeviceClass of dra_objects, in every model we run
BINPACK_SCHEDULER = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": "default-scheduler",
            "pluginConfig": [
                {
                    "name": "NodeResourcesFit",
                    "args": {
                        "scoringStrategy": {
                            "type": "MostAllocated",
                            "resources": [
                                {"name": "cpu", "weight": 1},
                                {"name": "memory", "weight": 1},
                                {"name": gpu.FULL_GPU, "weight": 3},
                            ],
                        }
                    },
                }
            ],
        }
    ],
}


# --- the trace (pure) ------------------------------------------------------------------------------


def nvlink_domains(*, gpus: int, model: str) -> int:
    """How many NVLink domains a trace node has (benchmarks/data/README.md); domains are equal-sized."""
    if gpus < 1:
        raise ValueError(f"a GPU node needs at least one GPU, got {gpus}")
    if model in NO_NVLINK_MODELS:
        return gpus  # no NVLink: every GPU is its own domain
    by_count = {1: 1, 2: 1, 4: 2, 8: 2}
    if gpus not in by_count:
        raise ValueError(f"no NVLink mapping for a {gpus}-GPU {model} node")
    return by_count[gpus]


@dataclasses.dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    @property
    def domains(self) -> int:
        return nvlink_domains(gpus=self.gpus, model=self.model)

    @property
    def gpu_class(self) -> tuple[str, int]:
        return self.model, self.gpus


@dataclasses.dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    created: int  # trace seconds
    deleted: int

    @property
    def lifetime(self) -> int:
        return max(0, self.deleted - self.created)


@dataclasses.dataclass(frozen=True)
class PodSet:
    pods: tuple[TracePod, ...]  # whole-GPU pods in creation order
    skipped: Mapping[str, int]  # why -> how many


def read_nodes(path: pathlib.Path) -> list[TraceNode]:
    with path.open(newline="") as handle:
        return [
            TraceNode(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"]), row["model"])
            for row in csv.DictReader(handle)
        ]


def stratified_sample(nodes: Sequence[TraceNode], count: int) -> list[TraceNode]:
    """`count` nodes, each (model, GPU count) class by its share (largest remainder; ties to the bigger
    class), taking a class's first nodes in file order; the result keeps file order."""
    if count >= len(nodes):
        return list(nodes)
    classes: dict[tuple[str, int], list[TraceNode]] = collections.defaultdict(list)
    for node in nodes:
        classes[node.gpu_class].append(node)
    quotas = {c: count * len(members) / len(nodes) for c, members in classes.items()}
    taken = {c: math.floor(q) for c, q in quotas.items()}
    by_remainder = sorted(classes, key=lambda c: (-(quotas[c] - taken[c]), -len(classes[c]), c))
    for c in by_remainder[: count - sum(taken.values())]:
        taken[c] += 1
    chosen = {n.name for c, members in classes.items() for n in members[: taken[c]]}
    return [n for n in nodes if n.name in chosen]


def read_pods(path: pathlib.Path, *, timed: Sequence[TracePod] = ()) -> PodSet:
    """Whole-GPU pods of a trace file in creation order. Rows without times (multigpu50) take them from
    the `timed` pod of the same name, else from a `timed` pod with the same requests (round robin)."""
    skipped: collections.Counter[str] = collections.Counter()
    rows: list[dict[str, str]] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("gpu_spec"):
                raise ValueError(f"{row['name']}: gpu_spec {row['gpu_spec']!r} is not modelled by this benchmark")
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if gpus < 1:
                skipped["no GPU"] += 1
            elif milli < 1000:
                skipped["fractional GPU (sharing is out of scope)"] += 1
            else:
                rows.append(row)
    by_name = {p.name: p for p in timed}
    twins: dict[tuple[int, int, int], list[TracePod]] = collections.defaultdict(list)
    for pod in timed:
        twins[(pod.cpu_milli, pod.memory_mib, pod.gpus)].append(pod)
    used: collections.Counter[tuple[int, int, int]] = collections.Counter()
    pods = []
    for row in rows:
        cpu, memory, gpus = int(row["cpu_milli"]), int(row["memory_mib"]), int(row["num_gpu"])
        if row.get("creation_time"):
            times = (int(row["creation_time"]), int(row["deletion_time"]))
        elif row["name"] in by_name:
            times = (by_name[row["name"]].created, by_name[row["name"]].deleted)
        else:
            shape = (cpu, memory, gpus)
            if not twins[shape]:
                raise ValueError(f"{row['name']}: no times and no timed pod with the same requests")
            twin = twins[shape][used[shape] % len(twins[shape])]
            used[shape] += 1
            times = (twin.created, twin.deleted)
        pods.append(TracePod(row["name"], cpu, memory, gpus, *times))
    pods.sort(key=lambda p: (p.created, p.name))
    return PodSet(tuple(pods), dict(skipped))


def load_pods(trace: str, *, directory: pathlib.Path = TRACES) -> PodSet:
    timed = () if trace == "default" else read_pods(directory / POD_FILES["default"]).pods
    return read_pods(directory / POD_FILES[trace], timed=timed)


@dataclasses.dataclass(frozen=True, order=True)
class Action:
    at: float  # wall seconds from the replay's start
    kind: Literal["create", "delete"]
    pod: int  # index into the pod sequence


def replay_plan(
    pods: Sequence[TracePod], *, arrival_rate: float, compression: float, min_lifetime: float = MIN_LIFETIME_SECONDS,
    drain_seconds: float = DRAIN_SECONDS,
) -> list[Action]:
    """Arrivals every 1/arrival_rate s in order; each pod deleted after its compressed trace lifetime.
    Deletions later than the last arrival + `drain_seconds` are left out (those pods run to the end)."""
    if arrival_rate <= 0 or compression <= 0:
        raise ValueError("arrival rate and time compression must be positive")
    end = (len(pods) - 1) / arrival_rate + drain_seconds if pods else 0.0
    actions = []
    for index, pod in enumerate(pods):
        start = index / arrival_rate
        actions.append(Action(start, "create", index))
        stop = start + max(min_lifetime, pod.lifetime / compression)
        if stop <= end:
            actions.append(Action(stop, "delete", index))
    return sorted(actions)


def trace_node_manifest(node: TraceNode, *, names: settings.Names, dra: bool = False) -> dict[str, Any]:
    """The kwok node of a trace node; `dra`: its GPUs are DRA devices (`dra_objects`), not the device plugin's."""
    manifest = localcluster.gpu_node(node.name, gpus=node.gpus, domains=node.domains, product=node.model, names=names,
                                     cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi")
    return dra_devices.without_device_plugin(manifest) if dra else manifest


def dra_objects(nodes: Sequence[TraceNode]) -> list[dict[str, Any]]:
    """--dra: NVIDIA's DeviceClass serving `nvidia.com/gpu`, and each node's ResourceSlice listing its GPUs in index
    order (its NVLink domains contiguous, as `localcluster.NodeGroup.topology` numbers them)."""
    return [dra_devices.device_class(),
            *(dra_devices.resource_slice(n.name, n.gpus, product=n.model) for n in nodes)]


def pod_manifest(pod: TracePod, *, namespace: str, name: str | None = None) -> dict[str, Any]:
    gpus = str(pod.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or pod.name, "namespace": namespace, "labels": {"app": "openb"}},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "registry.local/openb:1",
                "resources": {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi",
                                           gpu.FULL_GPU: gpus}, "limits": {gpu.FULL_GPU: gpus}},
            }],
            "terminationGracePeriodSeconds": 0,
        },
    }


# --- measuring (pure: fed snapshots and times) ------------------------------------------------------


def domains_spanned(domains: Sequence[Sequence[int]], indices: Iterable[int]) -> int:
    held = set(indices)
    return sum(1 for domain in domains if held & set(domain))


@dataclasses.dataclass(frozen=True)
class Fragmentation:
    total: int
    free: int
    stranded_in_domains: int  # free GPUs in domains that are partly used
    stranded_in_nodes: int  # free GPUs on nodes that are partly used

    @property
    def used_share(self) -> float:
        return (self.total - self.free) / self.total if self.total else 0.0


def fragmentation(nodes: Mapping[str, Sequence[Sequence[int]]], used: Mapping[str, set[int]]) -> Fragmentation:
    total = free = in_domains = in_nodes = 0
    for name, domains in nodes.items():
        taken = used.get(name, set())
        node_free = 0
        for domain in domains:
            domain_free = sum(1 for i in domain if i not in taken)
            node_free += domain_free
            if 0 < domain_free < len(domain):
                in_domains += domain_free
        size = sum(len(d) for d in domains)
        total += size
        free += node_free
        if 0 < node_free < size:
            in_nodes += node_free
    return Fragmentation(total, free, in_domains, in_nodes)


@dataclasses.dataclass(frozen=True)
class NodeRoom:
    domains: tuple[tuple[int, ...], ...]
    cpu_milli: int
    memory_mib: int


@dataclasses.dataclass(frozen=True)
class Binding:
    pod: str  # namespace/name
    gpus: int
    node: str
    bound_at: float
    spanned: int  # NVLink domains its GPUs span
    fewest: int | None  # fewest domains any node that could hold it offered then (None: none could)
    steered: bool = False  # carries gpu-steward's decision record (its webhook admitted it)
    released: str | None = None  # our release record (`gpu-steward.io/release`): gated, then placed by us
    on_plan: bool | None = None  # bound on the node our release nominated it to (None: not nominated by us)
    free_before: tuple[int, ...] = ()  # free GPUs per NVLink domain of its node just before it

    @property
    def fittable(self) -> bool:
        return self.fewest == 1


@dataclasses.dataclass
class Tracker:
    """Follows a cluster through its snapshots: GPU indices (devicesim's: its policy on device-plugin nodes, the
    claims' allocation on DRA nodes) and one `Binding` per pod.

    `rooms`: each node's NVLink domains and cpu/memory; `requests`: each pod's (cpu milli, memory MiB).
    """

    rooms: Mapping[str, NodeRoom]
    requests: Mapping[str, tuple[int, int]]
    assignments: devicesim.Assignments = dataclasses.field(default_factory=devicesim.Assignments)
    bindings: dict[str, Binding] = dataclasses.field(default_factory=dict)
    samples: list[tuple[float, Fragmentation]] = dataclasses.field(default_factory=list)
    # At each sample, each node's free GPUs per NVLink domain and free cpu (milli): where the free GPUs were.
    layouts: list[tuple[float, dict[str, tuple[tuple[int, ...], int]]]] = dataclasses.field(default_factory=list)
    # DRA nodes: devices a claim holds for no pod on the node (a deleted pod's, not yet deallocated), as last seen:
    # taken all the same for the allocator, so never free here.
    claimed: dict[str, set[int]] = dataclasses.field(default_factory=dict)

    def observe(self, cluster: snapshot.Snapshot, *, now: float) -> list[Binding]:
        """Record pods bound since the last call, in creation order, each judged against the cluster as
        the earlier ones left it (pods that ended are gone first)."""
        resident = {p.key for p in cluster.pods.values() if p.holds_gpus and p.request.full}
        new = sorted((p for p in cluster.pods.values() if p.key in resident and p.key not in self.bindings),
                     key=lambda p: (p.created, p.key))
        fresh = {p.key for p in new}
        # The devicesim server may have assigned some new pods already: judge from the state without them.
        held = {node: {k: v for k, v in pods.items() if k in resident and k not in fresh}
                for node, pods in self.assignments.by_node.items()}
        self.assignments.update(cluster)
        self.claimed = claimed_by_others(cluster)
        used = self._used(held)
        load = {node: [sum(self.requests.get(k, (0, 0))[j] for k in pods) for j in (0, 1)]
                for node, pods in held.items()}
        out = []
        for pod in new:
            node = pod.node_name or ""
            indices = self.assignments.by_node.get(node, {}).get(pod.key, ())
            room = self.rooms.get(node)
            if room is None or not indices:
                continue  # not a trace node, over-committed, or its claim not seen allocated yet: not judged now
            cpu, memory = self.requests.get(pod.key, (0, 0))
            binding = Binding(pod.key, pod.request.full, node, now, domains_spanned(room.domains, indices),
                              self._fewest(pod.request.full, cpu, memory, used, load),
                              steered=DECISION in pod.annotations, released=pod.annotations.get(RELEASE),
                              on_plan=planned == node if (planned := nominated_to(pod.annotations.get(RELEASE)))
                              else None,
                              free_before=tuple(sum(1 for i in d if i not in used.get(node, set()))
                                                for d in room.domains))
            self.bindings[pod.key] = binding
            out.append(binding)
            used.setdefault(node, set()).update(indices)
            spent = load.setdefault(node, [0, 0])
            spent[0] += cpu
            spent[1] += memory
        return out

    def _fewest(self, gpus: int, cpu: int, memory: int, used: Mapping[str, set[int]],
                load: Mapping[str, list[int]]) -> int | None:
        best: int | None = None
        for name, room in self.rooms.items():
            spent = load.get(name, [0, 0])
            if spent[0] + cpu > room.cpu_milli or spent[1] + memory > room.memory_mib:
                continue
            choice = placement.allocate(placement.free_by_domain(room.domains, used.get(name, set())), gpus)
            if choice is not None and (best is None or choice.spanned < best):
                best = choice.spanned
                if best == 1:
                    break
        return best

    def _used(self, by_node: Mapping[str, Mapping[str, tuple[int, ...]]]) -> dict[str, set[int]]:
        """GPU indices taken per node: those of `by_node`'s pods, and on DRA nodes those `claimed` for no pod."""
        used = {node: {i for v in pods.values() for i in v} for node, pods in by_node.items()}
        for node, taken in self.claimed.items():
            used.setdefault(node, set()).update(taken)
        return used

    def sample(self, *, now: float) -> Fragmentation:
        used = self._used(self.assignments.by_node)
        frag = fragmentation({n: r.domains for n, r in self.rooms.items()}, used)
        self.samples.append((now, frag))
        cpu = {node: sum(self.requests.get(k, (0, 0))[0] for k in pods)
               for node, pods in self.assignments.by_node.items()}
        self.layouts.append((now, {n: (tuple(sum(1 for i in d if i not in used.get(n, set())) for d in r.domains),
                                       r.cpu_milli - cpu.get(n, 0)) for n, r in self.rooms.items()}))
        return frag

    def resident(self) -> int:
        return sum(len(pods) for pods in self.assignments.by_node.values())


def claimed_by_others(cluster: snapshot.Snapshot) -> dict[str, set[int]]:
    """Per DRA node, the GPU indices the model counts as taken but by none of the pods holding the node: devices of
    claims that outlive their pod (deallocated only once kube-controller-manager sees the pod gone) or tainted."""
    return {name: set(node.used) - {i for key in (*node.pods, *node.reserved) for i in cluster.pods[key].gpu_indices}
            for name, node in cluster.nodes.items() if node.dra_gpus}


def nominated_to(record: str | None) -> str | None:
    """The node our release nominated a pod to, from its release record (`planned=`), if it did."""
    return outcomes.read(record).node if record is not None else None


# --- summarising (pure) -----------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def placement_summary(bindings: Sequence[Binding]) -> dict[str, Any]:
    multi = [b for b in bindings if b.gpus > 1]
    fittable = [b for b in multi if b.fittable]
    by_size: dict[str, Any] = {}
    for size in sorted({b.gpus for b in multi}):
        group = [b for b in multi if b.gpus == size]
        by_size[str(size)] = {
            "pods": len(group),
            "mean_domains_spanned": statistics.fmean(b.spanned for b in group),
            "fittable_in_one_domain": sum(b.fittable for b in group),
            "in_one_domain_of_fittable": sum(b.fittable and b.spanned == 1 for b in group),
        }
    extra = [b.spanned - b.fewest for b in multi if b.fewest is not None]
    return {
        "multi_gpu_pods_bound": len(multi),
        "admitted_by_gpu_steward": sum(b.steered for b in bindings),
        "fittable_in_one_domain": len(fittable),
        "in_one_domain_of_fittable": sum(b.spanned == 1 for b in fittable),
        "one_domain_share": (sum(b.spanned == 1 for b in fittable) / len(fittable)) if fittable else None,
        "mean_domains_spanned": statistics.fmean(b.spanned for b in multi) if multi else None,
        "mean_extra_domains": statistics.fmean(extra) if extra else None,
        "by_size": by_size,
    }


def split_at_end(bindings: Sequence[Binding], *, ended_at: float) -> tuple[list[Binding], list[Binding]]:
    """The bindings seen by the replay's end, and those after it. Pods still pending when the replay ends bind while
    `_burst` deletes all the replay's pods at once: not the replay's placements (its waits stop at its end too)."""
    return [b for b in bindings if b.bound_at <= ended_at], [b for b in bindings if b.bound_at > ended_at]


def fragmentation_summary(samples: Sequence[tuple[float, Fragmentation]]) -> dict[str, Any]:
    with_free = [f for _, f in samples if f.free]
    return {
        "samples": len(samples),
        "mean_used_share": statistics.fmean(f.used_share for _, f in samples) if samples else None,
        "mean_free_gpus": statistics.fmean(f.free for _, f in samples) if samples else None,
        "stranded_in_domains_share": statistics.fmean(f.stranded_in_domains / f.free for f in with_free)
        if with_free else None,
        "stranded_in_nodes_share": statistics.fmean(f.stranded_in_nodes / f.free for f in with_free)
        if with_free else None,
    }


def wait_summary(waits: Sequence[float]) -> dict[str, Any]:
    return {"pods_bound": len(waits), "wait_p50_seconds": _quantile(waits, 0.5),
            "wait_p99_seconds": _quantile(waits, 0.99), "wait_max_seconds": max(waits, default=None)}


def pending_summary(
    *, created: Mapping[str, float], deleted: Mapping[str, float], bound: Mapping[str, float], end: float,
    gated: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """`created`/`deleted`: when each replayed pod was created/deleted; `bound`: when seen bound; `gated`: the
    pods our webhook gates for placement at release (`admission.release_min_gpus` whole GPUs or more), whose
    waits are also reported apart from the rest (in every arm, so the baselines' same pods compare)."""
    waits = [bound[k] - t for k, t in created.items() if k in bound]
    never = [k for k in created if k not in bound]
    split = {kind: wait_summary([bound[k] - t for k, t in created.items() if k in bound and (k in gated) == is_gated])
             for kind, is_gated in (("gated", True), ("not_gated", False))}
    pending_seconds = sum(min(bound.get(k, end), deleted.get(k, end)) - t for k, t in created.items())
    return {
        "pods_created": len(created),
        "never_scheduled": len(never),
        "gave_up_while_pending": sum(1 for k in never if k in deleted),
        "pending_at_end": sum(1 for k in never if k not in deleted),
        "wait_p50_seconds": _quantile(waits, 0.5),
        "wait_p99_seconds": _quantile(waits, 0.99),
        "wait_max_seconds": max(waits, default=None),
        "pending_pod_seconds": pending_seconds,
        "never_scheduled_pods": sorted(never),
        "never_scheduled_gated": sum(1 for k in never if k in gated),
        "waits": split,
        "gated_waits": {k: bound[k] - t for k, t in created.items() if k in bound and k in gated},
    }


def same_pods_gated(arms: Mapping[str, Mapping[str, Any]], *, arm: str) -> dict[str, Any] | None:
    """The gated pods' create-to-bound p50 in `arm` and under the default scheduler over the same pods: those
    bound in both arms (a pod only one arm placed, after a long wait or never, compares with nothing). None: a
    result without per-pod waits (before 2026-12-05)."""
    ours, theirs = (arms.get(a, {}).get("pending", {}).get("gated_waits") for a in (arm, "default"))
    if ours is None or theirs is None:
        return None
    both = sorted(ours.keys() & theirs.keys())
    return {"pods": len(both), "wait_p50_seconds": _quantile([ours[k] for k in both], 0.5),
            "default_wait_p50_seconds": _quantile([theirs[k] for k in both], 0.5)}


def goals(arms: Mapping[str, Mapping[str, Any]], *, arm: str = "gpu-steward") -> list[dict[str, Any]]:
    """The issue's goals for one of our arms, each with whether it is met and the numbers behind it."""
    ours = arms.get(arm)
    if ours is None:
        return []
    out = []
    share = ours["placement"]["one_domain_share"]
    out.append({"goal": f">= {GOALS['one_domain_share']:.1%} of domain-fittable multi-GPU pods in one domain",
                "met": share is not None and share >= GOALS["one_domain_share"],
                "value": share})
    baselines = {k: v["pending"]["never_scheduled"] for k, v in arms.items() if k not in OURS}
    if baselines:
        best = min(baselines.values())
        out.append({"goal": "no more pods left pending than the best baseline",
                    "met": ours["pending"]["never_scheduled"] <= best,
                    "value": {arm: ours["pending"]["never_scheduled"], **baselines}})
    base = arms.get("default", {}).get("burst", {}).get("pods_per_second")
    mine = ours["burst"]["pods_per_second"]
    if base and mine is not None:
        out.append({"goal": f"burst throughput >= {GOALS['throughput_ratio']:.0%} of the default scheduler's",
                    "met": mine / base >= GOALS["throughput_ratio"], "value": mine / base})
    default_p99 = arms.get("default", {}).get("pending", {}).get("wait_p99_seconds")
    mine_p99 = ours["pending"]["wait_p99_seconds"]
    if default_p99 is not None and mine_p99 is not None:
        bound = GOALS["wait_p99_over_default_seconds"]
        out.append({"goal": f"create-to-bound p99 within {bound:g} s of the default arm's",
                    "met": mine_p99 <= default_p99 + bound, "value": {arm: mine_p99, "default": default_p99}})
    same = same_pods_gated(arms, arm=arm)
    if same is not None and same["default_wait_p50_seconds"]:
        ratio = same["wait_p50_seconds"] / same["default_wait_p50_seconds"]
        out.append({"goal": f"gated pods' create-to-bound p50 <= {GOALS['gated_p50_over_default']:g}x the same pods' "
                    "under the default scheduler", "met": ratio <= GOALS["gated_p50_over_default"],
                    "value": {"ratio": ratio, **same}})
    return out


# --- running one arm (I/O) --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    bin_dir: pathlib.Path
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]
    plan: tuple[Action, ...]
    burst: tuple[TracePod, ...]
    gated_min_gpus: int = settings.Admission().release_min_gpus  # pods our webhook gates: this many GPUs or more
    drain_seconds: float = DRAIN_SECONDS  # the replay ends this long after the last arrival
    dra: bool = False  # the nodes' GPUs are DRA devices (--dra)


def say(message: str) -> None:
    print(message, flush=True)


def _settings(kubeconfig: pathlib.Path) -> settings.Settings:
    return settings.Settings(kubernetes=settings.Kubernetes(kubeconfig=kubeconfig, watch_timeout_seconds=60),
                             dra=settings.Dra(gpu_device_classes=GPU_DEVICE_CLASSES))


async def _serve_devices(tracker: Tracker, live: feeder.Feeder, port: int) -> None:
    """devicesim's /metrics over the tracker's own Assignments, so DCGM says what is measured."""
    app = devicesim.create_app(cluster_source=live)
    app[devicesim.APP_ASSIGNMENTS] = tracker.assignments
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def _follow(live: feeder.Feeder, tracker: Tracker, start: float) -> None:
    changed = live.subscribe()
    try:
        while True:
            await changed.wait()
            changed.clear()
            tracker.observe(live.snapshot, now=time.monotonic() - start)
    finally:
        live.unsubscribe(changed)


async def _create(api: client.ApiClient, manifest: Mapping[str, Any]) -> None:
    namespace = manifest["metadata"]["namespace"]
    await kube.request(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=manifest,
                       timeout_seconds=API_TIMEOUT_SECONDS)


async def _delete(api: client.ApiClient, namespace: str, name: str | None = None) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")
    try:
        await kube.request(api, "DELETE", path, query={"gracePeriodSeconds": 0},
                           timeout_seconds=API_TIMEOUT_SECONDS if name else COLLECTION_TIMEOUT_SECONDS)
    except kube.ApiError as exc:
        if exc.status != 404:
            raise


async def _replay(api: client.ApiClient, setup: Setup, tracker: Tracker, start: float) -> dict[str, Any]:
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    created: dict[str, float] = {}
    deleted: dict[str, float] = {}
    creations: dict[int, asyncio.Task[None]] = {}
    failures: list[str] = []

    def clock() -> float:
        return time.monotonic() - start

    async def create(index: int) -> None:
        pod = setup.pods[index]
        async with limit:
            try:
                await _create(api, pod_manifest(pod, namespace=NAMESPACE))
            except kube.ApiError as exc:
                failures.append(f"create {pod.name}: {exc}")
                return
        created[f"{NAMESPACE}/{pod.name}"] = clock()

    async def delete(index: int) -> None:
        await creations[index]
        pod = setup.pods[index]
        async with limit:
            await _delete(api, NAMESPACE, pod.name)
        deleted[f"{NAMESPACE}/{pod.name}"] = clock()

    async def sampler() -> None:
        while True:
            tracker.sample(now=clock())
            await asyncio.sleep(SAMPLE_SECONDS)

    offset = clock()  # the plan's zero
    async with asyncio.TaskGroup() as group:
        sampling = group.create_task(sampler())
        for action in setup.plan:
            delay = offset + action.at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if action.kind == "create":
                creations[action.pod] = group.create_task(create(action.pod))
            else:
                group.create_task(delete(action.pod))
        last_arrival = max((a.at for a in setup.plan if a.kind == "create"), default=0.0)
        await asyncio.sleep(max(0.0, offset + last_arrival + setup.drain_seconds - clock()))
        sampling.cancel()
    end = clock()
    lag = [created[f"{NAMESPACE}/{setup.pods[a.pod].name}"] - offset - a.at for a in setup.plan
           if a.kind == "create" and f"{NAMESPACE}/{setup.pods[a.pod].name}" in created]
    bound = {k: b.bound_at for k, b in tracker.bindings.items() if k in created}
    gated = {f"{NAMESPACE}/{p.name}" for p in setup.pods if p.gpus >= setup.gated_min_gpus}
    return {
        "duration_seconds": end - offset,
        "ended_at_seconds": end,
        "create_failures": failures[:20],
        "create_lag_p99_seconds": _quantile(lag, 0.99),
        "pending": pending_summary(created=created, deleted=deleted, bound=bound, end=end, gated=gated),
    }


def steward_processes(config_file: pathlib.Path) -> dict[str, localcluster.Pid]:
    """`gpu-steward webhook|descheduler --config config_file` (localsteward.process), by command."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # not a process, or one that just ended
            continue
        if "gpu_steward" in argv and str(config_file) in argv and (pid := localcluster.Pid.of(int(entry.name))):
            found[argv[argv.index("gpu_steward") + 1]] = pid
    return found


async def _wait_until(predicate: Callable[[], bool], *, within: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return bool(predicate())


async def _burst(api: client.ApiClient, setup: Setup, tracker: Tracker, start: float) -> dict[str, Any]:
    """Empty the cluster, then create the burst pods at once; pods bound per second from the first create."""
    await _delete(api, NAMESPACE)
    await _wait_until(lambda: tracker.resident() == 0, within=60)
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    keys = [f"{BURST_NAMESPACE}/burst-{i:04d}" for i in range(len(setup.burst))]

    async def create(index: int) -> None:
        async with limit:
            pod = setup.burst[index]
            await _create(api, pod_manifest(pod, namespace=BURST_NAMESPACE, name=keys[index].split("/")[1]))

    first = time.monotonic() - start
    async with asyncio.TaskGroup() as group:
        for index in range(len(setup.burst)):
            group.create_task(create(index))
    created = time.monotonic() - start
    await _wait_until(lambda: all(k in tracker.bindings for k in keys), within=BURST_TIMEOUT_SECONDS)
    times = [tracker.bindings[k].bound_at for k in keys if k in tracker.bindings]
    span = (max(times) - first) if times else None
    await _delete(api, BURST_NAMESPACE)
    return {
        "pods": len(keys),
        "bound": len(times),
        "create_seconds": created - first,
        "seconds_to_last_bound": span,
        "pods_per_second": (len(times) / span) if span else None,
    }


async def _measure(cluster: localcluster.LocalCluster, setup: Setup, *, arm: str,
                   workdir: pathlib.Path, logs: bool = False, steward: Mapping[str, Any] | None = None,
                   ) -> dict[str, Any]:
    config = _settings(cluster.kubeconfig)
    rooms = {n.name: NodeRoom(tuple(tuple(d) for d in localcluster.NodeGroup(1, n.gpus, n.domains, n.model).topology()),
                              n.cpu_milli, n.memory_mib) for n in setup.nodes}
    requests = {f"{NAMESPACE}/{p.name}": (p.cpu_milli, p.memory_mib) for p in setup.pods}
    requests |= {f"{BURST_NAMESPACE}/burst-{i:04d}": (p.cpu_milli, p.memory_mib) for i, p in enumerate(setup.burst)}
    tracker = Tracker(rooms=rooms, requests=requests)
    api = await kube.api_client(config.kubernetes)
    start = time.monotonic()
    # Wall time of each step: Prometheus, the feeder's first lists (and our webhook and descheduler) until ready;
    # the replay; the burst, with the emptying before it and the deletion after.
    phases: dict[str, float] = {}
    processes: dict[str, localcluster.Pid] = {}  # our webhook and descheduler, in our arms
    cpu: dict[str, float | None] = {}  # the CPU seconds each used during the replay and the burst
    try:
        live = feeder.Feeder(config=config, api=api, prometheus=None)
        with contextlib.ExitStack() as stack:
            async with asyncio.TaskGroup() as group:
                background = [group.create_task(live.run()), group.create_task(_follow(live, tracker, start))]
                port = localcluster.free_port()
                background.append(group.create_task(_serve_devices(tracker, live, port)))
                prom = await asyncio.to_thread(
                    localprometheus.start_prometheus, workdir / "prometheus", [],
                    scrape_targets=[f"127.0.0.1:{port}"], scrape_interval=f"{SCRAPE_SECONDS}s")
                stack.callback(prom.stop)
                if arm in OURS:
                    ours: dict[str, Any] = {
                        "kubernetes": {"watch_timeout_seconds": 60}, "log_level": "DEBUG" if logs else "INFO",
                        "prometheus": {"url": prom.url, "occupancy_refresh_seconds": SCRAPE_SECONDS},
                        "descheduler": {"leader_election": {"lease_namespace": LEASE_NAMESPACE},
                                        "reclaim": {"enabled": False}},
                        "dra": {"gpu_device_classes": list(GPU_DEVICE_CLASSES)}}
                    for section, values in (steward or {}).items():  # the command line's settings for our arms
                        ours[section] = {**ours.get(section, {}), **values}
                    config_file = await asyncio.to_thread(
                        stack.enter_context, localsteward.webhook(cluster, workdir, config=ours, descheduler=True))
                    processes = steward_processes(config_file)
                await _wait_until(lambda: live.synced and len(live.snapshot.nodes) == len(setup.nodes), within=60)
                phases["ready_seconds"] = time.monotonic() - start
                cpu_before = {name: pid.cpu_seconds() for name, pid in processes.items()}
                say(f"   replaying {len(setup.pods)} pods ({len(setup.plan)} actions)")
                replay = await _replay(api, setup, tracker, start)
                phases["replay_seconds"] = time.monotonic() - start - phases["ready_seconds"]
                say(f"   replay done in {replay['duration_seconds']:.0f} s; burst of {len(setup.burst)} pods")
                burst = await _burst(api, setup, tracker, start)
                phases["burst_seconds"] = time.monotonic() - start - phases["ready_seconds"] - phases["replay_seconds"]
                for name, pid in processes.items():
                    used, began = pid.cpu_seconds(), cpu_before.get(name)
                    cpu[name] = None if used is None or began is None else used - began
                for task in background:
                    task.cancel()
    finally:
        await api.close()
    traced = sorted((b for k, b in tracker.bindings.items() if k.startswith(f"{NAMESPACE}/")),
                    key=lambda b: b.bound_at)
    replayed, teardown = split_at_end(traced, ended_at=replay["ended_at_seconds"])
    nominated = [b for b in replayed if b.on_plan is not None]
    replay["nominations_missed"] = {"pods": sum(1 for b in nominated if not b.on_plan), "nominated": len(nominated)}
    return {**replay, "placement": placement_summary(replayed), "placement_at_teardown": placement_summary(teardown),
            "bindings": [dataclasses.asdict(b) for b in traced],
            "fragmentation": fragmentation_summary(tracker.samples), "fragmentation_layouts": tracker.layouts,
            "burst": burst, "phases": phases,
            "cpu_seconds": cpu}


def run_arm(setup: Setup, *, arm: str, workdir: pathlib.Path, logs: bool = False,
            steward: Mapping[str, Any] | None = None) -> dict[str, Any]:
    say(f"\n=== {arm} ===")
    names = settings.Names()
    scheduler = BINPACK_SCHEDULER if arm in BINPACKING else None
    cluster = localcluster.LocalCluster(setup.bin_dir, scheduler_config=scheduler, progress=lambda m: None)
    started = time.monotonic()
    with cluster:
        cluster.add_nodes([trace_node_manifest(n, names=names, dra=setup.dra) for n in setup.nodes],
                          timeout_seconds=180)
        if setup.dra:
            cluster.apply(dra_objects(setup.nodes))
        namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                      for n in (NAMESPACE, BURST_NAMESPACE, LEASE_NAMESPACE)]
        cluster.apply([*namespaces, *demo.priority_classes(settings.Settings())])  # tier classes, same in every arm
        control_plane = time.monotonic() - started
        say(f"   control plane + {len(setup.nodes)} kwok nodes ready in {control_plane:.0f} s")
        result = asyncio.run(_measure(cluster, setup, arm=arm, workdir=workdir, logs=logs,
                                      steward=steward))
        stopping = time.monotonic()
    phases = {"control_plane_seconds": control_plane, **result["phases"],
              "stop_seconds": time.monotonic() - stopping, "arm_seconds": time.monotonic() - started}
    say(f"   arm done in {phases['arm_seconds']:.0f} s: " + ", ".join(
        f"{name.removesuffix('_seconds').replace('_', ' ')} {value:.1f} s" for name, value in phases.items()
        if name != "arm_seconds") + f"; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return {**result, "dra": setup.dra, "phases": phases}


# --- reporting --------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _waits(waits: Mapping[str, Any] | None) -> str:
    if not waits:
        return "-"
    return f"{_fmt(waits['wait_p50_seconds'])} / {_fmt(waits['wait_p99_seconds'])} ({waits['pods_bound']})"


def _teardown(placement: Mapping[str, Any] | None) -> str:
    """Multi-GPU pods bound only once the replay had ended, while its pods were being deleted: how many, and how many
    of the domain-fittable ones landed in one domain."""
    if not placement:
        return "-"
    return f"{placement['multi_gpu_pods_bound']}: {placement['in_one_domain_of_fittable']}/" \
           f"{placement['fittable_in_one_domain']} in one"


def table(arms: Mapping[str, Mapping[str, Any]], *, gated_min_gpus: int = 2) -> list[str]:
    """One row per measure, one column per arm. Waits: p50 / p99 (pods bound); the gated rows split them by
    whether our webhook gates the pod (`gated_min_gpus` GPUs or more), in every arm."""
    rows: list[tuple[str, ...]] = [("", *arms)]

    def row(label: str, get: Any) -> None:
        rows.append((label, *(get(r) for r in arms.values())))

    row("dra (GPUs are DRA devices)", lambda r: json.dumps(bool(r.get("dra"))))
    row("multi-GPU pods bound", lambda r: str(r["placement"]["multi_gpu_pods_bound"]))
    row("  of which domain-fittable", lambda r: str(r["placement"]["fittable_in_one_domain"]))
    row("fittable placed in one domain", lambda r: f"{r['placement']['in_one_domain_of_fittable']} "
        f"({_fmt(r['placement']['one_domain_share'], '.1%')})")
    row("  after the replay (not counted)", lambda r: _teardown(r.get("placement_at_teardown")))
    row("mean domains / multi-GPU pod", lambda r: _fmt(r["placement"]["mean_domains_spanned"]))
    row("mean extra domains vs best", lambda r: _fmt(r["placement"]["mean_extra_domains"]))
    sizes = sorted({s for r in arms.values() for s in r["placement"]["by_size"]}, key=int)
    for size in sizes:
        row(f"  mean domains, {size}-GPU pods",
            lambda r, s=size: _fmt(r["placement"]["by_size"].get(s, {}).get("mean_domains_spanned")))
    row("GPU used (mean of samples)", lambda r: _fmt(r["fragmentation"]["mean_used_share"], ".1%"))
    row("free GPUs in part-used domains", lambda r: _fmt(r["fragmentation"]["stranded_in_domains_share"], ".1%"))
    row("free GPUs on part-used nodes", lambda r: _fmt(r["fragmentation"]["stranded_in_nodes_share"], ".1%"))
    row("pods never scheduled", lambda r: str(r["pending"]["never_scheduled"]))
    row("  still pending at end", lambda r: str(r["pending"]["pending_at_end"]))
    row("pending pod-seconds", lambda r: _fmt(r["pending"]["pending_pod_seconds"], ".0f"))
    row("wait p50 / p99 (s), all pods", lambda r: f"{_fmt(r['pending']['wait_p50_seconds'])} / "
        f"{_fmt(r['pending']['wait_p99_seconds'])}")
    smaller = "1-GPU pods" if gated_min_gpus == 2 else f"pods under {gated_min_gpus} GPUs"
    for kind, label in (("gated", f"  gated pods ({gated_min_gpus}+ GPUs)"), ("not_gated", f"  {smaller}")):
        row(label, lambda r, k=kind: _waits(r["pending"].get("waits", {}).get(k)))
    same = {name: same_pods_gated(arms, arm=name) for name in arms}
    rows.append(("  gated, bound here and in default: p50", *(
        "-" if s is None else f"{_fmt(s['wait_p50_seconds'])} ({s['pods']})" for s in same.values())))
    row("nominations missed (of nominated)", lambda r: f"{r.get('nominations_missed', {}).get('pods', 0)} "
        f"({r.get('nominations_missed', {}).get('nominated', 0)})")
    row("burst pods bound / s", lambda r: _fmt(r["burst"]["pods_per_second"], ".1f"))
    row("CPU s, webhook / descheduler", lambda r: f"{_fmt(r.get('cpu_seconds', {}).get('webhook'), '.1f')} / "
        f"{_fmt(r.get('cpu_seconds', {}).get('descheduler'), '.1f')}")
    width = max(len(r[0]) for r in rows) + 2
    column = max([18, *(len(cell) + 2 for r in rows for cell in r[1:])])
    return [r[0].ljust(width) + "".join(cell.ljust(column) for cell in r[1:]) for r in rows]


COLOURS = {"default": (127, 127, 127), "binpack": (255, 127, 14), "gpu-steward": (31, 119, 180),
           "gpu-steward+binpack": (44, 160, 44)}


def picture(path: pathlib.Path, arms: Mapping[str, Mapping[str, Any]], *, title: str) -> None:
    """Bars: mean NVLink domains spanned per multi-GPU pod, per pod size and overall, one colour per arm."""
    groups = sorted({s for r in arms.values() for s in r["placement"]["by_size"]}, key=int)
    labels = [f"{g}-GPU pods" for g in groups] + ["all multi-GPU"]

    def value(result: Mapping[str, Any], index: int) -> float:
        p = result["placement"]
        got = p["by_size"].get(groups[index], {}).get("mean_domains_spanned") if index < len(groups) \
            else p["mean_domains_spanned"]
        return float(got or 0.0)

    width, height, left, bottom, top = 760, 420, 60, 60, 50
    top_value = max([value(r, i) for r in arms.values() for i in range(len(labels))] + [1.0])
    scale = (height - bottom - top) / (math.ceil(top_value * 2) / 2)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 15), title, fill="black")
    base = height - bottom
    draw.line([left, base, width - 20, base], fill="black")
    for tick in range(math.ceil(top_value * 2) + 1):
        y = base - tick * 0.5 * scale
        draw.line([left - 4, y, left, y], fill="black")
        draw.text((left - 30, y - 6), f"{tick * 0.5:.1f}", fill="black")
    slot = (width - left - 20) / len(labels)
    bar = slot * 0.8 / max(1, len(arms))
    for i, label in enumerate(labels):
        x0 = left + i * slot + slot * 0.1
        for j, (arm, result) in enumerate(arms.items()):
            v = value(result, i)
            x = x0 + j * bar
            draw.rectangle([x, base - v * scale, x + bar - 3, base], fill=COLOURS.get(arm, (0, 0, 0)), outline="black")
            draw.text((x + 2, base - v * scale - 14), f"{v:.2f}", fill="black")
        draw.text((x0, base + 8), label, fill="black")
    for j, arm in enumerate(arms):
        lx = left + j * 160
        draw.rectangle([lx, height - 26, lx + 14, height - 12], fill=COLOURS.get(arm, (0, 0, 0)), outline="black")
        draw.text((lx + 20, height - 25), arm, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


# --- command line -----------------------------------------------------------------------------------


def burst_pods(pods: Sequence[TracePod], *, gpus: int) -> tuple[TracePod, ...]:
    """The sequence's first 1-GPU pods, as many as `gpus` (at most BURST_MAX_PODS): every arm can bind
    them all, so the burst times the scheduler and admission, not the cluster running full."""
    return tuple(p for p in pods if p.gpus == 1)[: min(gpus, BURST_MAX_PODS)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", default="200", help="nodes (stratified sample) or 'all' (1,213)")
    parser.add_argument("--pods", type=int, default=2000, help="N whole-GPU pods in creation order")
    parser.add_argument("--skip", type=int,
                        help=f"start after the first N whole-GPU pods (another slice of the trace; default 0, "
                             f"--quick {QUICK['skip']})")
    parser.add_argument("--trace", choices=sorted(POD_FILES), default="multigpu50")
    parser.add_argument("--time-compression", type=float, default=40.0,
                        help="trace lifetimes are divided by this")
    parser.add_argument("--arrival-rate", type=float, default=12.0, help="pods created per second")
    parser.add_argument("--arms", help=f"comma-separated, from {','.join(ARMS)} (default: all; --quick: "
                                       f"{QUICK['arms']})")
    parser.add_argument("--dra", action="store_true",
                        help="the nodes' GPUs are DRA devices (a ResourceSlice per node, a DeviceClass serving "
                             "nvidia.com/gpu); pods unchanged, their devices read from their claims")
    parser.add_argument("--quick", action="store_true",
                        help=f"small CI run: {QUICK['nodes']} nodes, {QUICK['pods']} pods from #{QUICK['skip']} at "
                             f"{QUICK['arrival_rate']:g}/s, drain {QUICK['drain_seconds']:g} s, arms {QUICK['arms']}")
    parser.add_argument("--out", type=pathlib.Path, help=f"JSON results (default {DEFAULT_OUT.name})")
    parser.add_argument("--release-min-gpus", type=int,
                        help="our arms: admission.release_min_gpus (pods with fewer GPUs get preferred terms only)")
    parser.add_argument("--rebuild-interval", type=float,
                        help="our arms: kubernetes.rebuild_interval_seconds (how often their snapshots are rebuilt)")
    parser.add_argument("--no-early-rebuilds", dest="early_rebuilds", action="store_false",
                        help="our arms: descheduler.gangs.early_rebuilds off (a gated pod waits out the rebuild "
                        "interval like any change)")
    parser.add_argument("--logs", type=pathlib.Path, help="keep each arm's process logs here (default: discarded)")
    parser.add_argument("--picture", type=pathlib.Path,
                        help=f"PNG chart (default: --out's name with .png, else {DEFAULT_PICTURE.name})")
    args = parser.parse_args(argv)
    args.drain_seconds = DRAIN_SECONDS
    if args.quick:
        args.nodes, args.pods, args.arrival_rate = QUICK["nodes"], min(args.pods, QUICK["pods"]), QUICK["arrival_rate"]
        args.drain_seconds = QUICK["drain_seconds"]
        args.skip = QUICK["skip"] if args.skip is None else args.skip
        args.arms = args.arms or QUICK["arms"]
    args.skip = args.skip or 0
    arms = [a.strip() for a in (args.arms or ",".join(ARMS)).split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    args.arms = arms
    suffix = ("_quick" if args.quick else "") + ("_dra" if args.dra else "")
    # The picture goes with the JSON (same name): a run told where to write (CI's temporary directory) leaves the
    # tree alone, and a named run never overwrites another's picture.
    args.picture = args.picture or (args.out.with_suffix(".png") if args.out
                                    else DEFAULT_PICTURE.with_name(f"{DEFAULT_PICTURE.stem}{suffix}.png"))
    args.out = args.out or DEFAULT_OUT.with_name(f"{DEFAULT_OUT.stem}{suffix}.json")
    return args


def steward_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings the command line gives our arms' webhook and descheduler, by section."""
    out: dict[str, dict[str, Any]] = {}
    if args.release_min_gpus is not None:
        out["admission"] = {"release_min_gpus": args.release_min_gpus}
    if args.rebuild_interval is not None:
        out["kubernetes"] = {"rebuild_interval_seconds": args.rebuild_interval}
    if not args.early_rebuilds:
        out["descheduler"] = {"gangs": {"early_rebuilds": False}}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    with localcluster.sigterm_as_interrupt():
        return _main(parse_args(argv), command=list(argv if argv is not None else sys.argv[1:]))


def _main(args: argparse.Namespace, *, command: list[str]) -> int:
    all_nodes = read_nodes(TRACES / NODE_FILE)
    nodes = all_nodes if args.nodes == "all" else stratified_sample(all_nodes, int(args.nodes))
    pod_set = load_pods(args.trace)
    pods = pod_set.pods[args.skip: args.skip + args.pods]
    gpus = sum(n.gpus for n in nodes)
    plan = replay_plan(pods, arrival_rate=args.arrival_rate, compression=args.time_compression,
                       drain_seconds=args.drain_seconds)
    say(f"{len(nodes)} nodes ({gpus} GPUs), {len(pods)} pods of {args.trace} from #{args.skip} "
        f"({dict(collections.Counter(p.gpus for p in pods))} by GPUs; skipped {pod_set.skipped}), "
        f"{args.arrival_rate:g} pods/s, lifetimes / {args.time_compression:g}"
        + ("; GPUs as DRA devices" if args.dra else ""))
    bin_dir = localcluster.ensure_binaries(progress=lambda line: None)
    gated_min_gpus = args.release_min_gpus or settings.Admission().release_min_gpus
    setup = Setup(bin_dir, tuple(nodes), tuple(pods), tuple(plan), burst_pods(pods, gpus=int(gpus * BURST_GPU_SHARE)),
                  gated_min_gpus, args.drain_seconds, args.dra)
    arms: dict[str, dict[str, Any]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="placement-trace-") as tmp:
        for arm in args.arms:
            workdir = (args.logs or pathlib.Path(tmp)) / arm
            workdir.mkdir(parents=True, exist_ok=True)
            arms[arm] = run_arm(setup, arm=arm, workdir=workdir, logs=args.logs is not None,
                                steward=steward_settings(args))
    lines = table(arms, gated_min_gpus=gated_min_gpus)
    say("\n" + "\n".join(lines))
    verdicts = [{**verdict, "arm": arm} for arm in OURS if arm in arms for verdict in goals(arms, arm=arm)]
    for verdict in verdicts:
        say(f"{verdict['arm']} goal {'MET' if verdict['met'] else 'NOT MET'}: {verdict['goal']} ({verdict['value']})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/placement_trace.py", *command]),
        "trace": args.trace, "skip": args.skip, "dra": args.dra,
        "release_min_gpus": args.release_min_gpus, "rebuild_interval": args.rebuild_interval,
        "early_rebuilds": args.early_rebuilds,
        "gated_min_gpus": gated_min_gpus,
        "nodes": len(nodes), "gpus": gpus, "pods": len(pods),
        "pods_by_gpus": dict(collections.Counter(p.gpus for p in pods)), "skipped": pod_set.skipped,
        "arrival_rate": args.arrival_rate, "time_compression": args.time_compression,
        "drain_seconds": args.drain_seconds,
        "burst_pods": len(setup.burst), "arms": arms, "goals": verdicts, "table": lines,
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }, indent=2))
    picture(args.picture, arms, title=f"Mean NVLink domains spanned per multi-GPU pod - {args.trace}, "
            f"{len(nodes)} nodes, {len(pods)} pods" + (", DRA devices" if args.dra else ""))
    say(f"results: {args.out}\npicture: {args.picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
