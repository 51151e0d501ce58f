"""The idle-GPU reclaim planner: which idle pods to evict, for whom, and why — a pure function.

Inputs are plain data: the cluster `Snapshot`, each PriorityClass's `ReclaimPolicy`, each pod's
utilisation `Assessment`, the pending `Demand`s (pods, or whole gangs fed by the gang controller),
the cooldown `State`, the settings and `now`. The output is a `Plan`: evictions and spared pods,
each with its reason, plus what each demand got. No I/O, no clock.

Rules, in order:
1. Screening: protections (never DaemonSet, mirror, system-critical, terminating, opted-out pods or
   nodes reconfiguring MIG), a reclaimable class policy, scheduled for longer than both toleration and
   idle window, idle by its assessment (fail closed), no workload or node cooldown.
2. Gangs are units: a gang member is a victim only with every running member of its gang, and only
   if all of them passed screening.
3. on-demand: demands by priority (desc) then age; a demand takes nothing if it is cooling down, has
   preemptionPolicy Never, or already fits somewhere. Each member (largest first) goes to the node
   whose minimal victim set is cheapest; all members must be placed or the demand takes nothing.
   A victim unit qualifies if the demand's priority >= its minimum-preemptable-priority and it frees
   what the member needs: the same MIG profile for MIG members; full GPUs on a node without MIG
   partitions for full-GPU members, forming one NVLink domain that holds the member when the node's
   topology is known. Minimal set: units by GPUs (desc) then priority (asc) until it fits, then drop
   any unit not needed (highest priority first). Every node is screened by counts; the `SHORTLIST`
   nodes needing the fewest evicted GPUs get that exact search (a constant bound on cycle time).
   always: every idle unit is evicted, no preemptor needed.
4. Limits (per cycle, per node, per namespace) are charged per unit; a unit that would cross one
   is spared with the limit as its reason.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import fit, gangs, gpu, placement, settings, snapshot
from descheduler import cooldowns, policy, protections, utilisation

NEVER = "Never"
SHORTLIST = 16  # nodes per demand member that get the exact minimal-victim-set search (bounds cycle time)
MAX_REASONS = 3  # why a demand cannot be served: the first few nodes' reasons
GANG = "gang:"  # prefix of gang keys, so that a gang never collides with a pod of the same name


# --- Demand: what pending work needs --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Member:
    pod: str  # namespace/name
    request: gpu.GpuRequest
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # for taints/nodeSelector


@dataclasses.dataclass(frozen=True)
class Demand:
    """A pending pod, or a whole gang that needs all its members placed at once."""

    key: str  # pod key, or "gang:" + the gang key
    members: tuple[Member, ...]
    priority: int
    preemption_policy: str
    created: str  # RFC 3339: older first among equal priorities
    gang: str | None = None


def _unschedulable(pod: snapshot.Pod) -> bool:
    for condition in (pod.raw.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return bool(condition.get("reason") == "Unschedulable")
    return False


def demands_from_snapshot(cluster: snapshot.Snapshot) -> list[Demand]:
    """Pending GPU pods the scheduler found no room for (PodScheduled=False, Unschedulable), each alone.

    Gated gangs are not here: the gang controller knows when one is complete and waits only for GPUs
    and feeds it through `gang_demand()`.
    """
    return [
        _demand(pod.key, [pod], gang=None)
        for pod in cluster.pods.values()
        if not pod.node_name and not pod.deleting and pod.phase == "Pending" and pod.request.any
        and not pod.scheduling_gates and _unschedulable(pod)
    ]


def gang_demand(gang: str, members: Sequence[snapshot.Pod]) -> Demand:
    """A complete gang waiting for GPUs: all `members` (its unplaced pods) must be placed together.
    It is only as strong as its weakest member: the lowest priority; Never if any member says so."""
    return _demand(f"{GANG}{gang}", members, gang=gang)


def _demand(key: str, pods: Sequence[snapshot.Pod], *, gang: str | None) -> Demand:
    return Demand(
        key=key,
        members=tuple(Member(p.key, p.request, p.raw.get("spec") or {}) for p in pods),
        priority=min(p.priority for p in pods),
        preemption_policy=NEVER if any(p.preemption_policy == NEVER for p in pods) else "PreemptLowerPriority",
        created=min(p.created for p in pods),
        gang=gang,
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
    utilization: float
    threshold: float
    window_seconds: int
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


# --- Limits ---------------------------------------------------------------------------------------


class Budget:
    """Eviction limits of one cycle; shared by the planner and the evictor (which re-checks before
    each API call)."""

    def __init__(self, limits: settings.EvictionLimits) -> None:
        self._limits = limits
        self._total = 0
        self._node: collections.Counter[str] = collections.Counter()
        self._namespace: collections.Counter[str] = collections.Counter()

    def refuse(self, pods: Iterable[tuple[str, str]]) -> str | None:
        """Why evicting these (namespace, node) pods would cross a limit, or None."""
        batch = list(pods)
        if self._total + len(batch) > self._limits.per_cycle:
            return f"per-cycle eviction limit {self._limits.per_cycle} reached"
        for node, count in collections.Counter(n for _, n in batch).items():
            if self._node[node] + count > self._limits.per_node:
                return f"per-node eviction limit {self._limits.per_node} reached on {node}"
        for namespace, count in collections.Counter(ns for ns, _ in batch).items():
            if self._namespace[namespace] + count > self._limits.per_namespace:
                return f"per-namespace eviction limit {self._limits.per_namespace} reached in {namespace}"
        return None

    def charge(self, pods: Iterable[tuple[str, str]]) -> None:
        for namespace, node in pods:
            self._total += 1
            self._node[node] += 1
            self._namespace[namespace] += 1


# --- Screening ------------------------------------------------------------------------------------


def epoch(text: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp (Kubernetes Time or MicroTime); None if absent or malformed."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def scheduled_at(pod: snapshot.Pod) -> float | None:
    status = pod.raw.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return epoch(condition.get("lastTransitionTime")) or epoch(status.get("startTime"))
    return epoch(status.get("startTime")) or epoch(pod.created)


def screen(
    pod: snapshot.Pod,
    *,
    cluster: snapshot.Snapshot,
    policies: Mapping[str, policy.ReclaimPolicy],
    state: cooldowns.State,
    names: settings.Names,
    now: float,
) -> policy.ReclaimPolicy | str:
    """Everything but utilisation: the pod's policy if it may be reclaimed once idle, else why not."""
    node = cluster.nodes.get(pod.node_name or "")
    reason = protections.why_protected(pod, node=node, names=names)
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


