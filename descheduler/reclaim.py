"""The idle-GPU reclaim planner: which idle pods to evict, for whom, and why — a pure function.

Inputs are plain data: the cluster `Snapshot`, each PriorityClass's `ReclaimPolicy`, each pod's
utilisation `Assessment`, the pending `Demand`s (pods, or whole gangs fed by the gang controller),
the cooldown `State`, the settings and `now`. The output is a `Plan`: evictions and spared pods,
each with its reason, plus what each demand got. No I/O, no clock.

Rules, in order:
1. Screening: protections (never DaemonSet, mirror, system-critical, terminating, opted-out pods or
   nodes reconfiguring MIG) and the operators' conventions (bare pods, local storage, safe-to-evict,
   do-not-disrupt: `protections`), a reclaimable class policy, scheduled for longer than both toleration
   and idle window, idle by its assessment (fail closed), no workload or node cooldown, not already
   leaving (evicted by us in an earlier cycle).
2. Gangs are units: a gang member is a victim only with every running member of its gang, and only
   if all of them passed screening. Running members that request no GPU (an MPI launcher) go with
   their gang: screened by the protections only (their idleness and class policy say nothing about
   GPUs, the GPU members' do), evicted after its GPU members, never a victim alone or for a gang of
   no GPU members. A native PodGroup with `disruptionMode: single` is no unit: its pods go alone.
3. on-demand: demands by priority (desc) then age; a demand takes nothing if kube-scheduler's message
   or nomination rules it out (`Demand.ignored`), it is cooling down, has preemptionPolicy Never, or
   already fits somewhere — counting pods already leaving as gone (terminating ones for anyone, those we
   evicted for a pending demand for that demand only). Each member (largest first) goes to the node
   whose minimal victim set is cheapest; all members must be placed or the demand takes nothing.
   A victim unit qualifies if the demand's priority >= its minimum-preemptable-priority and it frees
   what the member needs: the same MIG profile for MIG members; full GPUs on a node without MIG
   partitions for full-GPU members. Whether the member then fits is the one capacity model's answer
   (`common.capacity.Room`): GPUs in one NVLink domain when the node's topology is known, CPU, memory,
   pod slots and every other resource on that node. Minimal set: units by GPUs (desc) then priority
   (asc) until it fits, then drop any unit not needed (highest priority first). Exact, without a search
   of every node: nodes that cannot hold the member even with every eligible unit evicted are screened
   out (by count, then the capacity model), the rest are searched by a lower bound of their cost;
   untouched nodes are screened once per cycle for each kind of member.
   always: every idle unit is evicted, no preemptor needed.
4. Limits (per cycle, per node, per namespace) count decisions (`limits`: a gang once); a unit that
   would cross one is spared with the limit as its reason, which names the gang it spares.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from common import capacity, fit, gangs, gpu, placement, settings, snapshot, timestamps
from descheduler import cooldowns, limits, policy, protections, unschedulable, utilisation

NEVER = "Never"
MAX_REASONS = 3  # why a demand cannot be served: the first few nodes' reasons
GANG = "gang:"  # prefix of gang keys, so that a gang never collides with a pod of the same name
SINGLE, ALL = "single", "all"  # a native PodGroup's `spec.disruptionMode` (scheduling.k8s.io/v1beta1)


# --- Demand: what pending work needs --------------------------------------------------------------


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


def _ignored(pod: snapshot.Pod, condition: Mapping[str, Any]) -> str | None:
    nominated = (pod.raw.get("status") or {}).get("nominatedNodeName")
    if nominated:
        return f"kube-scheduler already preempted for it on {nominated} (status.nominatedNodeName)"
    if pod.scheduler_name != gangs.DEFAULT_SCHEDULER:
        return None  # another scheduler's message says nothing we can read
    return unschedulable.why_not_a_demand(condition.get("message"))


def demands_from_snapshot(cluster: snapshot.Snapshot) -> list[Demand]:
    """Pending GPU pods the scheduler found no room for (PodScheduled=False, Unschedulable), each alone.
    Those it already preempted for (`status.nominatedNodeName`), or whose kube-scheduler message names
    more than a GPU shortage (`descheduler.unschedulable`), come with the reason they are `ignored`.

    Gated gangs are not here: the gang controller knows when one is complete and waits only for GPUs
    and feeds it through `gang_demand()`.
    """
    out = []
    for pod in cluster.pods.values():
        if pod.node_name or pod.deleting or pod.phase != "Pending" or not pod.request.any or pod.scheduling_gates:
            continue
        condition = _unschedulable(pod)
        if condition is not None:
            out.append(_demand(pod.key, [pod], gang=None, ignored=_ignored(pod, condition)))
    return out


def gang_demand(gang: str, members: Sequence[snapshot.Pod]) -> Demand:
    """A complete gang waiting for GPUs: all `members` (its unplaced pods) must be placed together.
    It is only as strong as its weakest member: the lowest priority; Never if any member says so."""
    return _demand(f"{GANG}{gang}", members, gang=gang)


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


# --- Plan: the result -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Eviction:
    pod: str
    uid: str
    node: str
    unit: str  # pod key, or "gang:" + the gang key: members are evicted together or not at all
    preemptor: str | None  # None in mode "always"
    preemptor_priority: int | None
    utilization: float | None  # None: a gang member without GPUs (evicted with its gang, not measured)
    threshold: float | None
    window_seconds: int | None
    workload: str | None  # cooldown key of the pod's controller
    reason: str

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]


@dataclasses.dataclass(frozen=True)
class Spared:
    pod: str
    reason: str


@dataclasses.dataclass(frozen=True)
class DemandOutcome:
    demand: str
    members: tuple[str, ...]
    priority: int
    served: bool  # victims were chosen for it
    reason: str
    victims: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
    evictions: tuple[Eviction, ...]
    spared: tuple[Spared, ...]
    demands: tuple[DemandOutcome, ...]
    candidates: int  # pods that passed screening (idle and allowed)
    idle_gpus: int  # GPUs and MIG slices those pods hold

    def as_json(self) -> dict[str, Any]:
        return {
            "evictions": [
                {"pod": e.pod, "node": e.node, "preemptor": e.preemptor, "utilization": e.utilization,
                 "threshold": e.threshold, "window_seconds": e.window_seconds, "reason": e.reason}
                for e in self.evictions
            ],
            "spared": [{"pod": s.pod, "reason": s.reason} for s in self.spared],
        }


# --- Screening ------------------------------------------------------------------------------------


def scheduled_at(pod: snapshot.Pod) -> float | None:
    status = pod.raw.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return timestamps.epoch(condition.get("lastTransitionTime")) or timestamps.epoch(status.get("startTime"))
    return timestamps.epoch(status.get("startTime")) or timestamps.epoch(pod.created)


def screen(
    pod: snapshot.Pod,
    *,
    cluster: snapshot.Snapshot,
    policies: Mapping[str, policy.ReclaimPolicy],
    state: cooldowns.State,
    config: settings.Settings,
    now: float,
) -> policy.ReclaimPolicy | str:
    """Everything but utilisation: the pod's policy if it may be reclaimed once idle, else why not."""
    node = cluster.nodes.get(pod.node_name or "")
    reason = protections.why_protected(pod, node=node, names=config.names,
                                       conventions=config.descheduler.reclaim.conventions)
    if reason:
        return reason
    found = policy.for_pod(pod, policies)
    if isinstance(found, str):
        return found
    if not found.reclaimable or found.idle_seconds is None:
        return found.reason
    since = scheduled_at(pod)
    needed = max(found.toleration_seconds, found.idle_seconds)
    if since is None or now - since <= needed:
        age = "unknown" if since is None else f"{now - since:.0f}s"
        return f"scheduled {age} ago, needs more than {needed}s (toleration and idle window)"
    for key, what in ((cooldowns.workload_key(pod), "workload"), (cooldowns.node_key(pod.node_name or ""), "node")):
        until = state.active(key, now=now)
        if until is not None:
            return f"{what} cooldown for {until - now:.0f}s more"
    return found


