"""An immutable picture of the cluster that every decision reads: GPU nodes, GPU pods, PriorityClasses,
namespaces, native PodGroups, and which GPU indices each pod holds. Pods that request no GPU are left out
unless the gang controller needs them (`gangs.involved`: e.g. an MPI launcher counted in its gang's size): a gang is
complete, released and reclaimed with all of its members.

`build()` is pure: it builds from raw API objects and DCGM occupancy; `Builder` builds one snapshot after another
(the shell, `common.feeder`, owns one), re-doing only what changed, with the same result;
`from_list()` replays the JSON of `kubectl get nodes,pods,priorityclasses,namespaces -A -o json`.
Where DCGM has not told us a pod's GPU indices, they are estimated with `common.placement`'s policy.

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
from collections.abc import Iterable, Mapping, Sequence
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


def _held_on(raw: Mapping[str, Any]) -> str | None:
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
    parsed_nodes: Mapping[str, tuple[Mapping[str, Any], _NodeParse | None]] = dataclasses.field(
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


def _parse(raw: Mapping[str, Any], *, names: settings.Names, inventory: dra.Inventory = dra.EMPTY) -> Pod | _Held:
    counted = gpu_requests(raw, inventory, names=names)
    request, requests, claims = counted
    if request.any or claims.any or gangs.involved(raw, names=names):
        return _pod(raw, counted=counted)
    return _Held(_held_on(raw), requests, (raw.get("metadata") or {}).get("namespace") or "default",
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
        held_on=_held_on(raw),
        dra=claimed,
    )


@dataclasses.dataclass(frozen=True)
class _NodeParse:
    """What `build` reads of a GPU node's own object (not of the pods on it)."""

    allocatable: gpu.GpuRequest
    topology: topology.NodeTopology
    resources: Mapping[str, int]
    schedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    dra_gpus: bool = False  # its GPUs are DRA devices (no device plugin's)
    devices: int = 0  # DRA GPU devices it was parsed with
    slices: tuple[tuple[str, int], ...] = ()  # DRA MIG devices by profile it was parsed with


