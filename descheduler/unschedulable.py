"""What kube-scheduler says a pending pod lacks: its `PodScheduled=False, Unschedulable` message, read so
that reclaim never evicts for a pod that freeing GPUs would not let run. Pure: no I/O.

kube-scheduler (pkg/scheduler/framework/types.go, `FitError.Error`, v1.37) writes
`0/<N> nodes are available: <count> <reason>, <count> <reason>, ... .` — one histogram entry per reason
over all nodes, sorted — optionally followed by ` preemption: ...` (what its own preemption found), or
`0/<N> nodes are available: <message>.` when a PreFilter plugin turned the pod away before any node was
looked at. Each node stops at its first failing Filter plugin; NodeResourcesFit reports every resource it
lacks (`Insufficient cpu`, `Insufficient nvidia.com/gpu`, `Too many pods`, ...).

On a node whose GPUs are DRA devices (a DeviceClass serving `nvidia.com/gpu` as its `extendedResourceName`,
the node's allocatable without it), NodeResourcesFit leaves the extended resource to the DynamicResources filter,
which says only `cannot allocate all claims` when the node's devices cannot serve the pod's claims
(pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go, v1.37.2 and v1.36.3). That is a GPU
shortage only for a pod all of whose claims are for GPUs (`claims_are_gpus`): the caller says so.

A pod is a reclaim demand only if the message
- names a GPU shortage (`Insufficient nvidia.com/gpu` or `Insufficient nvidia.com/mig-<profile>`, or
  `cannot allocate all claims` for a pod whose claims are all for GPUs), and
- names nothing else but the node filters reclaim's search repeats on every candidate node (taints, node
  affinity/selector, node name, unschedulable nodes: `common.fit`; required pod anti-affinity, the pod's own and
  existing pods': `descheduler.reclaim.search`): those exclude nodes, they are not shortages.
Any other reason (CPU, memory, pod count, ephemeral storage, other extended resources, ports, volumes,
pod affinity, topology spread, a PreFilter rejection...) means evicting idle GPU pods may not let
it run: not a demand. A message not in this format (another scheduler's) says nothing either way.
"""

from __future__ import annotations

import dataclasses
import re

from common import gpu

HEAD = re.compile(r"^0/(\d+) nodes are available:\s*(.*)$", re.DOTALL)
ENTRY = re.compile(r"^(\d+) (.+)$", re.DOTALL)
SPLIT = re.compile(r", (?=\d+ )")
MODELLED = (  # node filters reclaim's search checks on each candidate node itself
    "node(s) had untolerated taint",
    "node(s) had taints that the pod didn't tolerate",
    "node(s) didn't match Pod's node affinity/selector",
    "node(s) didn't match the requested node name",
    "node(s) were unschedulable",
    # InterPodAffinity (pkg/scheduler/framework/plugins/interpodaffinity/filtering.go, v1.37): the pod's own
    # required anti-affinity (`antiaffinity.occupied`) and existing pods' (`capacity.refuses`). Not its pod
    # affinity ("node(s) didn't match pod affinity rules"): a pod with one is no demand anyway.
    "node(s) didn't match pod anti-affinity rules",
    "node(s) didn't satisfy existing pods anti-affinity rules",
)
INSUFFICIENT = "Insufficient "
DRA_SHORT = "cannot allocate all claims"  # DynamicResources' Filter: the node's devices cannot serve the claims


@dataclasses.dataclass(frozen=True)
class Reading:
    gpu_short: tuple[str, ...]  # e.g. ("2 Insufficient nvidia.com/gpu",)
    other: tuple[str, ...]  # shortages and filters freeing GPUs does not cure


def _is_gpu(reason: str) -> bool:
    resource = reason.removeprefix(INSUFFICIENT).strip()
    return reason.startswith(INSUFFICIENT) and (resource == gpu.FULL_GPU or resource.startswith(gpu.MIG_PREFIX))


def read(message: str, *, claims_are_gpus: bool) -> Reading | None:
    """The scheduler's reasons, split into GPU shortages and the rest; None when not its format.
    `claims_are_gpus`: every DRA claim of the pod is for its GPUs, so `cannot allocate all claims` is a GPU
    shortage (else it is another reason)."""
    head = HEAD.match(message.strip())
    if head is None:
        return None
    filters = head.group(2).split(" preemption:")[0].strip().removesuffix(".")
    short: list[str] = []
    other: list[str] = []
    for entry in (e.strip() for e in SPLIT.split(filters) if e.strip()):
        found = ENTRY.match(entry)
        reason = found.group(2) if found else entry  # no count: a PreFilter plugin's message
        if found and (_is_gpu(reason) or (claims_are_gpus and reason == DRA_SHORT)):
            short.append(entry)
        elif not found or not reason.startswith(MODELLED):
            other.append(entry)
    return Reading(tuple(short), tuple(other))


def why_not_a_demand(message: str | None, *, claims_are_gpus: bool) -> str | None:
    """Why the pod is not a reclaim demand by its scheduler's message, or None (it is one); `claims_are_gpus`: see
    `read`."""
    reading = read(message or "", claims_are_gpus=claims_are_gpus)
    if reading is None:
        return None
    if reading.other:
        return (f"kube-scheduler reports more than a GPU shortage ({', '.join(reading.other)}): "
                "freeing GPUs would not let it run")
    if not reading.gpu_short:
        return "kube-scheduler reports no GPU shortage: freeing GPUs would not let it run"
    return None