Screened = Mapping[str, "policy.ReclaimPolicy | str"]  # pod key -> `screen()` of the pod


def screen_all(
    cluster: snapshot.Snapshot,
    *,
    policies: Mapping[str, policy.ReclaimPolicy],
    state: cooldowns.State,
    config: settings.Settings,
    now: float,
) -> dict[str, policy.ReclaimPolicy | str]:
    """`screen()` of every pod holding GPUs: once per cycle, for `windows_needed()` and `plan()`."""
    return {pod.key: screen(pod, cluster=cluster, policies=policies, state=state, config=config, now=now)
            for pod in cluster.pods.values() if pod.holds_gpus}


def windows_needed(screened: Screened) -> dict[int, list[str]]:
    """Idle window -> pods to measure over it: the shell queries Prometheus once per window."""
    out: dict[int, list[str]] = collections.defaultdict(list)
    for key, found in screened.items():
        if not isinstance(found, str) and found.idle_seconds is not None:
            out[found.idle_seconds].append(key)
    return dict(out)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    pod: snapshot.Pod
    policy: policy.ReclaimPolicy
    assessment: utilisation.Assessment


@dataclasses.dataclass(frozen=True)
class _Unit:
    key: str
    candidates: tuple[_Candidate, ...]  # the pods holding GPUs: what the unit frees
    companions: tuple[snapshot.Pod, ...] = ()  # gang members without GPUs, evicted with it

    # Read for every node and demand of a cycle: computed once (units are immutable).
    @functools.cached_property
    def minimum_preemptable(self) -> int:
        return max(c.policy.minimum_preemptable_priority for c in self.candidates)

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


