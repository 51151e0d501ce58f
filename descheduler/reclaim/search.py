"""Victim search: for one member of a demand, the node whose minimal set of idle victim units is cheapest.
Pure: no I/O, no clock.

A victim unit qualifies if the demand's priority >= its minimum-preemptable priority and it frees what the
member needs: the same MIG profile for MIG members; full GPUs on a node without MIG partitions for full-GPU
members. Whether the member then fits is the one capacity model's answer (`common.capacity.Room`): GPUs in one
NVLink domain when the node's topology is known, CPU, memory, pod slots and every other resource on that node.
Minimal set: units by GPUs (desc) then priority (asc) until it fits, then drop any unit not needed (highest
priority first). Cost: GPUs freed, then pods evicted, then the highest priority evicted, then the node name.

Exact, without a search of every node: nodes that cannot hold the member even with every eligible unit evicted
are screened out (by count, then the capacity model), the rest are searched by a lower bound of their cost;
untouched nodes are screened once per cycle for each kind of member by counts, and checked exactly only once a search
reaches them (`Index.untouched`).

The pods holding nodes rule a member out where kube-scheduler's filters that read them would (`Index.refuses`):
a host port in use or an existing pod's required anti-affinity that selects it (`capacity.refuses`), and the
member's own required anti-affinity selecting a pod in the node's topology domain (`antiaffinity.occupied`). Every
pod there counts, victims included: evicting a victim is never assumed to clear them (a replica evicted for its
own sibling would only come back pending). Pods placed earlier in the same plan count too (`NodeState.placed`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any

from common import antiaffinity, capacity, fit, gpu, placement, snapshot
from descheduler.reclaim import allowance, gang_units, pending

MAX_REASONS = 3  # why a demand cannot be served: the first few nodes' reasons


@dataclasses.dataclass
class NodeState:
    """What planned evictions free and planned placements take on one node."""

    freed: set[str] = dataclasses.field(default_factory=set)  # pod keys
    taken: list[tuple[Mapping[str, int], placement.Allocation]] = dataclasses.field(default_factory=list)
    placed: list[str] = dataclasses.field(default_factory=list)  # keys of the pods planned here (`taken`'s owners)

    def copy(self) -> NodeState:
        return NodeState(set(self.freed), list(self.taken), list(self.placed))


def _room(node: snapshot.Node, cluster: snapshot.Snapshot, state: NodeState,
          extra_freed: Set[str] = frozenset()) -> capacity.Room:
    """The node's room in the one capacity model once the freed pods are gone, less what earlier members
    of this plan took: every resource (CPU, memory, pod slots...), GPUs per NVLink domain, MIG slices."""
    room = capacity.Room.of(node, cluster=cluster, leaving=state.freed | extra_freed)
    for requests, allocation in state.taken:
        room.take(requests, allocation)
    return room


def _helps(unit: gang_units.Unit, node: str, request: gpu.GpuRequest) -> bool:
    pods = unit.on(node)
    if request.full:
        return any(p.request.full for p in pods)
    return any(p.request.mig.get(profile) for p in pods for profile in request.mig)


def freed_gpus(unit: gang_units.Unit, node: str) -> int:
    return sum(p.request.full + sum(p.request.mig.values()) for p in unit.on(node))


@dataclasses.dataclass(frozen=True)
class Choice:
    node: str
    units: tuple[gang_units.Unit, ...]
    allocation: placement.Allocation

    def cost(self) -> tuple[int, int, int, str]:
        gpus = sum(freed_gpus(u, self.node) for u in self.units)
        pods = sum(len(u.pods) for u in self.units)
        return (gpus, pods, max((u.priority for u in self.units), default=0), self.node)


def minimal_set(
    node: snapshot.Node,
    member: pending.Member,
    eligible: Sequence[gang_units.Unit],
    cluster: snapshot.Snapshot,
    state: NodeState,
) -> Choice | str:
    def attempt(units: Iterable[gang_units.Unit]) -> placement.Allocation | str:
        freed = {c.pod.key for u in units for c in u.candidates}
        return _room(node, cluster, state, freed).place(member.requests, member.request)

    ordered = sorted(eligible, key=lambda u: (-freed_gpus(u, node.name), u.priority, u.key))
    taken: list[gang_units.Unit] = []
    result = attempt(taken)
    for unit in ordered:
        if not isinstance(result, str):
            break
        taken.append(unit)
        result = attempt(taken)
    if isinstance(result, str):
        return f"{node.name}: {result} even after evicting every eligible idle pod"
    for unit in sorted(taken, key=lambda u: (-u.priority, freed_gpus(u, node.name), u.key)):
        rest = [u for u in taken if u is not unit]
        trial = attempt(rest)
        if not isinstance(trial, str):
            taken, result = rest, trial
    return Choice(node.name, tuple(taken), result)



def _short(
    name: str, request: gpu.GpuRequest, idle_here: Sequence[gang_units.Unit], present: Sequence[gang_units.Unit],
    allowed: Sequence[gang_units.Unit],
) -> str:
    if not present:
        return f"{name}: its idle pods free no {request.describe()}"
    if not allowed:
        floor = min(u.minimum_preemptable for u in present)
        return f"{name}: its {len(present)} idle pod(s) need a preemptor priority >= {floor}"
    return f"{name}: needs {request.describe()}, more than is free even after evicting every eligible idle pod"


@dataclasses.dataclass(frozen=True, order=True)
class Option:
    """A node that holds the member once all of `units` are evicted, with a lower bound of the cost of
    its minimal victim set (`Choice.cost()`, node name last): nodes are searched cheapest bound first."""

    bound: tuple[int, int, int, str]
    units: tuple[gang_units.Unit, ...] = dataclasses.field(compare=False)
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
    node: snapshot.Node, member: pending.Member, units: Sequence[gang_units.Unit], free: Mapping[str, int],
    cluster: snapshot.Snapshot, state: NodeState, *, exact: bool = True,
) -> Option | str | None:
    """The node's option if evicting all of `units` lets the member fit; else why not (None: too few
    devices by count). Bound: any victim set frees at least each kind's shortfall in GPUs, needs at
    least the fewest units covering it, and so evicts at least the that-many-th lowest priority.
    Counts suffice for the bound; the exact check is the capacity model's (NVLink domains and actual
    indices, CPU, memory, pod slots and every other resource on this node: `_unplaceable`), left to the
    caller when not `exact`."""
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
    unplaceable = _unplaceable(node, member, units, cluster, state) if exact else None
    if unplaceable:
        return unplaceable
    # No shortfall: the empty set costs (0, 0, 0) and any other at least one GPU more.
    floor = sorted(u.priority for u in units)[fewest - 1] if fewest else 0
    return Option((short, fewest, floor, node.name), tuple(units), free)


def _unplaceable(node: snapshot.Node, member: pending.Member, units: Sequence[gang_units.Unit],
                 cluster: snapshot.Snapshot, state: NodeState) -> str | None:
    """Why the member does not fit on the node even once all of `units` are evicted (None: it fits)."""
    freed = {p.key for u in units for p in u.on(node.name)}
    placed = _room(node, cluster, state, freed).place(member.requests, member.request)
    return f"{node.name}: {placed} even after evicting every eligible idle pod" if isinstance(placed, str) else None


def _screen(
    index: Index, name: str, member: pending.Member, priority: int, *,
    state: NodeState | None = None, taken: Set[str] = frozenset(), exact: bool = True,
) -> Option | str | None:
    """The node's option for a member of `priority`, or why it cannot hold it (None: nothing to say).
    `state` None: a node no demand of this cycle has touched, read straight from the snapshot. `exact`: see
    `_option`."""
    request = member.request
    node = index.cluster.nodes[name]
    if request.full and node.allocatable.mig:
        return f"{name}: partitioned by MIG, a full-GPU pod needs a node without MIG slices"
    idle_here = [u for u in index.by_node.get(name, ()) if u.key not in taken]
    present = [u for u in idle_here if _helps(u, name, request)]
    allowed = [u for u in present if priority >= u.minimum_preemptable]
    room = index.fresh(name) if state is None else _room(node, index.cluster, state)  # read, never changed
    state = state or NodeState()
    free = {"": room.free_gpus, **{p: room.free.get(gpu.MIG_PREFIX + p, 0) for p in request.mig}}
    found = _option(node, member, allowed, free, index.cluster, state, exact=exact)
    if found is None and idle_here:
        return _short(name, request, idle_here, present, allowed)
    if found is None and name in index.protected:
        return f"{name}: {index.protected[name]}"
    return found


class Index:
    """Per-plan precomputation: idle units by node and each unit's nodes, where idle units free each
    kind of device, the nodes a member's tolerations, nodeSelector and required node affinity allow,
    and the options of untouched nodes for each kind of member."""

    def __init__(self, cluster: snapshot.Snapshot, by_node: Mapping[str, Sequence[gang_units.Unit]], *,
                 protected: Mapping[str, str] | None = None) -> None:
        """`protected`: node -> why its idle pods that are no units are none (a PodDisruptionBudget), for reasons."""
        self.cluster = cluster
        self.by_node = by_node
        self.protected = protected or {}
        self.unit_nodes = {u.key: gang_units.nodes_of(u) for units in by_node.values() for u in units}
        self._freeing: dict[str, set[str]] = collections.defaultdict(set)  # kind (see `_needs`) -> nodes
        for name, units in by_node.items():
            for pod in (p for u in units for p in u.on(name)):
                for kind in _needs(pod.request):
                    self._freeing[kind].add(name)
        # Priorities between two of these floors let the same units go: they share screenings.
        self._floors = sorted({u.minimum_preemptable for units in by_node.values() for u in units})
        self._fits: dict[tuple[Any, ...], list[str]] = {}
        # options by bound, and each node's exact check once the search reached it (`untouched`)
        self._untouched: dict[tuple[Any, ...], tuple[list[Option], dict[str, bool]]] = {}
        self._rooms: dict[str, capacity.Room] = {}
        self._own: dict[str, tuple[antiaffinity.Occupied, ...]] = {}

    def fresh(self, name: str) -> capacity.Room:
        """The node's room as the snapshot has it (shared: read it, never take from it)."""
        room = self._rooms.get(name)
        if room is None:
            room = self._rooms[name] = capacity.Room.of(self.cluster.nodes[name])
        return room

    def shape(self, member: pending.Member) -> tuple[Any, ...] | None:
        """What `nodes_for` reads of the member, hashable (None: do not cache): `capacity.key` for a pod in the
        snapshot (its host ports and, where nodes carry anti-affinity, its labels too; the pod itself where it has
        required anti-affinity of its own), else its spec and requests."""
        pod = self.cluster.pods.get(member.pod)
        if pod is not None:
            key = capacity.key(pod, self.cluster)
            return (key, pod.key) if key is not None and pod.anti_affinity else key
        fit_key = fit.key(member.spec)
        return None if fit_key is None else (fit_key, tuple(sorted(member.requests.items())))

    def refuses(self, member: pending.Member, node: snapshot.Node) -> str | None:
        """Why the pods holding nodes rule the member out of this node (None: they do not; see the module)."""
        pod = self.cluster.pods.get(member.pod)
        if pod is None:
            return None
        why = capacity.refuses(pod, node)
        if why or not pod.anti_affinity:
            return why
        own = self._own.get(pod.key)
        if own is None:
            own = self._own[pod.key] = antiaffinity.occupied(pod.raw, residents=self.cluster.residents,
                                                             namespaces=self.cluster.namespaces)
        return antiaffinity.refused_by(own, node.labels)

    def nodes_for(self, member: pending.Member) -> list[str]:
        """Nodes the capacity model does not rule out for the member however empty (`capacity.never`: the
        scheduler's filters it models, requests larger than the node) nor for the pods holding them (`refuses`),
        cached per `shape`."""
        key = self.shape(member)
        found = self._fits.get(key) if key is not None else None
        if found is None:
            found = sorted(n for n, node in self.cluster.nodes.items()
                           if not capacity.never(member.spec, member.requests, node)
                           and not self.refuses(member, node))
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

    def untouched(self, member: pending.Member, priority: int, *, evicting: bool,
                  skip: Set[str] = frozenset()) -> Iterator[Option]:
        """Options of the member's nodes as the snapshot has them (but those in `skip`), cheapest bound first:
        valid for every node no demand has touched, so their bounds are counted once per (allowed nodes, request,
        idle units the priority may take), and each node's exact check (`_unplaceable`) is made once, when a search
        first reaches it (most searches stop after the first few nodes). Not `evicting` (the budget is spent): only
        nodes that hold it as they are."""
        request = member.request
        shape = self.shape(member)
        key = (shape, request.full, tuple(sorted(request.mig.items())), tuple(sorted(member.requests.items())),
               bisect.bisect_right(self._floors, priority), evicting)
        kept = self._untouched.get(key) if shape is not None else None
        if kept is None:
            maybe = self._may_hold(request, evicting=evicting)
            options = []
            for name in self.nodes_for(member):
                found = _screen(self, name, member, priority, exact=False) if name in maybe else None
                if isinstance(found, Option):
                    options.append(found)
            kept = (sorted(options), {})
            if shape is not None:
                self._untouched[key] = kept
        candidates, fits = kept
        for option in candidates:
            if option.node in skip:
                continue
            fit_here = fits.get(option.node)
            if fit_here is None:
                fit_here = fits[option.node] = _unplaceable(self.cluster.nodes[option.node], member, option.units,
                                                            self.cluster, NodeState()) is None
            if fit_here:
                yield option