def windows_needed(
    cluster: snapshot.Snapshot,
    *,
    policies: Mapping[str, policy.ReclaimPolicy],
    state: cooldowns.State,
    names: settings.Names,
    now: float,
) -> dict[int, list[str]]:
    """Idle window -> pods to measure over it: the shell queries Prometheus once per window."""
    out: dict[int, list[str]] = collections.defaultdict(list)
    for pod in cluster.pods.values():
        if not pod.holds_gpus:
            continue
        found = screen(pod, cluster=cluster, policies=policies, state=state, names=names, now=now)
        if not isinstance(found, str) and found.idle_seconds is not None:
            out[found.idle_seconds].append(pod.key)
    return dict(out)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    pod: snapshot.Pod
    policy: policy.ReclaimPolicy
    assessment: utilisation.Assessment


@dataclasses.dataclass(frozen=True)
class _Unit:
    key: str
    candidates: tuple[_Candidate, ...]

    @property
    def minimum_preemptable(self) -> int:
        return max(c.policy.minimum_preemptable_priority for c in self.candidates)

    @property
    def priority(self) -> int:
        return max(c.pod.priority for c in self.candidates)

    def on(self, node: str) -> list[snapshot.Pod]:
        return [c.pod for c in self.candidates if c.pod.node_name == node]

    def slots(self) -> list[tuple[str, str]]:
        return [(c.pod.namespace, c.pod.node_name or "") for c in self.candidates]


# --- Node arithmetic ------------------------------------------------------------------------------


@dataclasses.dataclass
class _NodeState:
    """What planned evictions free and planned placements claim on one node."""

    freed: set[str] = dataclasses.field(default_factory=set)  # pod keys
    claimed_full: int = 0
    claimed_indices: set[int] = dataclasses.field(default_factory=set)
    claimed_mig: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def copy(self) -> _NodeState:
        return _NodeState(set(self.freed), self.claimed_full, set(self.claimed_indices),
                          collections.Counter(self.claimed_mig))