# --- Node arithmetic ------------------------------------------------------------------------------


@dataclasses.dataclass
class _NodeState:
    """What planned evictions free and planned placements take on one node."""

    freed: set[str] = dataclasses.field(default_factory=set)  # pod keys
    taken: list[tuple[Mapping[str, int], placement.Allocation]] = dataclasses.field(default_factory=list)

    def copy(self) -> _NodeState:
        return _NodeState(set(self.freed), list(self.taken))


def _room(node: snapshot.Node, cluster: snapshot.Snapshot, state: _NodeState,
          extra_freed: Set[str] = frozenset()) -> capacity.Room:
    """The node's room in the one capacity model once the freed pods are gone, less what earlier members
    of this plan took: every resource (CPU, memory, pod slots...), GPUs per NVLink domain, MIG slices."""
    room = capacity.Room.of(node, cluster=cluster, leaving=state.freed | extra_freed)
    for requests, allocation in state.taken:
        room.take(requests, allocation)
    return room


def _helps(unit: _Unit, node: str, request: gpu.GpuRequest) -> bool:
    pods = unit.on(node)
    if request.full:
        return any(p.request.full for p in pods)
    return any(p.request.mig.get(profile) for p in pods for profile in request.mig)


def _gpus(unit: _Unit, node: str) -> int:
    return sum(p.request.full + sum(p.request.mig.values()) for p in unit.on(node))


@dataclasses.dataclass(frozen=True)
class _Choice:
    node: str
    units: tuple[_Unit, ...]
    allocation: placement.Allocation

    def cost(self) -> tuple[int, int, int, str]:
        gpus = sum(_gpus(u, self.node) for u in self.units)
        pods = sum(len(u.pods) for u in self.units)
        return (gpus, pods, max((u.priority for u in self.units), default=0), self.node)


def _minimal_set(
    node: snapshot.Node,
    member: Member,
    eligible: Sequence[_Unit],
    cluster: snapshot.Snapshot,
    state: _NodeState,
) -> _Choice | str:
    def attempt(units: Iterable[_Unit]) -> placement.Allocation | str:
        freed = {c.pod.key for u in units for c in u.candidates}
        return _room(node, cluster, state, freed).place(member.requests, member.request)

    ordered = sorted(eligible, key=lambda u: (-_gpus(u, node.name), u.priority, u.key))
    taken: list[_Unit] = []
    result = attempt(taken)
    for unit in ordered:
        if not isinstance(result, str):
            break
        taken.append(unit)
        result = attempt(taken)
    if isinstance(result, str):
        return f"{node.name}: {result} even after evicting every eligible idle pod"
    for unit in sorted(taken, key=lambda u: (-u.priority, _gpus(u, node.name), u.key)):
        rest = [u for u in taken if u is not unit]
        trial = attempt(rest)
        if not isinstance(trial, str):
            taken, result = rest, trial
    return _Choice(node.name, tuple(taken), result)


# --- The planner ----------------------------------------------------------------------------------


