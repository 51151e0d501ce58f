"""Victim units: an idle pod alone, or a gang reclaimed only as a whole. Pure: no I/O, no clock.

A gang member is a victim only with every running member of its gang, and only if all of them passed
screening. Running members that request no GPU (an MPI launcher) go with their gang: screened by the
protections only (their idleness and class policy say nothing about GPUs, the GPU members' do), evicted
after its GPU members, never a victim alone or for a gang of no GPU members. A native PodGroup with
`disruptionMode: single` is no unit: its pods go alone; `all` keeps them together.

A unit is only as weak as its strongest member: a preemptor needs at least the highest of its members'
minimum-preemptable priorities.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Mapping

from common import gangs, settings, snapshot
from descheduler import limits, policy, protections
from descheduler.reclaim import pending, utilisation

SINGLE, ALL = "single", "all"  # a native PodGroup's `spec.disruptionMode` (scheduling.k8s.io/v1beta1)

@dataclasses.dataclass(frozen=True)
class Candidate:
    pod: snapshot.Pod
    policy: policy.ReclaimPolicy
    assessment: utilisation.Assessment


@dataclasses.dataclass(frozen=True)
class Unit:
    key: str
    candidates: tuple[Candidate, ...]  # the pods holding GPUs: what the unit frees
    companions: tuple[snapshot.Pod, ...] = ()  # gang members without GPUs, evicted with it

    # Read for every node and demand of a cycle: computed once (units are immutable).
    @functools.cached_property
    def minimum_preemptable(self) -> int:
        return max(c.policy.minimum_for(c.pod.priority) for c in self.candidates)

    @functools.cached_property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @functools.cached_property
    def pods(self) -> tuple[snapshot.Pod, ...]:
        return tuple(c.pod for c in self.candidates) + self.companions

    @functools.cached_property
    def _by_node(self) -> dict[str, tuple[snapshot.Pod, ...]]:
        out: dict[str, list[snapshot.Pod]] = collections.defaultdict(list)
        for candidate in self.candidates:
            out[candidate.pod.node_name or ""].append(candidate.pod)
        return {node: tuple(pods) for node, pods in out.items()}

    def on(self, node: str) -> tuple[snapshot.Pod, ...]:
        return self._by_node.get(node, ())

    def slots(self) -> list[limits.Slot]:
        """Every eviction the unit makes, companions included; limits count the unit once where it is."""
        return [(self.key, p.namespace, p.node_name or "") for p in self.pods]


def nodes_of(unit: Unit) -> set[str]:
    return {c.pod.node_name or "" for c in unit.candidates}


def build(
    cluster: snapshot.Snapshot,
    candidates: Mapping[str, Candidate],
    spared: dict[str, str],
    *,
    config: settings.Settings,
    pod_groups: Mapping[str, str],
) -> list[Unit]:
    """Single pods, and gangs whose every running GPU member is a candidate and none of whose running
    members without GPUs is protected; those go with their gang (a gang holding no GPU is no unit)."""
    singles: list[Unit] = []
    gang_members: dict[str, list[snapshot.Pod]] = collections.defaultdict(list)
    for pod in cluster.pods.values():
        gang = _reclaimed_with(pod, cluster=cluster, config=config, pod_groups=pod_groups) if pod.bound else None
        if gang is not None:
            gang_members[gang].append(pod)
        elif pod.key in candidates:
            singles.append(Unit(pod.key, (candidates[pod.key],)))
    units = singles
    for gang_key, unsorted in gang_members.items():
        members = sorted(unsorted, key=lambda p: p.key)
        blockers = [(p.key, why) for p in members
                    if (why := _blocks(p, candidates=candidates, spared=spared, cluster=cluster, config=config))]
        if blockers:
            blocker, why = blockers[0]
            said = f"gang {gang_key} is reclaimed only as a whole: {blocker} is not reclaimable ({why})"
            spared.update({p.key: said for p in members if p.key in candidates})
            continue
        held = tuple(candidates[p.key] for p in members if p.request.any)
        if held:
            units.append(Unit(f"{pending.GANG}{gang_key}", held, tuple(p for p in members if not p.request.any)))
    return sorted(units, key=lambda u: u.key)


def _blocks(
    pod: snapshot.Pod, *, candidates: Mapping[str, Candidate], spared: Mapping[str, str],
    cluster: snapshot.Snapshot, config: settings.Settings,
) -> str | None:
    """Why this running gang member keeps its whole gang from being reclaimed, or None."""
    if pod.request.any:
        return None if pod.key in candidates else spared.get(pod.key, "not screened")
    return protections.why_protected(pod, node=cluster.nodes.get(pod.node_name or ""), names=config.names,
                                     conventions=config.descheduler.reclaim.conventions)


def disruption_modes(cluster: snapshot.Snapshot) -> dict[str, str]:
    """The native PodGroups' `spec.disruptionMode` the snapshot knows, by "namespace/name"."""
    return {key: group.disruption for key, group in cluster.pod_groups.items() if group.disruption}


def _reclaimed_with(pod: snapshot.Pod, *, cluster: snapshot.Snapshot, config: settings.Settings,
                    pod_groups: Mapping[str, str]) -> str | None:
    """The gang the pod is reclaimed with (None: alone). A native PodGroup's `disruptionMode` decides first:
    `all` keeps its pods together whatever its scheduling policy, `single` lets them go one by one; else
    the gang conventions (`gangs.identify`: a PodGroup the snapshot does not know counts as a gang)."""
    group = ((pod.raw.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
    mode = pod_groups.get(f"{pod.namespace}/{group}") if group else None
    if mode == ALL:
        return f"{pod.namespace}/{group}"
    if mode == SINGLE:
        return None
    gang = gangs.identify(pod.raw, names=config.names, pod_groups=cluster.pod_groups)
    return gang.key if gang else None


def whole(unit: str) -> str:
    return f"; spares the whole gang {unit.removeprefix(pending.GANG)}" if unit.startswith(pending.GANG) else ""


def spare(unit: Unit, reason: str, spared: dict[str, str]) -> None:
    for candidate in unit.candidates:
        spared[candidate.pod.key] = f"idle but spared: {reason}{whole(unit.key)}"