def best_node(
    index: Index,
    member: pending.Member,
    demand: pending.Demand,
    trial: dict[str, NodeState],
    taken: set[str],
    budget: allowance.Allowance,
    spared: dict[str, str],
) -> Choice | str:
    """The node with the cheapest minimal victim set for the member, searched exactly but not node by
    node: nodes that cannot hold it even with every eligible idle pod evicted are screened out by
    counting, the rest are tried cheapest lower bound first until the bound exceeds the best cost."""
    cluster = index.cluster
    request = member.request
    names = index.nodes_for(member)
    touched = set(trial).union(*(index.unit_nodes[k] for k in taken))

    def screen_node(name: str) -> Option | str | None:
        if name not in touched:
            return _screen(index, name, member, demand.priority)
        return _screen(index, name, member, demand.priority, state=trial.get(name) or NodeState(), taken=taken)

    spent = budget.spent()
    fresh = [o for o in map(screen_node, touched.intersection(names)) if isinstance(o, Option)]
    untouched = index.untouched(member, demand.priority, evicting=spent is None, skip=touched)
    options = heapq.merge(sorted(fresh), untouched)
    best: Choice | None = None
    failures = [spent] if spent else []
    for option in options:
        if (best is not None and option.bound > best.cost()) or (spent and option.bound[0]):
            break  # spent: this and every later option needs evictions
        node = cluster.nodes[option.node]
        planned = _planned_refusal(cluster, member, node, trial)
        if planned:
            failures.append(f"{node.name}: {planned}")
            continue
        state = trial.get(option.node) or NodeState()
        limited = {u.key: budget.refuse([u]) for u in option.units}
        eligible = [u for u in option.units if limited[u.key] is None]
        if len(eligible) < len(option.units):  # limits take some units away: screen again without them
            why = "".join(sorted({f" ({w}{gang_units.whole(k)})" for k, w in limited.items() if w}))
            found = _option(node, member, eligible, option.free, cluster, state)
            if not isinstance(found, Option):
                for unit in option.units:
                    if limited[unit.key]:
                        gang_units.spare(unit, limited[unit.key] or "", spared)
                failures.append((found or _short(node.name, request, option.units, option.units, option.units)) + why)
                continue
            if best is not None and found.bound > best.cost():
                continue
        choice = minimal_set(node, member, eligible, cluster, state)
        if isinstance(choice, str):  # not reached: the option's screen is exact
            failures.append(choice)
        elif best is None or choice.cost() < best.cost():
            best = choice
    if best is not None:
        return best
    # Why not: what failed on the most promising nodes, else (none was) the first nodes' screening, else (no
    # node could ever hold it) the capacity model's reasons.
    said = (r for r in map(screen_node, names) if isinstance(r, str))
    never = (f"{n}: {why}" for n, why in ((n, capacity.never(member.spec, member.requests, node)
                                           or index.refuses(member, node))
                                          for n, node in sorted(cluster.nodes.items())) if why)
    for reasons in (failures, said, never):
        joined = "; ".join(itertools.islice(reasons, MAX_REASONS))
        if joined:
            return joined
    return "no node with reclaimable idle GPUs fits it"


