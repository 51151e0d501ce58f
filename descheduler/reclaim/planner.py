"""The reclaim plan: which idle pods to evict, for whom, and why. Pure: no I/O, no clock.

Inputs are plain data: the cluster `Snapshot`, each PriorityClass's `ReclaimPolicy`, each pod's utilisation
`Assessment`, the pending `pending.Demand`s (`pending`), the cooldown `State`, the settings and `now`. The output is a
`Plan`: evictions and spared pods, each with its reason, plus what each demand got.

Rules, in order (each step in its module):
1. Screening (`screening`): protections, operators' conventions, a reclaimable class policy, scheduled for
   longer than both toleration and idle window, no workload or node cooldown; then idle by its assessment
   (fail closed) and not already leaving (evicted by us in an earlier cycle).
2. Gangs are units (`gang_units`): reclaimed whole or not at all.
3. on-demand: demands by priority (desc) then age; a demand takes nothing if it is `ignored` (`pending`), it
   is cooling down, has preemptionPolicy Never, or already fits somewhere — counting pods already leaving as
   gone (terminating ones for anyone, those we evicted for a pending demand for that demand only). Each
   member (largest first) goes to the node whose minimal victim set is cheapest (`search`); all members must
   be placed or the demand takes nothing.
   always: every idle unit is evicted, no preemptor needed.
4. Limits (per cycle, per node, per namespace) count decisions (`limits`: a gang once), and PodDisruptionBudgets
   count pods (`allowance`): a unit whose budget allows no disruption is no victim; a demand whose victims
   together would cross a limit or a budget takes none of them (all or none); a unit that would cross one is
   spared with the limit or budget as its reason, which names the gang it spares.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from common import settings, snapshot
from descheduler import cooldowns, limits, policy
from descheduler.reclaim import allowance, gang_units, pending, screening, search, utilisation


@dataclasses.dataclass(frozen=True)
class Eviction:
    pod: str
    uid: str
    node: str
    unit: str  # pod key, or "gang:" + the gang key: members are evicted together or not at all
    preemptor: str | None  # None in mode "always"
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

def plan(
    *,
    cluster: snapshot.Snapshot,
    policies: Mapping[str, policy.ReclaimPolicy],
    assessments: Mapping[str, utilisation.Assessment],
    demands: Sequence[pending.Demand],
    state: cooldowns.State,
    config: settings.Settings,
    now: float,
    screened: screening.Screened | None = None,
    leaving: Mapping[str, str | None] | None = None,
    pod_groups: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
    spent: Sequence[limits.Slot] = (),
) -> Plan:
    """`screened`: `screening.screen_all()` of these same inputs, when the caller has it already.
    `leaving`: pods the loop evicted in its last cycles -> the demand they were evicted for (None: mode
    always), whether or not the snapshot shows them terminating yet. They are never victims again, and
    their GPUs are that demand's while it is pending (as kube-scheduler nominates a preemptor): it fits
    there and takes nothing more. Terminating pods, and those evicted for no pending demand, free their
    GPUs for the first demand that fits. `pod_groups`: native PodGroups' `spec.disruptionMode` by
    "namespace/name" (`single` or `all`); default: as the snapshot's PodGroups say (`disruption_modes`).
    `refused`: pods whose eviction the API refused earlier in this cycle -> why (never victims again in it);
    `spent`: the evictions made earlier in this cycle, counted against the limits (a plan made again after a
    refusal tries the next candidates within what is left)."""
    reclaim = config.descheduler.reclaim
    leaving = leaving or {}
    if screened is None:
        screened = screening.screen_all(cluster, policies=policies, state=state, config=config, now=now)
    spared: dict[str, str] = {}
    candidates: dict[str, gang_units.Candidate] = {}
    for key in sorted(screened):
        pod, found = cluster.pods[key], screened[key]
        if key in leaving:
            found = f"already leaving: {_evicted_for(leaving[key])}"
        elif refused and key in refused:
            found = f"eviction refused earlier this cycle: {refused[key]}"
        if isinstance(found, str):
            spared[pod.key] = found
            continue
        assessment = assessments.get(pod.key) or utilisation.failed("no utilisation reading this cycle")
        if not assessment.idle:
            spared[pod.key] = f"not idle: {assessment.reason}"
            continue
        candidates[pod.key] = gang_units.Candidate(pod, found, assessment)

    modes = gang_units.disruption_modes(cluster) if pod_groups is None else pod_groups
    budget = allowance.Allowance(cluster, reclaim.limits, spent=spent)
    units = []
    protected: dict[str, str] = {}  # node -> why an idle pod there is no victim (its budget): told to demands
    for unit in gang_units.build(cluster, candidates, spared, config=config, pod_groups=modes):
        # A PodDisruptionBudget that allows no disruption now makes the unit no victim at all, so that the
        # search tries its equally idle neighbours instead of a pod the Eviction API would refuse.
        blocked = budget.disruption_refused([unit])
        if blocked:
            gang_units.spare(unit, blocked, spared)
            for node in gang_units.nodes_of(unit):
                protected.setdefault(node, f"its idle pods are no victims: {blocked}")
            continue
        units.append(unit)
        for candidate in unit.candidates:
            spared[candidate.pod.key] = f"idle ({candidate.assessment.reason}) but no pending pod can use its GPUs"

    evictions: list[Eviction] = []
    outcomes: list[DemandOutcome] = []
    if reclaim.mode == "always":
        def order(u: gang_units.Unit) -> tuple[int, int, str]:
            return u.priority, -sum(search.freed_gpus(u, n) for n in gang_units.nodes_of(u)), u.key

        for unit in sorted(units, key=order):
            refusal = budget.refuse([unit])
            if refusal:
                gang_units.spare(unit, refusal, spared)
                continue
            budget.charge([unit])
            evictions += _evict(unit, None, "mode always, no preemptor needed", spared)
    else:
        evictions, outcomes = _on_demand(cluster=cluster, units=units, demands=demands, state=state, budget=budget,
                                         spared=spared, leaving=_leaving(cluster, leaving, demands), now=now,
                                         protected=protected)
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


def _leaving(
    cluster: snapshot.Snapshot, evicted: Mapping[str, str | None], demands: Sequence[pending.Demand]
) -> Leaving:
    """Whose GPUs pods already leaving free: the pending demand they were evicted for, else anyone's."""
    waiting = {d.key for d in demands}
    out: dict[str | None, dict[str, dict[str, str]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    for pod in cluster.pods.values():
        if not pod.holds_gpus or not (pod.deleting or pod.key in evicted):
            continue
        demand = evicted.get(pod.key)
        why = _evicted_for(demand) if pod.key in evicted else "terminating"
        out[demand if demand in waiting else None][pod.node_name or ""][pod.key] = why
    return out


def _evict(unit: gang_units.Unit, demand: pending.Demand | None, why: str, spared: dict[str, str]) -> list[Eviction]:
    gang = f"; with its gang {unit.key.removeprefix(pending.GANG)}" if unit.key.startswith(pending.GANG) else ""

    def eviction(pod: snapshot.Pod, measured: gang_units.Candidate | None) -> Eviction:
        spared.pop(pod.key, None)
        said = measured.assessment.reason if measured else "requests no GPU, goes with its gang's idle GPU members"
        return Eviction(
            pod=pod.key,
            uid=pod.uid,
            node=pod.node_name or "",
            unit=unit.key,
            preemptor=demand.key if demand else None,
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
    units: Sequence[gang_units.Unit],
    demands: Sequence[pending.Demand],
    state: cooldowns.State,
    budget: allowance.Allowance,
    spared: dict[str, str],
    leaving: Leaving,
    now: float,
    protected: Mapping[str, str],
) -> tuple[list[Eviction], list[DemandOutcome]]:
    by_node: dict[str, list[gang_units.Unit]] = collections.defaultdict(list)
    for unit in units:
        for node in gang_units.nodes_of(unit):
            by_node[node].append(unit)
    index = search.Index(cluster, by_node, protected=protected)
    taken: set[str] = set()
    # Pods already leaving free their GPUs for their demand, else the first that fits: one eviction, one demand.
    nodes: dict[str, search.NodeState] = collections.defaultdict(search.NodeState)
    for name, pods in leaving.get(None, {}).items():
        nodes[name].freed |= set(pods)
    evictions: list[Eviction] = []
    outcomes: list[DemandOutcome] = []
    for demand in sorted(demands, key=lambda d: (-d.priority, d.created, d.key)):
        members = tuple(m.pod for m in demand.members)

        def outcome(served: bool, reason: str, victims: tuple[str, ...] = (), *,
                    d: pending.Demand = demand, m: tuple[str, ...] = members) -> DemandOutcome:
            return DemandOutcome(d.key, m, d.priority, served, reason, victims)

        until = state.active(cooldowns.preemptor_key(demand.key), now=now)
        if until is not None:
            outcomes.append(outcome(False, f"preemptor cooldown for {until - now:.0f}s more"))
            continue
        if demand.ignored:
            outcomes.append(outcome(False, demand.ignored))
            continue
        if demand.preemption_policy == pending.NEVER:
            outcomes.append(outcome(False, "preemptionPolicy Never: takes no GPUs from others"))
            continue
        trial = {name: s.copy() for name, s in nodes.items()}
        reserved = leaving.get(demand.key, {})
        for name, pods in reserved.items():
            trial.setdefault(name, search.NodeState()).freed |= set(pods)
        chosen: list[tuple[pending.Member, search.Choice]] = []
        trial_taken = set(taken)
        failure = None
        ordered = sorted(demand.members, key=lambda m: (-m.request.full, -sum(m.request.mig.values()), m.pod))
        for member in ordered:
            best = search.best_node(index, member, demand, trial, trial_taken, budget, spared)
            if isinstance(best, str):
                failure = f"{member.pod}: {best}"
                break
            node_state = trial.setdefault(best.node, search.NodeState())
            node_state.freed |= {c.pod.key for u in best.units for c in u.candidates}
            node_state.taken.append((member.requests, best.allocation))
            node_state.placed.append(member.pod)
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
        # All or none: every victim's limits and PodDisruptionBudgets are checked before any is planned.
        refusal = budget.refuse(victims)
        if refusal:
            outcomes.append(outcome(False, refusal))
            for unit in victims:
                gang_units.spare(unit, refusal, spared)
            continue
        budget.charge(victims)
        nodes.update(trial)
        taken = trial_taken
        why = f"reclaimed for {demand.key} (priority {demand.priority})"
        made = [e for u in victims for e in _evict(u, demand, why, spared)]
        evictions += made
        outcomes.append(outcome(True, f"{len(made)} idle pod(s) evicted on {where}", tuple(e.pod for e in made)))
    return evictions, outcomes


