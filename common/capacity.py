"""The one capacity model: what a pod could get on a node now. Webhook ranking, release planning and
reclaim planning all ask it; nothing else in the project counts a node's free resources.

A node's room is its allocatable resources less what the pods holding it request (`snapshot.Node.requested`:
bound pods until they are gone, terminating ones included; pods the scheduler nominated to it; pods we pinned
to it and released but not bound yet), and its free GPU indices per NVLink domain (observed from DCGM where
present, else the placement policy's estimate, `common.placement`).

A pod may go to a node when kube-scheduler's filters would let it: those that read the pod and the node
(`fit.why_not`: readiness and cordon, taints, nodeSelector, required node affinity), those that read the
pods holding the node (`refuses`: host ports in use, NodePorts; required anti-affinity of pods already
there or in the same topology domain that selects the pod, InterPodAffinity), and its requests fit what is
free there (`resources.shortages`: the NodeResourcesFit filter, pod slots included); its whole GPUs then land
where the placement policy puts them. Planners take from a `Room` as they plan, so pods placed earlier in one
plan count against later ones (their requests, GPU indices and host ports).

Not modelled, so the pods they concern are placed by kube-scheduler alone (`ungoverned`: never gated for
placement, released unpinned in a gang): the pod's own required pod affinity and anti-affinity, hard topology
spread, dynamic resource claims, and every volume the scheduler has a filter for (persistentVolumeClaim,
ephemeral, and inline cloud or block disks; only `SIMPLE_VOLUMES` are governed). docs/placement.md has the
table of kube-scheduler 1.37's filters and how each is treated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from typing import Any

from common import antiaffinity, dra, fit, gpu, hostports, nvlink_score, placement, resources, settings, snapshot

UNMODELLED_AFFINITY = ("podAffinity", "podAntiAffinity")
# Volume sources no kube-scheduler 1.37 filter reads (VolumeBinding, VolumeZone, NodeVolumeLimits and
# VolumeRestrictions look only at claims, generic ephemeral volumes and in-tree cloud or block disks). Any
# other source makes the pod ungoverned: an allow-list, so a source we do not know is never pinned.
SIMPLE_VOLUMES = frozenset({"configMap", "secret", "emptyDir", "downwardAPI", "projected", "hostPath", "nfs",
                            "image", "csi", "gitRepo"})


def ungoverned(pod_spec: Mapping[str, Any], *, claims: dra.PodGpus | None = None,
               evaluated: Set[str] = frozenset()) -> str | None:
    """Why the model cannot answer for this pod (so a planner must not pin it), or None when it can. `claims`: what
    the DRA model makes of its resource claims (`dra.pod_gpus`); without it, claims are not modelled. `evaluated`:
    fields of `UNMODELLED_AFFINITY` the caller evaluates itself (reclaim: the pod's own podAntiAffinity,
    `antiaffinity.occupied`)."""
    if pod_spec.get("resourceClaims"):
        if claims is None:
            return "spec.resourceClaims (not modelled)"
        if claims.left:
            return f"{claims.left} (DRA: left to kube-scheduler)"
    affinity = pod_spec.get("affinity") or {}
    for field in UNMODELLED_AFFINITY:
        if field not in evaluated and isinstance(affinity, Mapping) and (affinity.get(field) or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"):
            return f"required {field} (not modelled)"
    if pod_spec.get("topologySpreadConstraints"):
        hard = [c for c in pod_spec["topologySpreadConstraints"] if isinstance(c, Mapping)
                and c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"]
        if hard:
            return "topologySpreadConstraints DoNotSchedule (not modelled)"
    for volume in pod_spec.get("volumes") or ():
        if not isinstance(volume, Mapping):
            return "a volume that is no object (volume filters not modelled)"
        odd = sorted(k for k in volume if k != "name" and k not in SIMPLE_VOLUMES)
        if odd:
            return f"volume {volume.get('name')} is {', '.join(odd)} (volume filters not modelled)"
    return None


def refuses(pod: snapshot.Pod, node: snapshot.Node, *, ports: frozenset[hostports.HostPort] | None = None,
            ) -> str | None:
    """Why the pods holding the node rule this pod out (None: they do not): a host port it wants is in use
    (`ports`: those in use, default the node's), or a required anti-affinity term of a pod there, or in the
    same topology domain, selects it."""
    clash = _port_clash(pod, node.host_ports if ports is None else ports)
    if clash:
        return clash
    if node.anti_affinity:
        term = antiaffinity.refusing(node.anti_affinity, namespace=pod.namespace, labels=pod.labels)
        if term is not None:
            return term.describe()
    return None


def _port_clash(pod: snapshot.Pod, used: frozenset[hostports.HostPort]) -> str | None:
    taken = hostports.conflicts(pod.host_ports, used)
    return f"host port {', '.join(map(hostports.describe, taken))} in use" if taken else None


def never_pod(pod: snapshot.Pod, node: snapshot.Node) -> str | None:
    """`never` for a snapshot pod, the pods holding the node included (`refuses`)."""
    return never(pod.raw.get("spec") or {}, pod.requests, node) or refuses(pod, node)


def key(pod: snapshot.Pod, cluster: snapshot.Snapshot) -> tuple[object, ...] | None:
    """What `never_pod` reads of the pod on the cluster's nodes, hashable, for caches of its answers: pods with
    equal keys may go to the same nodes. Namespace and labels count only where some node carries anti-affinity
    terms (else a StatefulSet's pods, each labelled with its name, would share nothing). None when the spec holds
    something unhashable (then do not cache)."""
    shape = fit.key(pod.raw.get("spec") or {})
    if shape is None:
        return None
    who = (pod.namespace, tuple(sorted(pod.labels.items()))) if cluster.anti_affinity else ()
    return shape, tuple(sorted(pod.requests.items())), tuple(sorted(pod.host_ports)), who


def never(pod_spec: Mapping[str, Any], requests: Mapping[str, int], node: snapshot.Node) -> str | None:
    """Why the pod can never run on the node as it stands, however empty (None: it could): the scheduler's
    filters, or a request larger than the node offers at all."""
    why = fit.why_not(pod_spec, node) or _gpu_source(pod_spec, requests, node)
    if why:
        return why
    too_big = [name for name, amount in sorted(requests.items()) if amount > node.resources.get(name, 0)]
    if too_big:
        return "requests more than the node has: " + ", ".join(
            f"{name} {requests[name]} > {node.resources.get(name, 0)}" for name in too_big)
    if node.resources.get(resources.PODS, 0) < 1:
        return "node runs no pods (allocatable pods 0)"
    return None


def _gpu_source(pod_spec: Mapping[str, Any], requests: Mapping[str, int], node: snapshot.Node) -> str | None:
    """Whether what serves the pod's GPUs and MIG slices is what the node has: those asked through resource claims
    (or an extended resource only a DeviceClass serves) need DRA devices; `nvidia.com/gpu` (`nvidia.com/mig-<p>`) on
    a DRA node needs a GPU (MIG) DeviceClass serving that name (kube-scheduler's DRAExtendedResource)."""
    own = gpu.pod_request({"spec": pod_spec})
    wanted = requests.get(gpu.FULL_GPU, 0)
    if wanted:
        if own.full < wanted and not node.dra_gpus:
            return f"asks {wanted - own.full} GPU of DRA device classes; the node's GPUs are a device plugin's"
        if own.full and node.dra_gpus and not node.extended_gpus:
            return (f"asks {gpu.FULL_GPU}; the node's GPUs are DRA devices and no GPU DeviceClass of "
                    "dra.gpu_device_classes serves that name")
    for name, count in sorted(requests.items()):
        if not name.startswith(gpu.MIG_PREFIX) or not count:
            continue
        mine = own.mig.get(name[len(gpu.MIG_PREFIX):], 0)
        if mine < count and not node.dra_gpus:
            return f"asks {count - mine} MIG {name} of DRA device classes; the node's GPUs are a device plugin's"
        if mine and node.dra_gpus and name not in node.extended_mig:
            return (f"asks {name}; the node's GPUs are DRA devices and no MIG DeviceClass of dra.gpu_device_classes "
                    "serves that name")
    return None


@dataclasses.dataclass
class Room:
    """What a node has left while a plan is made (a mutable working copy; `Room.of` is fresh each time)."""

    node: snapshot.Node
    free: dict[str, int]  # allocatable less requested, per resource (pod slots under `pods`)
    domains: list[list[int]]  # free full-GPU indices per NVLink domain
    ports: frozenset[hostports.HostPort] = frozenset()  # host ports in use

    @classmethod
    def of(cls, node: snapshot.Node, *, cluster: snapshot.Snapshot | None = None,
           leaving: Set[str] = frozenset()) -> Room:
        """The node's room now; `leaving`: keys of pods holding it that are to count as gone (victims a
        reclaim plan evicts), looked up in `cluster`."""
        free = resources.subtract(node.resources, node.requested)
        domains = [list(d) for d in node.free_by_domain()]
        if leaving and cluster is not None:
            for key in (*node.pods, *node.reserved):
                if key in leaving:
                    pod = cluster.pods[key]
                    free = resources.add(free, pod.requests, {resources.PODS: 1})
                    back = set(pod.gpu_indices)
                    domains = [sorted({*d, *(i for i in full if i in back)})
                               for d, full in zip(domains, node.topology.domains, strict=True)]
        # Host ports of leaving pods are kept: the caller that passes `leaving` (reclaim) plans with `place`,
        # which reads no ports.
        return cls(node, free, domains, node.host_ports)

    def copy(self) -> Room:
        return Room(self.node, dict(self.free), [list(d) for d in self.domains], self.ports)

    @property
    def free_gpus(self) -> int:
        return max(0, self.free.get(gpu.FULL_GPU, 0))

    def place(self, requests: Mapping[str, int], request: gpu.GpuRequest, *,
              one_domain: bool = True, first_fit: bool = True) -> placement.Allocation | str:
        """Where the pod's GPUs would land here, or why it does not fit now. `one_domain`: refuse to span
        NVLink domains when the pod could fit one domain of this node (it should wait for one instead).
        `first_fit`: on a node whose DRA allocator's order is known, predict its first fit; False for a pod whose
        claim of its own asks one domain first (`dra.PodGpus.domain_claim`): the policy's domain is what it gets."""
        for profile, count in sorted(request.mig.items()):
            free = self.free.get(gpu.MIG_PREFIX + profile, 0)
            if free < count:
                return f"needs {count}x MIG {profile}, {max(0, free)} free"
        if request.full > self.free_gpus:
            return f"needs {request.full} GPU, {self.free_gpus} free"
        short = _short(requests, self.free)
        if short:
            return short
        if not request.full:
            return placement.Allocation((), ())
        allocation = placement.allocate(self.domains, request.full,
                                        first_fit=self.node.device_order if first_fit else None)
        if allocation is None:
            return f"needs {request.full} GPU, free indices do not suffice"
        topo = self.node.topology
        if one_domain and topo.known and request.full <= topo.domain_size and allocation.spanned > 1:
            return f"needs {request.full} GPU in one NVLink domain"
        return allocation

    def take(self, requests: Mapping[str, int], allocation: placement.Allocation, *,
             ports: frozenset[hostports.HostPort] = frozenset()) -> None:
        self.free = resources.subtract(self.free, {**requests, resources.PODS: 1})
        taken = set(allocation.indices)
        self.domains = [[i for i in d if i not in taken] for d in self.domains]
        self.ports |= ports

    def place_pod(self, pod: snapshot.Pod, *, one_domain: bool = True) -> placement.Allocation | str:
        """`place` for a snapshot pod whose filters have been checked (`never_pod`): also refuses it when a
        host port it wants was taken here since (by a pod placed earlier in the plan)."""
        return _port_clash(pod, self.ports) or self.place(pod.requests, pod.request, one_domain=one_domain,
                                                          first_fit=not pod.dra.domain_claim)

    def take_pod(self, pod: snapshot.Pod, allocation: placement.Allocation) -> None:
        self.take(pod.requests, allocation, ports=pod.host_ports)


def _short(requests: Mapping[str, int], free: Mapping[str, int]) -> str | None:
    """The scheduler's reasons other than GPUs and MIG slices (whose reasons say how many are free)."""
    short = [s for s in resources.shortages(requests, free)
             if not s.startswith(("Insufficient " + gpu.FULL_GPU, "Insufficient " + gpu.MIG_PREFIX))]
    return ", ".join(short) or None


def short_of(node: snapshot.Node, requests: Mapping[str, int]) -> str | None:
    """What the node lacks now for the pod's requests besides GPUs (CPU, memory, a pod slot, other extended
    resources), or None: for callers that count GPUs per NVLink domain themselves (the webhook's ranking)."""
    return _short(requests, resources.subtract(node.resources, node.requested))


def place_pod(pod: snapshot.Pod, room: Room, *, one_domain: bool = True) -> placement.Allocation | str:
    """`Room.place_pod` after the filters (`fit.why_not`, `refuses`)."""
    why = fit.why_not(pod.raw.get("spec") or {}, room.node) or refuses(pod, room.node, ports=room.ports)
    if why:
        return why
    return room.place(pod.requests, pod.request, one_domain=one_domain, first_fit=not pod.dra.domain_claim)


def score(room: Room, gpus: int, cfg: settings.Scoring, *, first_fit: bool = True) -> nvlink_score.NodeScore | None:
    """The brief's NVLink score of the node as this room leaves it, for a pod of `gpus` whole GPUs (None: it
    asks for none, or they do not fit). `first_fit`: as in `Room.place`."""
    if gpus <= 0:
        return None
    node = room.node
    return nvlink_score.score(gpus, name=node.name, free=room.domains, free_gpus=room.free_gpus,
                              gpu_count=node.gpu_count, topo=node.topology, cfg=cfg,
                              first_fit=node.device_order if first_fit else None)
