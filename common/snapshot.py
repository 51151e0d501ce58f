"""An immutable picture of the cluster that every decision reads: GPU nodes, GPU pods, PriorityClasses,
namespaces, native PodGroups, and which GPU indices each pod holds. Pods that request no GPU are left out
unless the gang controller needs them (`gangs.involved`: e.g. an MPI launcher counted in its gang's size): a gang is
complete, released and reclaimed with all of its members.

This module holds the model and how each API object reads into it (pure); `common.snapshot_build` builds a
snapshot from the objects (from scratch, or one after another re-doing only what changed), and
`common.snapshot_nodes` assembles each of its GPU nodes.

What a node holds (`Node.requested`, its GPUs in use) counts every pod that will be there until it is gone:
pods bound to it that are not finished (terminating ones included: they hold their resources through
their grace period), pods the scheduler nominated to it (its preemption reservation) and pods we pinned
to it and released that are not bound yet. `common.capacity` answers from that what a pod could get. The same
pods give each node the host ports in use there (`Node.host_ports`) and the required anti-affinity terms that
cover it (`Node.anti_affinity`: those of pods on it, or on any node, GPU or not, in the same topology domain).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from common import antiaffinity, dra, gangs, gpu, hostports, label_selectors, placement, resources, settings, topology

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"
NAME_FIELD = "metadata.name"  # the one node field a required term may name: how we pin a pod to one node


def pinned_node(raw: Mapping[str, Any]) -> str | None:
    """The one node a pod's required terms name (`matchFields metadata.name In [node]`), if they name one."""
    affinity = ((raw.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    pinned: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for requirement in term.get("matchFields") or []:
            if requirement.get("key") == NAME_FIELD and requirement.get("operator") == "In":
                pinned |= set(requirement.get("values") or [])
    return next(iter(pinned)) if len(pinned) == 1 else None


def held_on(raw: Mapping[str, Any]) -> str | None:
    """The node whose resources this pod holds: bound and not finished; else nominated by the scheduler;
    else pinned by us and no longer gated (released, not yet bound) unless the scheduler found that node full.
    None: it holds nothing."""
    spec, status = raw.get("spec") or {}, raw.get("status") or {}
    if status.get("phase") in TERMINAL_PHASES:
        return None
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    if (raw.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if status.get("nominatedNodeName"):
        return str(status["nominatedNodeName"])
    if not spec.get("schedulingGates") and not _unschedulable(status):
        # Pinned and released: it holds its node until the scheduler says the node cannot take it (another pod
        # bound there first); from then on it holds nothing, and counting it would hide room that is free.
        return pinned_node(raw)
    return None


def _unschedulable(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or () if isinstance(c, Mapping))


@dataclasses.dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    preemption_policy: str
    annotations: Mapping[str, str]
    global_default: bool = False


@dataclasses.dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    request: gpu.GpuRequest
    priority: int
    priority_class_name: str | None
    preemption_policy: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_kind: str | None
    owner_name: str | None
    created: str  # RFC 3339, sorts in time order
    scheduling_gates: tuple[str, ...]
    deleting: bool
    scheduler_name: str
    raw: Mapping[str, Any]
    requests: Mapping[str, int] = dataclasses.field(default_factory=dict)  # `resources.pod_requests`
    held_on: str | None = None  # the node whose resources it holds (bound, nominated, or pinned and released)
    gpu_indices: tuple[int, ...] = ()
    indices_observed: bool = False  # True: from DCGM or its claims' allocation; False: estimated (or not bound)
    dra: dra.PodGpus = dra.NONE  # its GPUs through resource claims (counted in `request`, `running` and `requests` too)
    # What its running containers hold (`gpu.running_request`; None: `request`): what measuring it sees. `request`
    # is what the scheduler accounts and an eviction frees, a one-off init container's larger request included.
    running: gpu.GpuRequest | None = None

    @property
    def measured(self) -> gpu.GpuRequest:
        """The GPUs a measurement of the pod expects to see (see `running`)."""
        return self.request if self.running is None else self.running

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        """On a node and not finished (a terminal pod holds nothing)."""
        return self.node_name is not None and self.phase not in TERMINAL_PHASES

    @property
    def holds_gpus(self) -> bool:
        return self.bound and self.request.any

    @property
    def reserved(self) -> bool:
        """Holds a node's resources without being bound yet (nominated, or pinned and released)."""
        return self.held_on is not None and self.node_name is None

    @functools.cached_property
    def host_ports(self) -> frozenset[hostports.HostPort]:
        """The host ports it uses (`common.hostports`)."""
        return hostports.of_pod(self.raw)

    @functools.cached_property
    def anti_affinity(self) -> tuple[Mapping[str, Any], ...]:
        """Its required pod anti-affinity terms as written (`common.antiaffinity`)."""
        return antiaffinity.required_terms(self.raw)


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    topology: topology.NodeTopology
    allocatable: gpu.GpuRequest
    schedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    used: frozenset[int]  # full-GPU indices held by pods
    requested_full: int  # full GPUs requested by pods bound here (>= len(used) when over-committed)
    mig_used: Mapping[str, int]
    pods: tuple[str, ...]  # keys of GPU pods bound here
    resources: Mapping[str, int] = dataclasses.field(default_factory=dict)  # allocatable, every resource
    requested: Mapping[str, int] = dataclasses.field(default_factory=dict)  # held by pods, `pods` = their count
    reserved: tuple[str, ...] = ()  # keys of GPU pods holding GPUs here but not bound yet
    host_ports: frozenset[hostports.HostPort] = frozenset()  # used by every pod holding it (NodePorts)
    # Required anti-affinity terms of pods holding this node or another in the same topology domain: a pod they
    # select cannot come here (InterPodAffinity, existing pods' half; `common.antiaffinity`).
    anti_affinity: tuple[antiaffinity.Term, ...] = ()
    # Where its GPUs and MIG slices come from: a device plugin (allocatable `nvidia.com/gpu`, `nvidia.com/mig-<p>`),
    # or DRA devices of configured GPU classes (`common.dra`); then `extended_gpus` says whether a DeviceClass serves
    # pods asking `nvidia.com/gpu` here, and `extended_mig` the `nvidia.com/mig-<p>` names MIG classes serve.
    dra_gpus: bool = False
    extended_gpus: bool = True
    extended_mig: frozenset[str] = frozenset()
    # DRA only: the GPU indices in the order kube-scheduler's allocator tries them (`dra.Inventory.order`); None:
    # not known (or a device plugin's), and the model assumes the placement policy.
    device_order: tuple[int, ...] | None = None

    @property
    def gpu_count(self) -> int:
        return self.allocatable.full

    @property
    def free_gpus(self) -> int:
        return max(0, self.allocatable.full - self.requested_full)

    def free_by_domain(self) -> tuple[tuple[int, ...], ...]:
        """Free GPU indices per NVLink domain (computed once per snapshot: nodes are immutable)."""
        return self._free

    @functools.cached_property
    def _free(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(f) for f in placement.free_by_domain(self.topology.domains, self.used))

    @functools.cached_property
    def gpu_state(self) -> tuple[Any, ...]:
        """Nodes with equal GPU state take a pod alike: topology known, GPU count, free GPUs, and
        (size, free) of each NVLink domain; where the DRA allocator's order is known, it and the free indices
        (its first fit reads them: `placement.allocate`). Lets callers decide once per state instead of per node."""
        return (self.topology.known, self.gpu_count, self.free_gpus,
                tuple((len(d), len(f)) for d, f in zip(self.topology.domains, self._free, strict=True)),
                (self.device_order, self._free) if self.device_order is not None else None)

    def free_mig(self, profile: str) -> int:
        return max(0, self.allocatable.mig.get(profile, 0) - self.mig_used.get(profile, 0))


Occupancy = Mapping[str, Mapping[int, str]]  # node name -> GPU index -> pod key (from DCGM)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    nodes: Mapping[str, Node]
    pods: Mapping[str, Pod]  # GPU pods, and pods without GPUs that are in a gang or carry our gate
    priority_classes: Mapping[str, PriorityClass]
    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    taken_at: float | None  # when the shell last synced it (unix seconds); None: never
    pod_groups: gangs.PodGroups = dataclasses.field(default_factory=gangs.PodGroups)  # native, by ns/name
    problems: tuple[str, ...] = ()  # objects skipped while building, with why
    # Results derived from this snapshot alone, kept by their users for its lifetime (e.g. node
    # scores per pod size); never part of equality.
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # Each pod parsed from its raw object (GPU pods and gang members before index assignment; other pods as
    # what they hold), so that the next build re-parses only objects that changed (the feeder replaces, never
    # mutates, a changed object).
    parsed: Mapping[str, tuple[Mapping[str, Any], Pod | _Held]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )
    # PodDisruptionBudgets (policy/v1) by "namespace/name": what the Eviction API will refuse (`DisruptionBudget`).
    disruption_budgets: Mapping[str, DisruptionBudget] = dataclasses.field(default_factory=dict)
    dra: dra.Inventory = dra.EMPTY  # the cluster's DRA GPUs (`common.dra`)
    # Each node as parsed from its raw object (None: no GPUs), by name: like `parsed`, so that the next build
    # re-parses only nodes that changed (parsing every node's quantities each rebuild cost more than the rest).
    parsed_nodes: Mapping[str, tuple[Mapping[str, Any], NodeParse | None]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    @functools.cached_property
    def nodes_by_gpu_state(self) -> Mapping[tuple[Any, ...], tuple[Node, ...]]:
        """Nodes grouped by `Node.gpu_state`, each group sorted by name (computed once per snapshot)."""
        groups: dict[tuple[Any, ...], list[Node]] = {}
        for name in sorted(self.nodes):
            node = self.nodes[name]
            groups.setdefault(node.gpu_state, []).append(node)
        return {state: tuple(group) for state, group in groups.items()}

    @functools.cached_property
    def anti_affinity(self) -> bool:
        """Whether any node carries required anti-affinity terms of the pods holding nodes."""
        return any(node.anti_affinity for node in self.nodes.values())

    @functools.cached_property
    def residents(self) -> tuple[antiaffinity.Resident, ...]:
        """Every pod holding a node (GPU pod or not, on any node) with its labels and its node's, in key order:
        what a pod's own required anti-affinity selects among (`antiaffinity.occupied`). Computed on first use."""
        node_labels = {name: (raw.get("metadata") or {}).get("labels") or {}
                       for name, (raw, _) in self.parsed_nodes.items()}
        out = []
        for key in sorted(self.parsed):
            raw, entry = self.parsed[key]
            if entry.held_on is not None:
                meta = raw.get("metadata") or {}
                out.append(antiaffinity.Resident(key, meta.get("namespace") or "default", meta.get("labels") or {},
                                                 node_labels.get(entry.held_on, {})))
        return tuple(out)

    def age(self, now: float) -> float | None:
        return None if self.taken_at is None else max(0.0, now - self.taken_at)


EMPTY = Snapshot(nodes={}, pods={}, priority_classes={}, namespaces={}, taken_at=None)


@dataclasses.dataclass(frozen=True)
class _Held:
    """A pod that is neither a GPU pod nor a gang member: only what it holds matters."""

    held_on: str | None
    requests: Mapping[str, int]
    namespace: str = "default"
    host_ports: frozenset[hostports.HostPort] = frozenset()
    anti_affinity: tuple[Mapping[str, Any], ...] = ()


def parse(raw: Mapping[str, Any], *, names: settings.Names, inventory: dra.Inventory = dra.EMPTY) -> Pod | _Held:
    counted = gpu_requests(raw, inventory, names=names)
    request, requests, claims = counted
    if request.any or claims.any or gangs.involved(raw, names=names):
        return _pod(raw, counted=counted)
    return _Held(held_on(raw), requests, (raw.get("metadata") or {}).get("namespace") or "default",
                 hostports.of_pod(raw), antiaffinity.required_terms(raw))


Counted = tuple[gpu.GpuRequest, dict[str, int], dra.PodGpus]


def gpu_requests(raw: Mapping[str, Any], inventory: dra.Inventory, *, names: settings.Names) -> Counted:
    """The pod's GPU request and request vector with its DRA GPUs counted as the device plugin's are: whole GPUs as
    `gpu.FULL_GPU`, MIG devices as `nvidia.com/mig-<profile>`. Counted: the exact counts its claims ask of GPU
    classes (its claim of its own read in our annotation, `names.domain_claim`), and extended resources a GPU class
    serves under another name. Raises QuantityError for a malformed quantity."""
    request, requests = gpu.pod_request(raw), resources.pod_requests(raw)
    claimed = dra.pod_gpus(raw, inventory, annotation=names.domain_claim) if inventory.served else dra.NONE
    renamed = dra.extended_gpus(requests, inventory)
    renamed_mig = dra.extended_mig(requests, inventory)
    mig = dict(claimed.mig)
    for profile, count in renamed_mig.values():
        mig[profile] = mig.get(profile, 0) + count
    extra = gpu.GpuRequest(full=claimed.count + sum(renamed.values()), mig=mig)
    if not extra.any:
        return request, requests, claimed
    requests = {k: v for k, v in requests.items() if k not in renamed and k not in renamed_mig}
    for name, count in ((gpu.FULL_GPU, extra.full), *((gpu.MIG_PREFIX + p, n) for p, n in mig.items())):
        if count:
            requests[name] = requests.get(name, 0) + count
    return gpu.add(request, extra), requests, claimed


def _running(raw: Mapping[str, Any], *, claimed: gpu.GpuRequest) -> gpu.GpuRequest:
    """`gpu.running_request` plus the GPUs its claims (and renamed extended resources) hold: a container holds a
    claim's devices for as long as it runs."""
    return gpu.add(gpu.running_request(raw), claimed)


def _beyond(request: gpu.GpuRequest, own: gpu.GpuRequest) -> gpu.GpuRequest:
    """What `request` counts beyond the pod's own containers' `own` (its DRA GPUs)."""
    return gpu.GpuRequest(full=request.full - own.full,
                          mig={p: n - own.mig.get(p, 0) for p, n in request.mig.items() if n > own.mig.get(p, 0)})


def _pod(raw: Mapping[str, Any], *, counted: Counted | None = None) -> Pod:
    """`counted`: its `gpu_requests` (default: without DRA GPUs)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    request, requests, claimed = counted or (gpu.pod_request(raw), resources.pod_requests(raw), dra.NONE)
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")] or meta.get("ownerReferences") or []
    return Pod(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        node_name=spec.get("nodeName") or None,
        phase=(raw.get("status") or {}).get("phase") or "Pending",
        request=request,
        running=_running(raw, claimed=_beyond(request, gpu.pod_request(raw))),
        priority=int(spec.get("priority") or 0),
        priority_class_name=spec.get("priorityClassName") or None,
        preemption_policy=spec.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY,
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        owner_kind=owners[0].get("kind") if owners else None,
        owner_name=owners[0].get("name") if owners else None,
        created=meta.get("creationTimestamp") or "",
        scheduling_gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or []),
        deleting=bool(meta.get("deletionTimestamp")),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        raw=raw,
        requests=requests,
        held_on=held_on(raw),
        dra=claimed,
    )


@dataclasses.dataclass(frozen=True)
class NodeParse:
    """What `build` reads of a GPU node's own object (not of the pods on it)."""

    allocatable: gpu.GpuRequest
    topology: topology.NodeTopology
    resources: Mapping[str, int]
    schedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    dra_gpus: bool = False  # its GPUs are DRA devices (no device plugin's)
    devices: int = 0  # DRA GPU devices it was parsed with
    slices: tuple[tuple[str, int], ...] = ()  # DRA MIG devices by profile it was parsed with


def parse_node(raw: Mapping[str, Any], *, names: settings.Names, devices: int = 0,
                slices: Mapping[str, int] | None = None) -> NodeParse | None:
    """`devices`, `slices`: the node's DRA GPU devices and DRA MIG devices by profile (`common.dra`), counted only
    where no device plugin offers GPUs or MIG slices (a node's GPUs come from one source)."""
    allocatable = gpu.node_allocatable(raw)
    mig = {p: n for p, n in (slices or {}).items() if n}
    from_dra = (devices > 0 or bool(mig)) and not allocatable.any
    if from_dra:
        allocatable = gpu.GpuRequest(full=devices, mig=mig)
    if not allocatable.any:
        return None
    offered = resources.node_allocatable(raw)
    if from_dra:
        offered.update({name: n for name, n in ((gpu.FULL_GPU, devices), *((gpu.MIG_PREFIX + p, n)
                                                                             for p, n in mig.items())) if n})
    spec = raw.get("spec") or {}
    return NodeParse(allocatable=allocatable,
                      topology=topology.from_node(raw, names=names, gpus=devices if from_dra else None),
                      resources=offered,
                      schedulable=_node_ready(raw) and not spec.get("unschedulable"),
                      taints=tuple(spec.get("taints") or ()), dra_gpus=from_dra, devices=devices,
                      slices=tuple(sorted(mig.items())))


def _node_ready(raw: Mapping[str, Any]) -> bool:
    for condition in (raw.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def priority_class(raw: Mapping[str, Any]) -> PriorityClass:
    meta = raw.get("metadata") or {}
    return PriorityClass(
        name=meta.get("name") or "",
        value=int(raw.get("value") or 0),
        preemption_policy=raw.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY,
        annotations=meta.get("annotations") or {},
        global_default=bool(raw.get("globalDefault")),
    )


def pod_key(raw: Mapping[str, Any]) -> str:
    """The key a pod object has in a snapshot (and in `Builder.build`'s `pods`): namespace/name."""
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def node_name(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("name") or "")


Entry = Pod | _Held  # a pod's parse (`parse`)

# --- PodDisruptionBudgets -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DisruptionBudget:
    """A policy/v1 PodDisruptionBudget as the Eviction API judges it: an eviction of a pod it selects is refused
    (HTTP 429) unless `status.disruptionsAllowed` > 0, and each accepted eviction takes one from it."""

    namespace: str
    name: str
    selector: Mapping[str, Any] | None  # spec.selector; None selects no pod, {} every pod of the namespace
    disruptions_allowed: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: Pod) -> bool:
        """A selector we cannot read selects the pod: a budget we misread must protect, never expose."""
        return pod.namespace == self.namespace and label_selectors.matches(self.selector, pod.labels)


def disruption_budget(raw: Mapping[str, Any]) -> DisruptionBudget:
    meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
    selector = spec.get("selector")
    allowed = status.get("disruptionsAllowed")
    return DisruptionBudget(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        selector=selector if isinstance(selector, Mapping) else None,
        # No status yet (the disruption controller has not computed it): the API server refuses, so do we.
        disruptions_allowed=allowed if isinstance(allowed, int) else 0,
    )


def parse_pod(raw: Mapping[str, Any]) -> Pod:
    """One pod object as the snapshot reads it (no GPU indices): for checks on a pod read live."""
    return _pod(raw)