def plan(
    *,
    cluster: snapshot.Snapshot,
    policies: Mapping[str, policy.ReclaimPolicy],
    assessments: Mapping[str, utilisation.Assessment],
    demands: Sequence[Demand],
    state: cooldowns.State,
    config: settings.Settings,
    now: float,
    screened: Screened | None = None,
    leaving: Mapping[str, str | None] | None = None,
    pod_groups: Mapping[str, str] | None = None,
) -> Plan:
    """`screened`: `screen_all()` of these same inputs, when the caller has it already.
    `leaving`: pods the loop evicted in its last cycles -> the demand they were evicted for (None: mode
    always), whether or not the snapshot shows them terminating yet. They are never victims again, and
    their GPUs are that demand's while it is pending (as kube-scheduler nominates a preemptor): it fits
    there and takes nothing more. Terminating pods, and those evicted for no pending demand, free their
    GPUs for the first demand that fits. `pod_groups`: native PodGroups' `spec.disruptionMode` by
    "namespace/name" (`single` or `all`); default: as the snapshot's PodGroups say (`disruption_modes`)."""
    reclaim = config.descheduler.reclaim
    leaving = leaving or {}
    if screened is None:
        screened = screen_all(cluster, policies=policies, state=state, config=config, now=now)
    spared: dict[str, str] = {}
    candidates: dict[str, _Candidate] = {}
    for key in sorted(screened):
        pod, found = cluster.pods[key], screened[key]
        if key in leaving:
            found = f"already leaving: {_evicted_for(leaving[key])}"
        if isinstance(found, str):
            spared[pod.key] = found
            continue
        assessment = assessments.get(pod.key) or utilisation.failed("no utilisation reading this cycle")
        if not assessment.idle:
            spared[pod.key] = f"not idle: {assessment.reason}"
            continue
        candidates[pod.key] = _Candidate(pod, found, assessment)

    modes = disruption_modes(cluster) if pod_groups is None else pod_groups
    units = _units(cluster, candidates, spared, config=config, pod_groups=modes)
    for unit in units:
        for candidate in unit.candidates:
            spared[candidate.pod.key] = f"idle ({candidate.assessment.reason}) but no pending pod can use its GPUs"

    budget = limits.Budget(reclaim.limits)
    evictions: list[Eviction] = []
    outcomes: list[DemandOutcome] = []
    if reclaim.mode == "always":
        for unit in sorted(units, key=lambda u: (u.priority, -sum(_gpus(u, n) for n in _nodes(u)), u.key)):
            refused = budget.refuse(unit.slots())
            if refused:
                _spare(unit, refused, spared)
                continue
            budget.charge(unit.slots())
            evictions += _evict(unit, None, "mode always, no preemptor needed", spared)
    else:
        evictions, outcomes = _on_demand(cluster=cluster, units=units, demands=demands, state=state, budget=budget,
                                         spared=spared, leaving=_leaving(cluster, leaving, demands), now=now)
    return Plan(
        evictions=tuple(evictions),
        spared=tuple(Spared(k, v) for k, v in sorted(spared.items())),
        demands=tuple(outcomes),
        candidates=len(candidates),
        idle_gpus=sum(c.pod.request.full + sum(c.pod.request.mig.values()) for c in candidates.values()),
    )


def _evicted_for(demand: str | None) -> str:
    return f"evicted for {demand}" if demand else "evicted (mode always)"


Leaving = Mapping[str | None, Mapping[str, Mapping[str, str]]]  # demand (None: anyone) -> node -> pod -> why