def _planned_refusal(cluster: snapshot.Snapshot, member: pending.Member, node: snapshot.Node,
                     trial: Mapping[str, NodeState]) -> str | None:
    """Why pods placed earlier in this plan rule the member out of the node, as if they held their nodes already:
    the member's own required anti-affinity selects one in the node's topology domain, or one's selects the member."""
    pod = cluster.pods.get(member.pod)
    planned = [(cluster.pods[key], cluster.nodes[name]) for name, state in sorted(trial.items())
               for key in state.placed if key in cluster.pods and name in cluster.nodes]
    if pod is None or not planned:
        return None
    residents = [antiaffinity.Resident(p.key, p.namespace, p.labels, n.labels) for p, n in planned]
    why = antiaffinity.refused_by(antiaffinity.occupied(pod.raw, residents=residents, namespaces=cluster.namespaces),
                                  node.labels)
    if why:
        return f"{why}, placed earlier in this plan"
    for other, there in planned:
        for raw_term in other.anti_affinity:
            term = antiaffinity.resolve(raw_term, owner=other.key, owner_namespace=other.namespace,
                                        node_labels=there.labels, namespaces=cluster.namespaces)
            if (term is not None and node.labels.get(term.topology_key) == term.topology_value
                    and antiaffinity.refusing([term], namespace=pod.namespace, labels=pod.labels)):
                return f"{term.describe()}, placed earlier in this plan"
    return None