def _parse_node(raw: Mapping[str, Any], *, names: settings.Names, devices: int = 0,
                slices: Mapping[str, int] | None = None) -> _NodeParse | None:
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
    return _NodeParse(allocatable=allocatable,
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


def _priority_class(raw: Mapping[str, Any]) -> PriorityClass:
    meta = raw.get("metadata") or {}
    return PriorityClass(
        name=meta.get("name") or "",
        value=int(raw.get("value") or 0),
        preemption_policy=raw.get("preemptionPolicy") or DEFAULT_PREEMPTION_POLICY,
        annotations=meta.get("annotations") or {},
        global_default=bool(raw.get("globalDefault")),
    )


def build(
    *,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    priority_classes: Iterable[Mapping[str, Any]] = (),
    namespaces: Iterable[Mapping[str, Any]] = (),
    occupancy: Occupancy | None = None,
    names: settings.Names,
    taken_at: float | None,
    pod_groups: Iterable[Mapping[str, Any]] = (),
    pod_group_version: str | None = gangs.POD_GROUP_VERSIONS[0],
    disruption_budgets: Iterable[Mapping[str, Any]] = (),
    inventory: dra.Inventory = dra.EMPTY,
) -> Snapshot:
    """A snapshot from scratch (`Builder` builds one after another, re-doing only what changed). `inventory`: the
    cluster's DRA GPUs (`dra.build`): a node without a device plugin's GPUs offers its GPU devices, and which of
    them are taken, and by whom, is read from the claims' allocations. `pod_group_version`: the PodGroup API version
    `pod_groups` were read from (None: not served or not granted to us; `gangs.identify` says so). An object listed
    twice (the same node name, the same pod namespace/name) counts once: the last one."""
    return Builder(names=names).build(
        nodes={node_name(raw): raw for raw in nodes}, pods={pod_key(raw): raw for raw in pods},
        priority_classes=priority_classes, namespaces=namespaces, occupancy=occupancy, taken_at=taken_at,
        pod_groups=pod_groups, pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
        inventory=inventory)


def pod_key(raw: Mapping[str, Any]) -> str:
    """The key a pod object has in a snapshot (and in `Builder.build`'s `pods`): namespace/name."""
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def node_name(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("name") or "")


Entry = Pod | _Held  # a pod's parse (`_parse`)


class Builder:
    """Builds a snapshot from the stores after each change, re-doing only what the change touched; each result equals
    a from-scratch `build` of the same objects. Pure (no I/O, no clock); one build at a time.

    What it keeps from the last build, and what makes it do a part again:
    - a pod's parse: again when the store holds a new object under its key (the feeder replaces, never mutates, a
      changed object), or when the DRA inventory changed and the pod asks devices through claims (every pod when the
      extended resource names GPU classes serve changed);
    - a node's parse: again when its object is a new one, or its number of DRA GPU devices changed;
    - a node's `Node` and its GPU pods' indices: again when its object, any pod holding it (or that held it), its
      DCGM occupancy, its DRA devices, their order, the claims holding them or their taints, whether a DeviceClass
      serves `nvidia.com/gpu`, or the required anti-affinity terms covering it changed;
    - the anti-affinity terms: again when a pod that has such terms changed, a node's labels, or the namespaces.
    PriorityClasses, namespaces, PodGroups and PodDisruptionBudgets are read again each build (few, cheap).
    A build that raises leaves nothing kept: the next one starts from scratch."""

    def __init__(self, *, names: settings.Names) -> None:
        self._names = names
        self._forget()

    def _forget(self) -> None:
        self._first = True
        self._pods: Mapping[str, Mapping[str, Any]] = {}  # the pods' objects at the last build, by key
        self._entries: dict[str, Entry] = {}  # each pod's parse, by key
        self._pod_problems: dict[str, str] = {}  # pods skipped, by key
        self._claiming: set[str] = set()  # keys of pods asking devices through claims
        self._holders: dict[str, dict[str, Entry]] = {}  # node -> the parses of the pods holding it, by key
        self._uids: dict[str, str] = {}  # uid -> key of the GPU pods and gang members (`Pod`)
        self._nodes: Mapping[str, Mapping[str, Any]] = {}  # the nodes' objects at the last build, by name
        self._node_parses: dict[str, _NodeParse | None] = {}
        self._built: dict[str, Node] = {}  # GPU nodes
        self._node_problems: dict[str, tuple[str, ...]] = {}
        self._indexed: dict[str, dict[str, Pod]] = {}  # GPU node -> its GPU pods with their GPU indices, by key
        self._occupancy: Occupancy = {}
        self._inventory = dra.EMPTY
        self._claimed: dict[str, dict[int, str]] = {}
        self._blocked: dict[str, frozenset[int]] = {}
        self._slices: dict[str, tuple[tuple[str, str | None], ...]] = {}
        self._namespaces: list[Mapping[str, Any]] = []
        self._terms: dict[tuple[str, str], list[antiaffinity.Term]] = {}

    def build(
        self,
        *,
        nodes: Mapping[str, Mapping[str, Any]],
        pods: Mapping[str, Mapping[str, Any]],
        priority_classes: Iterable[Mapping[str, Any]] = (),
        namespaces: Iterable[Mapping[str, Any]] = (),
        occupancy: Occupancy | None = None,
        taken_at: float | None,
        pod_groups: Iterable[Mapping[str, Any]] = (),
        pod_group_version: str | None = gangs.POD_GROUP_VERSIONS[0],
        disruption_budgets: Iterable[Mapping[str, Any]] = (),
        inventory: dra.Inventory = dra.EMPTY,
    ) -> Snapshot:
        """`nodes`: node objects by name; `pods`: pod objects by `pod_key`; the rest as `build` takes them. The
        mappings are kept until the next build: hand over copies, not a store that changes."""
        try:
            return self._build(nodes=nodes, pods=pods, priority_classes=priority_classes, namespaces=list(namespaces),
                               occupancy=occupancy or {}, taken_at=taken_at, pod_groups=pod_groups,
                               pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
                               inventory=inventory)
        except BaseException:
            self._forget()  # a half-updated state: the next build starts from scratch
            raise

    def _build(self, *, nodes: Mapping[str, Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
               priority_classes: Iterable[Mapping[str, Any]], namespaces: list[Mapping[str, Any]],
               occupancy: Occupancy, taken_at: float | None, pod_groups: Iterable[Mapping[str, Any]],
               pod_group_version: str | None, disruption_budgets: Iterable[Mapping[str, Any]],
               inventory: dra.Inventory) -> Snapshot:
        first, was = self._first, self._inventory
        dra_same = not first and (was is inventory or was == inventory)
        dirty: set[str] = set(nodes) | set(self._nodes) if first else set()  # nodes to assemble again
        terms_dirty = first or len(namespaces) != len(self._namespaces) or any(
            a is not b for a, b in zip(namespaces, self._namespaces, strict=False))

        # Pods: parse again the new objects (and those the inventory's change concerns).
        changed = [key for key, raw in pods.items() if self._pods.get(key) is not raw]
        changed += [key for key in self._pods if key not in pods]
        if not dra_same and not first:
            changed += list(pods) if _renamed(was) != _renamed(inventory) else list(self._claiming)
        for key in dict.fromkeys(changed):
            terms_dirty |= self._reparse(key, pods.get(key), inventory=inventory, dirty=dirty)

        # Nodes: parse again the new objects, or the ones whose DRA devices changed.
        for name in {name for name, raw in nodes.items() if self._nodes.get(name) is not raw} | (
                set(self._nodes) - set(nodes)):
            dirty.add(name)
            old, raw = self._nodes.get(name), nodes.get(name)
            terms_dirty |= _labels(old) != _labels(raw)
        if not dra_same:
            if ((gpu.FULL_GPU in was.extended) != (gpu.FULL_GPU in inventory.extended)
                    or was.extended_mig != inventory.extended_mig):
                dirty |= set(nodes)
            dirty |= {name for name in nodes if was.devices.get(name) != inventory.devices.get(name)
                      or was.mig.get(name) != inventory.mig.get(name)
                      or was.order.get(name) != inventory.order.get(name)}
        for name in dirty:
            raw = nodes.get(name)
            devices, profiles = len(inventory.devices.get(name, ())), inventory.profiles(name)
            own = self._node_parses.get(name)
            parsed_with = (own.devices, own.slices) if own is not None else (0, ())
            if raw is None:
                self._node_parses.pop(name, None)
            elif (self._nodes.get(name) is not raw or name not in self._node_parses
                  or parsed_with != (devices, tuple(sorted(profiles.items())))):
                self._node_parses[name] = _parse_node(raw, names=self._names, devices=devices, slices=profiles)

        # What a node reads of the rest of the cluster: DCGM occupancy, the claims holding its DRA devices.
        if occupancy is not self._occupancy:
            dirty |= {name for name in set(occupancy) | set(self._occupancy)
                      if occupancy.get(name) != self._occupancy.get(name)}
        claimed, blocked = _claimed(inventory, self._uids) if inventory.devices else ({}, {})
        slices = _slices_taken(inventory, self._uids) if inventory.mig else {}
        dirty |= {name for name in set(claimed) | set(self._claimed)
                  if claimed.get(name) != self._claimed.get(name) or blocked.get(name) != self._blocked.get(name)}
        dirty |= {name for name in set(slices) | set(self._slices) if slices.get(name) != self._slices.get(name)}
        namespace_labels = {(ns.get("metadata") or {}).get("name") or "": (ns.get("metadata") or {}).get("labels")
                            or {} for ns in namespaces}
        if terms_dirty:
            self._terms = _terms(((key, self._entries[key]) for key in pods if key in self._entries),
                                 labels_of={name: _labels(raw) for name, raw in nodes.items()},
                                 namespaces=namespace_labels)
            dirty |= {name for name, node in self._built.items() if name in nodes
                      and node.anti_affinity != _covering(self._terms, _labels(nodes[name]))}

        # Assemble the nodes that changed; the others are kept as they were.
        before: dict[str, Pod] = {}
        for name in dirty:
            before.update(self._indexed.pop(name, {}))
            self._built.pop(name, None)
            self._node_problems.pop(name, None)
        for name in dirty:
            own = self._node_parses.get(name)
            if own is None:
                continue
            holders = self._holders.get(name, {})
            resident = [e for e in holders.values() if isinstance(e, Pod) and e.request.any]
            node, problems, indexed = _assemble(
                name=name, raw=nodes[name], own=own, resident=resident, holders=holders,
                observed=occupancy.get(name, {}), claimed=claimed.get(name, {}),
                blocked=blocked.get(name, frozenset()), terms=self._terms, inventory=inventory, before=before,
                slices=slices.get(name, ()))
            self._built[name], self._indexed[name] = node, indexed
            if problems:
                self._node_problems[name] = problems

        self._first, self._pods, self._nodes, self._occupancy = False, pods, nodes, occupancy
        self._inventory, self._claimed, self._blocked, self._namespaces = inventory, claimed, blocked, namespaces
        self._slices = slices
        return self._snapshot(nodes=nodes, pods=pods, priority_classes=priority_classes,
                              namespace_labels=namespace_labels, taken_at=taken_at, pod_groups=pod_groups,
                              pod_group_version=pod_group_version, disruption_budgets=disruption_budgets,
                              inventory=inventory)

    def _reparse(self, key: str, raw: Mapping[str, Any] | None, *, inventory: dra.Inventory, dirty: set[str]) -> bool:
        """Forget the pod's last parse and parse `raw` (None: it is gone); the nodes it held and holds are `dirty`.
        Returns whether either parse has required anti-affinity terms."""
        terms = False
        self._pod_problems.pop(key, None)
        self._claiming.discard(key)
        old = self._entries.pop(key, None)
        if old is not None:
            terms = bool(old.anti_affinity)
            if old.held_on is not None:
                dirty.add(old.held_on)
                self._holders[old.held_on].pop(key, None)
            if isinstance(old, Pod) and self._uids.get(old.uid) == key:
                del self._uids[old.uid]
        if raw is None:
            return terms
        if _claims(raw):
            self._claiming.add(key)
        try:
            entry = _parse(raw, names=self._names, inventory=inventory)
        except (gpu.QuantityError, ValueError, TypeError) as exc:
            self._pod_problems[key] = f"pod {key} skipped: {exc}"
            return terms
        self._entries[key] = entry
        if entry.held_on is not None:
            dirty.add(entry.held_on)
            self._holders.setdefault(entry.held_on, {})[key] = entry
        if isinstance(entry, Pod) and entry.uid:
            self._uids[entry.uid] = key
        return terms or bool(entry.anti_affinity)

    def _snapshot(self, *, nodes: Mapping[str, Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]],
                  priority_classes: Iterable[Mapping[str, Any]], namespace_labels: Mapping[str, Mapping[str, str]],
                  taken_at: float | None, pod_groups: Iterable[Mapping[str, Any]], pod_group_version: str | None,
                  disruption_budgets: Iterable[Mapping[str, Any]], inventory: dra.Inventory) -> Snapshot:
        """The snapshot of what is kept, every mapping in the stores' order (as a from-scratch build gives it)."""
        entries = self._entries
        parsed = {key: (raw, entries[key]) for key, raw in pods.items() if key in entries}
        indexed = {key: pod for placed in self._indexed.values() for key, pod in placed.items()}
        kept = {key: indexed.get(key, entry) for key, (_, entry) in parsed.items() if isinstance(entry, Pod)}
        problems = [*inventory.problems]
        if self._pod_problems:
            problems += [self._pod_problems[key] for key in pods if key in self._pod_problems]
        problems += [p for name in nodes for p in self._node_problems.get(name, ())]
        built = Snapshot(
            nodes={name: self._built[name] for name in nodes if name in self._built},
            pods=kept,
            priority_classes={pc.name: pc for pc in map(_priority_class, priority_classes)},
            namespaces=dict(namespace_labels),
            taken_at=taken_at,
            pod_groups=gangs.PodGroups({group.key: group for group in map(gangs.pod_group, pod_groups)},
                                       pod_group_version),
            problems=tuple(problems),
            parsed=parsed,
            disruption_budgets={b.key: b for b in map(disruption_budget, disruption_budgets)},
            parsed_nodes={name: (raw, self._node_parses.get(name)) for name, raw in nodes.items()},
            dra=inventory,
        )
        # Derived views are computed here, where the shell builds (off the request path), not on first use.
        _ = built.nodes_by_gpu_state
        return built


def _assemble(*, name: str, raw: Mapping[str, Any], own: _NodeParse, resident: Sequence[Pod],
              holders: Mapping[str, Entry], observed: Mapping[int, str], claimed: Mapping[int, str],
              blocked: frozenset[int], terms: Mapping[tuple[str, str], Sequence[antiaffinity.Term]],
              inventory: dra.Inventory, before: Mapping[str, Pod], slices: Sequence[tuple[str, str | None]] = (),
              ) -> tuple[Node, tuple[str, ...], dict[str, Pod]]:
    """One GPU node as the pods holding it leave it (`resident`: its GPU pods), with its problems and its GPU pods
    with their indices (`before`: their last ones, kept when equal). `slices`: its DRA MIG devices that are taken
    (`_slices_taken`)."""
    meta = raw.get("metadata") or {}
    problems: list[str] = []
    if (inventory.devices.get(name) or inventory.mig.get(name)) and not own.dra_gpus:
        found = ", ".join(f"{n} DRA {kind} devices" for kind, n in (("GPU", len(inventory.devices.get(name, ()))),
                                                                      ("MIG", len(inventory.mig.get(name, ())))) if n)
        problems.append(f"node {name}: {found} beside a device plugin's GPUs; only the device plugin's are counted")
    topo = own.topology
    problems += [f"node {name}: {p}" for p in topo.problems]
    # Bound pods first (oldest first), then the ones not bound yet: estimated indices go to the former.
    resident = sorted(resident, key=lambda p: (p.reserved, p.created, p.key))
    # On a DRA node the claims' allocations say exactly which devices each pod holds; devices taken by a claim of
    # no pod we hold, or tainted, are taken all the same (`blocked`).
    if own.dra_gpus:  # a claim still held by a pod that no longer holds the node (finished) is taken too
        here = {p.key for p in resident}
        observed = {i: key for i, key in claimed.items() if key in here}
        blocked = blocked | {i for i, key in claimed.items() if key not in here}
    else:
        blocked = frozenset()
    # Indices the topology names but no device has (labels that disagree with the slices) are never free.
    absent = frozenset(i for d in topo.domains for i in d) - _indices(inventory.devices.get(name, ())) \
        if own.dra_gpus else frozenset()
    indices, used, seen = _assign_indices(topo.domains, resident, observed, blocked | absent)
    placed: dict[str, Pod] = {}
    for pod in resident:
        was = before.get(pod.key)
        if (was is not None and was.raw is pod.raw and was.gpu_indices == indices[pod.key]
                and was.indices_observed == (pod.key in seen) and was.dra == pod.dra and was.request == pod.request):
            placed[pod.key] = was
        else:
            placed[pod.key] = dataclasses.replace(pod, gpu_indices=indices[pod.key], indices_observed=pod.key in seen)
    mig_used = _slices_used(resident, slices if own.dra_gpus else ())
    asked_mig = gpu.GpuRequest()
    for pod in resident:
        asked_mig = gpu.add(asked_mig, gpu.GpuRequest(mig=pod.request.mig))
    extra_mig = {gpu.MIG_PREFIX + p: n - asked_mig.mig.get(p, 0) for p, n in mig_used.items()
                 if n > asked_mig.mig.get(p, 0)}
    node = Node(
        name=name,
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        topology=topo,
        allocatable=own.allocatable,
        schedulable=own.schedulable,
        taints=own.taints,
        used=frozenset(used),
        requested_full=sum(p.request.full for p in resident) + len(blocked),
        mig_used=mig_used,
        pods=tuple(p.key for p in resident if not p.reserved),
        resources=own.resources,
        requested={**resources.add(*(e.requests for e in holders.values()),
                                   {gpu.FULL_GPU: len(blocked)} if blocked else {}, extra_mig),
                   resources.PODS: len(holders)},
        reserved=tuple(p.key for p in resident if p.reserved),
        host_ports=frozenset(port for e in holders.values() for port in e.host_ports),
        anti_affinity=_covering(terms, meta.get("labels") or {}),
        dra_gpus=own.dra_gpus,
        extended_gpus=not own.dra_gpus or gpu.FULL_GPU in inventory.extended,
        extended_mig=frozenset(n for n, p in inventory.extended_mig.items() if n == gpu.MIG_PREFIX + p)
        if own.dra_gpus else frozenset(),
        device_order=inventory.order.get(name) if own.dra_gpus else None,
    )
    return node, tuple(problems), placed


def _labels(raw: Mapping[str, Any] | None) -> Mapping[str, str]:
    return ((raw or {}).get("metadata") or {}).get("labels") or {}


def _renamed(inventory: dra.Inventory) -> frozenset[str]:
    """The extended resource names GPU classes serve other than the device plugin's (`nvidia.com/gpu`,
    `nvidia.com/mig-<profile>`): a pod's parse reads them."""
    return frozenset(name for name in inventory.extended if name != gpu.FULL_GPU) | frozenset(
        name for name, profile in inventory.extended_mig.items() if name != gpu.MIG_PREFIX + profile)


def _covering(terms: Mapping[tuple[str, str], Sequence[antiaffinity.Term]], labels: Mapping[str, str],
              ) -> tuple[antiaffinity.Term, ...]:
    """The terms covering a node with these labels."""
    return tuple(t for (key, value), found in terms.items() if labels.get(key) == value for t in found)


def _terms(entries: Iterable[tuple[str, Entry]], *, labels_of: Mapping[str, Mapping[str, str]],
           namespaces: Mapping[str, Mapping[str, str]]) -> dict[tuple[str, str], list[antiaffinity.Term]]:
    """The required anti-affinity terms of pods holding nodes by the topology pair (key, value) they cover, from
    every pod that holds a node (GPU nodes or not: a zone spans both)."""
    terms_on: dict[tuple[str, str], list[antiaffinity.Term]] = {}
    for key, entry in entries:  # not sorted: every pod of the cluster passes here
        if entry.held_on is None or not entry.anti_affinity:
            continue
        for raw_term in entry.anti_affinity:
            term = antiaffinity.resolve(raw_term, owner=key, owner_namespace=entry.namespace,
                                        node_labels=labels_of.get(entry.held_on, {}), namespaces=namespaces)
            if term is not None:
                terms_on.setdefault((term.topology_key, term.topology_value), []).append(term)
    for found in terms_on.values():
        found.sort(key=lambda t: t.owner)  # the first refusing term is the reason given: the same every build
    return terms_on


def _claimed(inventory: dra.Inventory, key_of: Mapping[str, str],
             ) -> tuple[dict[str, dict[int, str]], dict[str, frozenset[int]]]:
    """Per DRA node: GPU index -> key of the pod its claim is reserved for (`key_of`: pod uid -> key), and the
    indices taken otherwise: by a claim reserved for no pod we know (allocated, not reserved; a finished pod's), or
    tainted against new claims. A device's index is its `index` attribute, else its place in the node's list."""
    taken = inventory.taken()
    claimed: dict[str, dict[int, str]] = {}
    blocked: dict[str, frozenset[int]] = {}
    for node, devices in inventory.devices.items():
        mine: dict[int, str] = {}
        others: set[int] = set()
        for position, device in enumerate(devices):
            index = device.index if device.index is not None else position
            claim = taken.get(device.id)
            holder = next((key_of[u] for u in claim.reserved_for if u in key_of), None) if claim else None
            if holder is not None:
                mine[index] = holder
            elif claim is not None or device.blocked:
                others.add(index)
        claimed[node], blocked[node] = mine, frozenset(others)
    return claimed, blocked


def _slices_taken(inventory: dra.Inventory, key_of: Mapping[str, str],
                  ) -> dict[str, tuple[tuple[str, str | None], ...]]:
    """Per DRA node, its MIG devices that no new claim can get: (profile, key of the pod its claim is reserved for,
    None: a claim of no pod we know, or a taint against new claims)."""
    taken = inventory.taken()
    out: dict[str, tuple[tuple[str, str | None], ...]] = {}
    for node, devices in inventory.mig.items():
        found = []
        for device in devices:
            claim = taken.get(device.id)
            if claim is not None or device.blocked:
                holder = next((key_of[u] for u in claim.reserved_for if u in key_of), None) if claim else None
                found.append((str(device.profile), holder))
        out[node] = tuple(found)
    return out


def _slices_used(resident: Sequence[Pod], taken: Sequence[tuple[str, str | None]]) -> dict[str, int]:
    """MIG slices in use by profile: each resident pod's, the larger of what it asks and what its claims hold, and
    the taken ones no resident pod holds (`_slices_taken`)."""
    here = {p.key for p in resident}
    held: dict[tuple[str, str], int] = {}
    used: dict[str, int] = {}
    for profile, holder in taken:
        if holder in here:
            held[(str(holder), profile)] = held.get((str(holder), profile), 0) + 1
        else:
            used[profile] = used.get(profile, 0) + 1
    for pod in resident:
        for profile in {*pod.request.mig, *(p for k, p in held if k == pod.key)}:
            used[profile] = used.get(profile, 0) + max(pod.request.mig.get(profile, 0), held.get((pod.key, profile), 0))
    return {p: n for p, n in used.items() if n}


def _indices(devices: Sequence[dra.Device]) -> frozenset[int]:
    return frozenset(d.index if d.index is not None else position for position, d in enumerate(devices))


def _claims(raw: Mapping[str, Any]) -> bool:
    return bool((raw.get("spec") or {}).get("resourceClaims")
                or (raw.get("status") or {}).get("extendedResourceClaimStatus"))


def _assign_indices(
    domains: Sequence[Sequence[int]], resident: Sequence[Pod], observed: Mapping[int, str],
    blocked: frozenset[int] = frozenset(),
) -> tuple[dict[str, tuple[int, ...]], set[int], set[str]]:
    """Observed indices first; the rest of the pods get the placement policy's choice, oldest first; `blocked`
    indices are taken by nobody we know. Returns indices per pod, all used indices (blocked ones included), and the
    pods whose indices were observed (DCGM, or their claims' allocation)."""
    valid = {i for d in domains for i in d}
    keys = {p.key for p in resident}
    indices: dict[str, list[int]] = {p.key: [] for p in resident}
    for index, key in observed.items():
        if key in keys and index in valid:
            indices[key].append(index)
    seen = {key for key, held in indices.items() if held}
    used = {i for held in indices.values() for i in held} | (blocked & valid)
    for pod in resident:
        missing = pod.request.full - len(indices[pod.key])
        if missing <= 0:
            continue
        choice = placement.allocate(placement.free_by_domain(domains, used), missing)
        if choice is not None:
            indices[pod.key] += choice.indices
            used |= set(choice.indices)
    return {k: tuple(sorted(v)) for k, v in indices.items()}, used, seen


LIST_KINDS = ("List", "NodeList", "PodList", "PriorityClassList", "NamespaceList")


DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceTaintRule")


def from_list(document: Mapping[str, Any], *, names: settings.Names, taken_at: float | None,
              gpu_classes: Sequence[str] = settings.Dra().gpu_device_classes) -> Snapshot:
    """Build from a Kubernetes `List` (kubectl get ... -o json) of nodes, pods, priorityclasses, namespaces
    (and podgroups, poddisruptionbudgets and DRA's deviceclasses, resourceslices, resourceclaims,
    resourceclaimtemplates and devicetainterules, if listed: `gpu_classes` names the GPU DeviceClasses).
    DRA counts as served when the list holds a DeviceClass or a ResourceSlice."""
    if document.get("kind") not in LIST_KINDS:
        raise ValueError(f"top-level kind is {document.get('kind')!r}; expected one of {', '.join(LIST_KINDS)}")
    items = document.get("items") or []
    if not isinstance(items, list):
        raise ValueError(f"items is a {type(items).__name__}; expected a list of objects")
    buckets: dict[str, list[Mapping[str, Any]]] = {
        "Node": [], "Pod": [], "PriorityClass": [], "Namespace": [], "PodGroup": [], "PodDisruptionBudget": [],
        **{kind: [] for kind in DRA_KINDS}}
    list_kind = str(document.get("kind"))
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"items[{index}] is a {type(item).__name__}; expected an object")
        kind = item.get("kind") or list_kind.removesuffix("List")
        if kind in buckets:
            buckets[kind].append(item)
    return build(
        nodes=buckets["Node"],
        pods=buckets["Pod"],
        priority_classes=buckets["PriorityClass"],
        namespaces=buckets["Namespace"],
        pod_groups=buckets["PodGroup"],
        disruption_budgets=buckets["PodDisruptionBudget"],
        names=names,
        taken_at=taken_at,
        inventory=dra.build(device_classes=buckets["DeviceClass"], slices=buckets["ResourceSlice"],
                            claims=buckets["ResourceClaim"], templates=buckets["ResourceClaimTemplate"],
                            taint_rules=buckets["DeviceTaintRule"], gpu_classes=gpu_classes,
                            served=bool(buckets["DeviceClass"] or buckets["ResourceSlice"])),
    )


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