def _leaving(cluster: snapshot.Snapshot, evicted: Mapping[str, str | None], demands: Sequence[Demand]) -> Leaving:
    """Whose GPUs pods already leaving free: the pending demand they were evicted for, else anyone's."""
    pending = {d.key for d in demands}
    out: dict[str | None, dict[str, dict[str, str]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    for pod in cluster.pods.values():
        if not pod.holds_gpus or not (pod.deleting or pod.key in evicted):
            continue
        demand = evicted.get(pod.key)
        why = _evicted_for(demand) if pod.key in evicted else "terminating"
        out[demand if demand in pending else None][pod.node_name or ""][pod.key] = why
    return out


def _nodes(unit: _Unit) -> set[str]:
    return {c.pod.node_name or "" for c in unit.candidates}


def _units(
    cluster: snapshot.Snapshot,
    candidates: Mapping[str, _Candidate],
    spared: dict[str, str],
    *,
    config: settings.Settings,
    pod_groups: Mapping[str, str],
) -> list[_Unit]:
    """Single pods, and gangs whose every running GPU member is a candidate and none of whose running
    members without GPUs is protected; those go with their gang (a gang holding no GPU is no unit)."""
    singles: list[_Unit] = []
    gang_members: dict[str, list[snapshot.Pod]] = collections.defaultdict(list)
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        gang = _reclaimed_with(pod, cluster=cluster, config=config, pod_groups=pod_groups) if pod.bound else None
        if gang is not None:
            gang_members[gang].append(pod)
        elif pod.key in candidates:
            singles.append(_Unit(pod.key, (candidates[pod.key],)))
    units = singles
    for gang_key, members in gang_members.items():
        blockers = [(p.key, why) for p in members
                    if (why := _blocks(p, candidates=candidates, spared=spared, cluster=cluster, config=config))]
        if blockers:
            blocker, why = blockers[0]
            whole = f"gang {gang_key} is reclaimed only as a whole: {blocker} is not reclaimable ({why})"
            spared.update({p.key: whole for p in members if p.key in candidates})
            continue
        held = tuple(candidates[p.key] for p in members if p.request.any)
        if held:
            units.append(_Unit(f"{GANG}{gang_key}", held, tuple(p for p in members if not p.request.any)))
    return sorted(units, key=lambda u: u.key)


def _blocks(
    pod: snapshot.Pod, *, candidates: Mapping[str, _Candidate], spared: Mapping[str, str],
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


def _whole(unit: str) -> str:
    return f"; spares the whole gang {unit.removeprefix(GANG)}" if unit.startswith(GANG) else ""


def _spare(unit: _Unit, reason: str, spared: dict[str, str]) -> None:
    for candidate in unit.candidates:
        spared[candidate.pod.key] = f"idle but spared: {reason}{_whole(unit.key)}"


def _evict(unit: _Unit, demand: Demand | None, why: str, spared: dict[str, str]) -> list[Eviction]:
    gang = f"; with its gang {unit.key.removeprefix(GANG)}" if unit.key.startswith(GANG) else ""

    def eviction(pod: snapshot.Pod, measured: _Candidate | None) -> Eviction:
        spared.pop(pod.key, None)
        said = measured.assessment.reason if measured else "requests no GPU, goes with its gang's idle GPU members"
        return Eviction(
            pod=pod.key,
            uid=pod.uid,
            node=pod.node_name or "",
            unit=unit.key,
            preemptor=demand.key if demand else None,
            preemptor_priority=demand.priority if demand else None,
            utilization=round(measured.assessment.utilisation or 0.0, 3) if measured else None,
            threshold=measured.policy.threshold_percent if measured else None,
            window_seconds=(measured.policy.idle_seconds or 0) if measured else None,
            workload=cooldowns.workload_key(pod),
            reason=f"{said}; {why}{gang}",
        )

    # GPU members first: the evictor stops a unit at its first member not evicted (a PodDisruptionBudget),
    # and evicting a pod that frees no GPU after that would only add damage.
    return [eviction(c.pod, c) for c in unit.candidates] + [eviction(p, None) for p in unit.companions]


def _on_demand(
    *,
    cluster: snapshot.Snapshot,
    units: Sequence[_Unit],
    demands: Sequence[Demand],
    state: cooldowns.State,
    budget: limits.Budget,
    spared: dict[str, str],
    leaving: Leaving,
    now: float,
) -> tuple[list[Eviction], list[DemandOutcome]]:
    by_node: dict[str, list[_Unit]] = collections.defaultdict(list)
    for unit in units:
        for node in _nodes(unit):
            by_node[node].append(unit)
    index = _Index(cluster, by_node)
    taken: set[str] = set()
    # Pods already leaving free their GPUs for their demand, else the first that fits: one eviction, one demand.
    nodes: dict[str, _NodeState] = collections.defaultdict(_NodeState)
    for name, pods in leaving.get(None, {}).items():
        nodes[name].freed |= set(pods)
    evictions: list[Eviction] = []
    outcomes: list[DemandOutcome] = []
    for demand in sorted(demands, key=lambda d: (-d.priority, d.created, d.key)):
        members = tuple(m.pod for m in demand.members)

        def outcome(served: bool, reason: str, victims: tuple[str, ...] = (), *,
                    d: Demand = demand, m: tuple[str, ...] = members) -> DemandOutcome:
            return DemandOutcome(d.key, m, d.priority, served, reason, victims)

        until = state.active(cooldowns.preemptor_key(demand.key), now=now)
        if until is not None:
            outcomes.append(outcome(False, f"preemptor cooldown for {until - now:.0f}s more"))
            continue
        if demand.ignored:
            outcomes.append(outcome(False, demand.ignored))
            continue
        if demand.preemption_policy == NEVER:
            outcomes.append(outcome(False, "preemptionPolicy Never: takes no GPUs from others"))
            continue
        trial = {name: s.copy() for name, s in nodes.items()}
        reserved = leaving.get(demand.key, {})
        for name, pods in reserved.items():
            trial.setdefault(name, _NodeState()).freed |= set(pods)
        chosen: list[tuple[Member, _Choice]] = []
        trial_taken = set(taken)
        failure = None
        ordered = sorted(demand.members, key=lambda m: (-m.request.full, -sum(m.request.mig.values()), m.pod))
        for member in ordered:
            best = _best_node(index, member, demand, trial, trial_taken, budget, spared)
            if isinstance(best, str):
                failure = f"{member.pod}: {best}"
                break
            node_state = trial.setdefault(best.node, _NodeState())
            node_state.freed |= {c.pod.key for u in best.units for c in u.candidates}
            node_state.taken.append((member.requests, best.allocation))
            trial_taken |= {u.key for u in best.units}
            chosen.append((member, best))
        if failure is not None:
            outcomes.append(outcome(False, f"no node can hold it: {failure}"))
            continue
        victims = [u for _, c in chosen for u in c.units]
        where = ", ".join(sorted({c.node for _, c in chosen}))
        if not victims:
            here = [{**leaving.get(None, {}).get(c.node, {}), **reserved.get(c.node, {})} for _, c in chosen]
            going = sorted({f"{k} ({why})" for pods in here for k, why in pods.items()})
            said = (f"fits on {where} once the pods already leaving there are gone: {', '.join(going)}; "
                    "no new eviction") if going else f"fits without evictions on {where}; left to the scheduler"
            outcomes.append(outcome(False, said))
            nodes.update(trial)
            continue
        refused = budget.refuse(s for u in victims for s in u.slots())
        if refused:
            outcomes.append(outcome(False, refused))
            for unit in victims:
                _spare(unit, refused, spared)
            continue
        budget.charge(s for u in victims for s in u.slots())
        nodes.update(trial)
        taken = trial_taken
        why = f"reclaimed for {demand.key} (priority {demand.priority})"
        made = [e for u in victims for e in _evict(u, demand, why, spared)]
        evictions += made
        outcomes.append(outcome(True, f"{len(made)} idle pod(s) evicted on {where}", tuple(e.pod for e in made)))
    return evictions, outcomes


def _short(
    name: str, request: gpu.GpuRequest, idle_here: Sequence[_Unit], present: Sequence[_Unit],
    allowed: Sequence[_Unit],
) -> str:
    if not present:
        return f"{name}: its idle pods free no {request.describe()}"
    if not allowed:
        floor = min(u.minimum_preemptable for u in present)
        return f"{name}: its {len(present)} idle pod(s) need a preemptor priority >= {floor}"
    return f"{name}: needs {request.describe()}, more than is free even after evicting every eligible idle pod"


@dataclasses.dataclass(frozen=True, order=True)
class _Option:
    """A node that holds the member once all of `units` are evicted, with a lower bound of the cost of
    its minimal victim set (`_Choice.cost()`, node name last): nodes are searched cheapest bound first."""

    bound: tuple[int, int, int, str]
    units: tuple[_Unit, ...] = dataclasses.field(compare=False)
    free: Mapping[str, int] = dataclasses.field(compare=False)  # free devices by kind, before evictions

    @property
    def node(self) -> str:
        return self.bound[3]


def _needs(request: gpu.GpuRequest) -> dict[str, int]:
    """Devices the member needs by kind: "" for full GPUs, else the MIG profile."""
    needs = {"": request.full} if request.full else {}
    needs.update({profile: count for profile, count in request.mig.items() if count})
    return needs


def _option(
    node: snapshot.Node, member: Member, units: Sequence[_Unit], free: Mapping[str, int],
    cluster: snapshot.Snapshot, state: _NodeState,
) -> _Option | str | None:
    """The node's option if evicting all of `units` lets the member fit; else why not (None: too few
    devices by count). Bound: any victim set frees at least each kind's shortfall in GPUs, needs at
    least the fewest units covering it, and so evicts at least the that-many-th lowest priority.
    Counts suffice for the bound; the exact check is the capacity model's (NVLink domains and actual
    indices, CPU, memory, pod slots and every other resource on this node)."""
    request = member.request
    short = fewest = 0
    for kind, need in _needs(request).items():
        deficit = need - free.get(kind, 0)
        if deficit <= 0:
            continue
        gains = sorted((sum(p.request.mig.get(kind, 0) if kind else p.request.full for p in u.on(node.name))
                        for u in units), reverse=True)
        covered = list(itertools.accumulate(gains))  # by the 1, 2, ... most freeing units
        if not covered or covered[-1] < deficit:
            return None
        short, fewest = short + deficit, max(fewest, bisect.bisect_left(covered, deficit) + 1)
    freed = {p.key for u in units for p in u.on(node.name)}
    placed = _room(node, cluster, state, freed).place(member.requests, request)
    if isinstance(placed, str):
        return f"{node.name}: {placed} even after evicting every eligible idle pod"
    # No shortfall: the empty set costs (0, 0, 0) and any other at least one GPU more.
    floor = sorted(u.priority for u in units)[fewest - 1] if fewest else 0
    return _Option((short, fewest, floor, node.name), tuple(units), free)


def _screen(
    index: _Index, name: str, member: Member, priority: int, *,
    state: _NodeState | None = None, taken: Set[str] = frozenset(),
) -> _Option | str | None:
    """The node's option for a member of `priority`, or why it cannot hold it (None: nothing to say).
    `state` None: a node no demand of this cycle has touched, read straight from the snapshot."""
    request = member.request
    node = index.cluster.nodes[name]
    if request.full and node.allocatable.mig:
        return f"{name}: partitioned by MIG, a full-GPU pod needs a node without MIG slices"
    idle_here = [u for u in index.by_node.get(name, ()) if u.key not in taken]
    present = [u for u in idle_here if _helps(u, name, request)]
    allowed = [u for u in present if priority >= u.minimum_preemptable]
    state = state or _NodeState()
    room = _room(node, index.cluster, state)
    free = {"": room.free_gpus, **{p: room.free.get(gpu.MIG_PREFIX + p, 0) for p in request.mig}}
    found = _option(node, member, allowed, free, index.cluster, state)
    if found is None and idle_here:
        return _short(name, request, idle_here, present, allowed)
    return found


class _Index:
    """Per-plan precomputation: idle units by node and each unit's nodes, where idle units free each
    kind of device, the nodes a member's tolerations, nodeSelector and required node affinity allow,
    and the options of untouched nodes for each kind of member."""

    def __init__(self, cluster: snapshot.Snapshot, by_node: Mapping[str, Sequence[_Unit]]) -> None:
        self.cluster = cluster
        self.by_node = by_node
        self.unit_nodes = {u.key: _nodes(u) for units in by_node.values() for u in units}
        self._freeing: dict[str, set[str]] = collections.defaultdict(set)  # kind (see `_needs`) -> nodes
        for name, units in by_node.items():
            for pod in (p for u in units for p in u.on(name)):
                for kind in _needs(pod.request):
                    self._freeing[kind].add(name)
        # Priorities between two of these floors let the same units go: they share screenings.
        self._floors = sorted({u.minimum_preemptable for units in by_node.values() for u in units})
        self._fits: dict[tuple[Any, ...], list[str]] = {}
        self._untouched: dict[tuple[Any, ...], list[_Option]] = {}

    def nodes_for(self, spec: Mapping[str, Any]) -> list[str]:
        """Nodes passing `fit.why_not`, cached per `fit.key` (uncached for a spec without one)."""
        key = fit.key(spec)
        found = self._fits.get(key) if key is not None else None
        if found is None:
            found = sorted(n for n, node in self.cluster.nodes.items() if not fit.why_not(spec, node))
            if key is not None:
                self._fits[key] = found
        return found

    def _may_hold(self, request: gpu.GpuRequest, *, evicting: bool) -> set[str]:
        """Untouched nodes where each kind of device the request needs is free enough already or (when
        `evicting`) freed by some idle unit; on any other node evictions cannot make it fit."""
        maybe: set[str] | None = None
        for kind, need in _needs(request).items():
            if kind:
                free = {n.name for n in self.cluster.nodes.values() if n.free_mig(kind) >= need}
            else:  # nodes of one GPU state have as many free GPUs
                free = {n.name for group in self.cluster.nodes_by_gpu_state.values() if group[0].free_gpus >= need
                        for n in group}
            here = free | self._freeing.get(kind, set()) if evicting else free
            maybe = here if maybe is None else maybe & here
        return set(self.cluster.nodes) if maybe is None else maybe

    def untouched(self, member: Member, priority: int, *, evicting: bool) -> list[_Option]:
        """Options of the member's nodes as the snapshot has them, cheapest bound first: valid for every
        node no demand has touched, so computed once per (allowed nodes, request, idle units the
        priority may take). Not `evicting` (the budget is spent): only nodes that hold it as they are."""
        request = member.request
        fit_key = fit.key(member.spec)
        key = (fit_key, request.full, tuple(sorted(request.mig.items())), tuple(sorted(member.requests.items())),
               bisect.bisect_right(self._floors, priority), evicting)
        kept = self._untouched.get(key) if fit_key is not None else None
        if kept is None:
            maybe = self._may_hold(request, evicting=evicting)
            options = []
            for name in self.nodes_for(member.spec):
                found = _screen(self, name, member, priority) if name in maybe else None
                if isinstance(found, _Option):
                    options.append(found)
            kept = sorted(options)
            if fit_key is not None:
                self._untouched[key] = kept
        return kept


def _best_node(
    index: _Index,
    member: Member,
    demand: Demand,
    trial: dict[str, _NodeState],
    taken: set[str],
    budget: limits.Budget,
    spared: dict[str, str],
) -> _Choice | str:
    """The node with the cheapest minimal victim set for the member, searched exactly but not node by
    node: nodes that cannot hold it even with every eligible idle pod evicted are screened out by
    counting, the rest are tried cheapest lower bound first until the bound exceeds the best cost."""
    cluster = index.cluster
    request = member.request
    names = index.nodes_for(member.spec)
    touched = set(trial).union(*(index.unit_nodes[k] for k in taken))

    def screen_node(name: str) -> _Option | str | None:
        if name not in touched:
            return _screen(index, name, member, demand.priority)
        return _screen(index, name, member, demand.priority, state=trial.get(name) or _NodeState(), taken=taken)

    spent = budget.spent()
    fresh = [o for o in map(screen_node, touched.intersection(names)) if isinstance(o, _Option)]
    untouched = index.untouched(member, demand.priority, evicting=spent is None)
    options = heapq.merge(sorted(fresh), (o for o in untouched if o.node not in touched))
    best: _Choice | None = None
    failures = [spent] if spent else []
    for option in options:
        if (best is not None and option.bound > best.cost()) or (spent and option.bound[0]):
            break  # spent: this and every later option needs evictions
        node = cluster.nodes[option.node]
        state = trial.get(option.node) or _NodeState()
        limited = {u.key: budget.refuse(u.slots()) for u in option.units}
        eligible = [u for u in option.units if limited[u.key] is None]
        if len(eligible) < len(option.units):  # limits take some units away: screen again without them
            why = "".join(sorted({f" ({w}{_whole(k)})" for k, w in limited.items() if w}))
            found = _option(node, member, eligible, option.free, cluster, state)
            if not isinstance(found, _Option):
                for unit in option.units:
                    if limited[unit.key]:
                        _spare(unit, limited[unit.key] or "", spared)
                failures.append((found or _short(node.name, request, option.units, option.units, option.units)) + why)
                continue
            if best is not None and found.bound > best.cost():
                continue
        choice = _minimal_set(node, member, eligible, cluster, state)
        if isinstance(choice, str):  # not reached: the option's screen is exact
            failures.append(choice)
        elif best is None or choice.cost() < best.cost():
            best = choice
    if best is not None:
        return best
    # Why not: what failed on the most promising nodes, else (none was) the first nodes' screening.
    said = (r for r in map(screen_node, names) if isinstance(r, str))
    return "; ".join(failures[:MAX_REASONS] or itertools.islice(said, MAX_REASONS)) \
        or "no node with reclaimable idle GPUs fits it"