def _room(
    node: snapshot.Node, cluster: snapshot.Snapshot, state: _NodeState, extra_freed: set[str]
) -> tuple[int, list[list[int]], collections.Counter[str]]:
    """Free full GPUs, free indices per NVLink domain, free MIG slices by profile."""
    freed = state.freed | extra_freed
    staying = [p for p in cluster.pods_on(node.name) if p.key not in freed]
    full = node.allocatable.full - sum(p.request.full for p in staying) - state.claimed_full
    used = {i for p in staying for i in p.gpu_indices} | state.claimed_indices
    mig: collections.Counter[str] = collections.Counter(node.allocatable.mig)
    for pod in staying:
        mig.subtract(pod.request.mig)
    mig.subtract(state.claimed_mig)
    return full, placement.free_by_domain(node.topology.domains, used), mig


def _placement(
    node: snapshot.Node, request: gpu.GpuRequest, room: tuple[int, list[list[int]], collections.Counter[str]]
) -> placement.Allocation | str:
    """Where the member's GPUs would go on the node, or why they do not fit."""
    full, free_domains, mig = room
    for profile, count in request.mig.items():
        if mig[profile] < count:
            return f"needs {count}x MIG {profile}, {max(0, mig[profile])} free"
    if not request.full:
        return placement.Allocation((), ())
    if full < request.full:
        return f"needs {request.full} GPU, {max(0, full)} free"
    allocation = placement.allocate(free_domains, request.full)
    if allocation is None:
        return f"needs {request.full} GPU, free indices do not suffice"
    if node.topology.known and request.full <= node.topology.domain_size and allocation.spanned > 1:
        return f"needs {request.full} GPU in one NVLink domain"
    return allocation


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
        pods = sum(len(u.candidates) for u in self.units)
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
        return _placement(node, member.request, _room(node, cluster, state, freed))

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
) -> Plan:
    names = config.names
    reclaim = config.descheduler.reclaim
    spared: dict[str, str] = {}
    candidates: dict[str, _Candidate] = {}
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        if not pod.holds_gpus:
            continue
        found = screen(pod, cluster=cluster, policies=policies, state=state, names=names, now=now)
        if isinstance(found, str):
            spared[pod.key] = found
            continue
        assessment = assessments.get(pod.key) or utilisation.failed("no utilisation reading this cycle")
        if not assessment.idle:
            spared[pod.key] = f"not idle: {assessment.reason}"
            continue
        candidates[pod.key] = _Candidate(pod, found, assessment)

    units = _units(cluster, candidates, spared, names=names)
    for unit in units:
        for candidate in unit.candidates:
            spared[candidate.pod.key] = f"idle ({candidate.assessment.reason}) but no pending pod can use its GPUs"

    budget = Budget(reclaim.limits)
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
        evictions, outcomes = _on_demand(
            cluster=cluster, units=units, demands=demands, state=state, budget=budget, spared=spared, now=now
        )
    return Plan(
        evictions=tuple(evictions),
        spared=tuple(Spared(k, v) for k, v in sorted(spared.items())),
        demands=tuple(outcomes),
        candidates=len(candidates),
        idle_gpus=sum(c.pod.request.full + sum(c.pod.request.mig.values()) for c in candidates.values()),
    )


def _nodes(unit: _Unit) -> set[str]:
    return {c.pod.node_name or "" for c in unit.candidates}


def _units(
    cluster: snapshot.Snapshot,
    candidates: Mapping[str, _Candidate],
    spared: dict[str, str],
    *,
    names: settings.Names,
) -> list[_Unit]:
    """Single pods, and gangs whose every running member is a candidate."""
    singles: list[_Unit] = []
    gang_members: dict[str, list[snapshot.Pod]] = collections.defaultdict(list)
    for pod in cluster.pods.values():
        gang = gangs.identify(pod.raw, names=names) if pod.holds_gpus else None
        if gang is not None:
            gang_members[gang.key].append(pod)
        elif pod.key in candidates:
            singles.append(_Unit(pod.key, (candidates[pod.key],)))
    units = singles
    for gang_key, members in gang_members.items():
        blockers = [p for p in members if p.key not in candidates]
        if blockers:
            for pod in members:
                if pod.key in candidates:
                    blocker = blockers[0]
                    spared[pod.key] = f"gang {gang_key} is reclaimed only as a whole: {blocker.key} " \
                        f"is not reclaimable ({spared.get(blocker.key, 'not screened')})"
            continue
        units.append(_Unit(f"{GANG}{gang_key}", tuple(candidates[p.key] for p in sorted(members, key=lambda p: p.key))))
    return sorted(units, key=lambda u: u.key)


