"""Pending work that idle GPUs could serve: reclaim demands. Pure: no I/O, no clock.

A pending GPU pod the scheduler found no room for (PodScheduled=False, Unschedulable) is a demand on its own;
a complete gated gang that waits only for GPUs is fed by the gang controller (`gang_demand`). A demand that
must not be served still comes back, with the reason it is `ignored` (recorded, never served):
- it is nominated (`status.nominatedNodeName`): kube-scheduler already preempted for it, or release nominated it and
  kube-scheduler tries that node first (it clears the field after a failed attempt; the pod is a demand then);
- it is a gang member an older release pinned to one node: release's observation reports it
  (`descheduler.release.outcomes`), and evicting for an old pin would only strand it again. A pod release
  un-gated without a pin (placed elsewhere than planned, or released unplaced) is a demand like any other: nothing
  holds it to one node;
- the one capacity model does not evaluate all of its constraints (`common.capacity.ungoverned`: required pod
  affinity, hard topology spread, resource claims...): freeing GPUs may not let it run, and kube-scheduler's
  message names only the first filter that failed on each node, so a GPU shortage there hides them. A pending
  pod's own required pod anti-affinity is evaluated (`search`, `common.antiaffinity.occupied`: it is served only
  where no pod it selects holds the topology domain), so one replica per node still gets reclaim; a gang
  member's is not (the members would have to see each other's planned places);
- its kube-scheduler message names more than a GPU shortage (`descheduler.unschedulable`). The message may only
  veto: a demand is served only on a node where the capacity model says it then runs (`search`). On DRA GPU nodes
  the shortage reads `cannot allocate all claims`; it counts as a GPU shortage only for a pod that asks no
  extended resource but `nvidia.com/gpu` and `nvidia.com/mig-<profile>` and has no claims of its own
  (`_claims_are_gpus`): its only claims are those kube-scheduler makes for its GPUs and MIG slices. A pod with
  claims of its own is not modelled here (above) yet.
A terminating pending pod is no demand at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Set
from typing import Any

from common import capacity, gangs, gpu, settings, snapshot
from descheduler import unschedulable

NEVER = "Never"
GANG = "gang:"  # prefix of gang keys, so that a gang never collides with a pod of the same name
_NAMES = settings.Names()
# What reclaim evaluates for a single pending pod beyond the capacity model (`search`): its own required anti-affinity.
EVALUATED = frozenset({"podAntiAffinity"})

@dataclasses.dataclass(frozen=True)
class Member:
    pod: str  # namespace/name
    request: gpu.GpuRequest
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # what fit.why_not reads
    requests: Mapping[str, int] = dataclasses.field(default_factory=dict)  # every resource (`Pod.requests`)


@dataclasses.dataclass(frozen=True)
class Demand:
    """A pending pod, or a whole gang that needs all its members placed at once."""

    key: str  # pod key, or "gang:" + the gang key
    members: tuple[Member, ...]
    priority: int
    preemption_policy: str
    created: str  # RFC 3339: older first among equal priorities
    gang: str | None = None
    ignored: str | None = None  # why it is no reclaim demand after all (recorded, never served)


def _unschedulable(pod: snapshot.Pod) -> Mapping[str, Any] | None:
    """The pod's PodScheduled=False condition if its reason is Unschedulable."""
    for condition in (pod.raw.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition if condition.get("reason") == "Unschedulable" else None
    return None


def _released(pod: snapshot.Pod, *, names: settings.Names) -> str | None:
    """Why release owns this pending pod (a gang member an older release pinned), or None."""
    pinned = snapshot.pinned_node(pod.raw)
    if pinned and gangs.identify(pod.raw, names=names) is not None:
        return f"gang member pinned to {pinned} at release and not bound: release reports it"
    return None


def _unevaluated(pods: Sequence[snapshot.Pod], *, evaluated: Set[str] = frozenset()) -> str | None:
    """Why the capacity model cannot say where these pods would run, or None (`evaluated`: see `EVALUATED`)."""
    for pod in pods:
        why = capacity.ungoverned(pod.raw.get("spec") or {}, evaluated=evaluated)
        if why:
            return f"{pod.key} has constraints the capacity model does not evaluate ({why}): freeing GPUs may not " \
                   "let it run"
    return None


def _ignored(pod: snapshot.Pod, condition: Mapping[str, Any], *, names: settings.Names) -> str | None:
    nominated = (pod.raw.get("status") or {}).get("nominatedNodeName")
    if nominated:
        return f"nominated to {nominated} (status.nominatedNodeName): kube-scheduler tries that node first"
    why = _released(pod, names=names) or _unevaluated([pod], evaluated=EVALUATED)
    if why:
        return why
    if pod.scheduler_name != gangs.DEFAULT_SCHEDULER:
        return None  # another scheduler's message says nothing we can read
    return unschedulable.why_not_a_demand(condition.get("message"), claims_are_gpus=_claims_are_gpus(pod))


def _claims_are_gpus(pod: snapshot.Pod) -> bool:
    """Every DRA claim kube-scheduler allocates for the pod is for its GPUs: it asks no extended resource but whole
    GPUs and MIG slices (any other could be served by a DRA class as well; one a GPU class serves under another
    name is counted as one of these in `requests`). A pod with claims of its own never gets here: they are not
    modelled (`_unevaluated`, checked first)."""
    return all("/" not in name or name == gpu.FULL_GPU or name.startswith(gpu.MIG_PREFIX) for name in pod.requests)


def demands_from_snapshot(cluster: snapshot.Snapshot, *, names: settings.Names = _NAMES) -> list[Demand]:
    """Pending GPU pods the scheduler found no room for (PodScheduled=False, Unschedulable), each alone,
    not terminating; those not to be served (see the module) come with the reason they are `ignored`.

    Gated gangs are not here: the gang controller knows when one is complete and waits only for GPUs
    and feeds it through `gang_demand()`.
    """
    out = []
    for pod in cluster.pods.values():
        if pod.node_name or pod.deleting or pod.phase != "Pending" or not pod.request.any or pod.scheduling_gates:
            continue
        condition = _unschedulable(pod)
        if condition is not None:
            out.append(_demand(pod.key, [pod], gang=None, ignored=_ignored(pod, condition, names=names)))
    return out


def gang_demand(gang: str, members: Sequence[snapshot.Pod]) -> Demand:
    """A complete gang waiting for GPUs: all `members` (its unplaced pods) must be placed together.
    It is only as strong as its weakest member: the lowest priority; Never if any member says so. Ignored if
    the capacity model does not evaluate some member's constraints."""
    return _demand(f"{GANG}{gang}", members, gang=gang, ignored=_unevaluated(members))


def _demand(key: str, pods: Sequence[snapshot.Pod], *, gang: str | None, ignored: str | None = None) -> Demand:
    return Demand(
        key=key,
        members=tuple(Member(p.key, p.request, p.raw.get("spec") or {}, p.requests) for p in pods),
        priority=min(p.priority for p in pods),
        preemption_policy=NEVER if any(p.preemption_policy == NEVER for p in pods) else "PreemptLowerPriority",
        created=min(p.created for p in pods),
        gang=gang,
        ignored=ignored,
    )