def _spare(unit: _Unit, reason: str, spared: dict[str, str]) -> None:
    for candidate in unit.candidates:
        spared[candidate.pod.key] = f"idle but spared: {reason}"


def _evict(unit: _Unit, demand: Demand | None, why: str, spared: dict[str, str]) -> list[Eviction]:
    out = []
    gang = f"; with its gang {unit.key.removeprefix(GANG)}" if unit.key.startswith(GANG) else ""
    for candidate in unit.candidates:
        spared.pop(candidate.pod.key, None)
        pod = candidate.pod
        out.append(Eviction(
            pod=pod.key,
            uid=pod.uid,
            node=pod.node_name or "",
            unit=unit.key,
            preemptor=demand.key if demand else None,
            preemptor_priority=demand.priority if demand else None,
            utilization=round(candidate.assessment.utilisation or 0.0, 3),
            threshold=candidate.policy.threshold_percent,
            window_seconds=candidate.policy.idle_seconds or 0,
            workload=cooldowns.workload_key(pod),
            reason=f"{candidate.assessment.reason}; {why}{gang}",
        ))
    return out


def _on_demand(
    *,
    cluster: snapshot.Snapshot,
    units: Sequence[_Unit],
    demands: Sequence[Demand],
    state: cooldowns.State,
    budget: Budget,
    spared: dict[str, str],
    now: float,
) -> tuple[list[Eviction], list[DemandOutcome]]:
    by_node: dict[str, list[_Unit]] = collections.defaultdict(list)
    for unit in units:
        for node in _nodes(unit):
            by_node[node].append(unit)
    index = _Index(cluster, by_node)
    taken: set[str] = set()
    nodes: dict[str, _NodeState] = collections.defaultdict(_NodeState)
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
        if demand.preemption_policy == NEVER:
            outcomes.append(outcome(False, "preemptionPolicy Never: takes no GPUs from others"))
            continue
        trial = {name: s.copy() for name, s in nodes.items()}
        chosen: list[tuple[Member, _Choice]] = []
        trial_taken = set(taken)
        failure = None
        ordered = sorted(demand.members, key=lambda m: (-m.request.full, -sum(m.request.mig.values()), m.pod))
        for member in ordered:
            best = _best_node(index, member, demand, trial, trial_taken, budget)
            if isinstance(best, str):
                failure = f"{member.pod}: {best}"
                break
            node_state = trial.setdefault(best.node, _NodeState())
            node_state.freed |= {c.pod.key for u in best.units for c in u.candidates}
            node_state.claimed_full += member.request.full
            node_state.claimed_indices |= set(best.allocation.indices)
            node_state.claimed_mig.update(member.request.mig)
            trial_taken |= {u.key for u in best.units}
            chosen.append((member, best))
        if failure is not None:
            outcomes.append(outcome(False, f"no node can hold it: {failure}"))
            continue
        victims = [u for _, c in chosen for u in c.units]
        where = ", ".join(sorted({c.node for _, c in chosen}))
        if not victims:
            outcomes.append(outcome(False, f"fits without evictions on {where}; left to the scheduler"))
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


def _slack(
    node: snapshot.Node, request: gpu.GpuRequest, units: Sequence[_Unit], cluster: snapshot.Snapshot,
    state: _NodeState,
) -> int:
    """Free devices plus what `units` would free, minus what the member needs (the scarcest kind).
    Negative: the node cannot hold the member whatever is evicted. Counts only, no NVLink domains."""
    freed = [cluster.pods[k] for k in state.freed]
    here = [p for u in units for p in u.on(node.name)]
    if request.full:
        free = node.allocatable.full - node.requested_full - state.claimed_full
        return free + sum(p.request.full for p in freed + here) - request.full
    return min(
        (node.free_mig(profile) - state.claimed_mig[profile] + sum(p.request.mig.get(profile, 0) for p in freed + here)
         - count for profile, count in request.mig.items()),
        default=0,
    )


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


class _Index:
    """Per-plan precomputation: which nodes a member's tolerations/nodeSelector allow, and for each
    node its free full GPUs plus the idle units freeing full GPUs there, by minimum-preemptable
    priority with prefix sums — so screening an untouched node for a full-GPU member is a bisection."""

    def __init__(self, cluster: snapshot.Snapshot, by_node: Mapping[str, Sequence[_Unit]]) -> None:
        self.cluster = cluster
        self.by_node = by_node
        self._fits: dict[str, list[str]] = {}
        self.unit_nodes: dict[str, set[str]] = {}
        self.full: dict[str, tuple[int, list[int], list[int], list[_Unit]]] = {}
        for name, node in cluster.nodes.items():
            units = sorted((u for u in by_node.get(name, ()) if any(p.request.full for p in u.on(name))),
                           key=lambda u: u.minimum_preemptable)
            sums = [0]
            for unit in units:
                sums.append(sums[-1] + sum(p.request.full for p in unit.on(name)))
            self.full[name] = (node.allocatable.full - node.requested_full,
                               [u.minimum_preemptable for u in units], sums, units)
        for resident in by_node.values():
            for unit in resident:
                self.unit_nodes.setdefault(unit.key, _nodes(unit))

    def nodes_for(self, spec: Mapping[str, Any]) -> list[str]:
        """Nodes passing `fit.why_not` (it reads only tolerations and nodeSelector), cached per pair."""
        key = json.dumps([spec.get("tolerations"), spec.get("nodeSelector")], sort_keys=True, default=str)
        if key not in self._fits:
            self._fits[key] = sorted(n for n, node in self.cluster.nodes.items() if not fit.why_not(spec, node))
        return self._fits[key]


def _best_node(
    index: _Index,
    member: Member,
    demand: Demand,
    trial: dict[str, _NodeState],
    taken: set[str],
    budget: Budget,
) -> _Choice | str:
    """The node with the cheapest minimal victim set for the member. Every node is screened by counts;
    the `SHORTLIST` nodes needing the fewest evicted GPUs get the exact (NVLink, limits) search."""
    cluster = index.cluster
    reasons: list[str] = []
    shortlist: list[tuple[int, str, Sequence[_Unit]]] = []
    touched = set(trial).union(*(index.unit_nodes[k] for k in taken))
    need = member.request.full
    for name in index.nodes_for(member.spec):
        node = cluster.nodes[name]
        if need and node.allocatable.mig:
            reasons.append(f"{name}: partitioned by MIG, a full-GPU pod needs a node without MIG slices")
            continue
        if need and not member.request.mig and name not in touched:
            free, floors, sums, units = index.full[name]
            fast = bisect.bisect_right(floors, demand.priority)
            if free + sums[fast] >= need:
                shortlist.append((max(0, need - free), name, units[:fast]))
                continue
            if not index.by_node.get(name) or len(reasons) >= MAX_REASONS:
                continue
        state = trial.get(name) or _NodeState()
        idle_here = [u for u in index.by_node.get(name, ()) if u.key not in taken]
        present = [u for u in idle_here if _helps(u, name, member.request)]
        allowed = [u for u in present if demand.priority >= u.minimum_preemptable]
        if _slack(node, member.request, allowed, cluster, state) < 0:
            if idle_here and len(reasons) < MAX_REASONS:
                reasons.append(_short(name, member.request, idle_here, present, allowed))
            continue
        shortlist.append((max(0, -_slack(node, member.request, (), cluster, state)), name, allowed))
    best: _Choice | None = None
    for _, name, candidates in sorted(shortlist, key=lambda t: (t[0], t[1]))[:SHORTLIST]:
        limited = {u.key: budget.refuse(u.slots()) for u in candidates}
        eligible = [u for u in candidates if limited[u.key] is None]
        choice = _minimal_set(cluster.nodes[name], member, eligible, cluster, trial.get(name) or _NodeState())
        if isinstance(choice, str):
            reasons.append(choice + "".join(sorted({f" ({why})" for why in limited.values() if why})))
            continue
        if best is None or choice.cost() < best.cost():
            best = choice
        if not choice.units:
            break  # fits without evictions: nothing can be cheaper
    if best is not None:
        return best
    return "; ".join(reasons[:MAX_REASONS]) or "no node with reclaimable idle GPUs fits it"
