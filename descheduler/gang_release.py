"""Gang release planning: which gated gangs may start now, where, and why the others wait.

Pure: a `Snapshot`, the settings and `now` in, decisions with their reasons out. The shell
(`descheduler.gang_controller`) applies them. Rules, in the order they are checked:

- A gated pod (our gate) whose gang labels are unusable — none, a bad size, no size we can know, a
  gang another scheduler enforces, members disagreeing on the size — is released alone with a
  Warning `GangInvalid`: a gate nobody can ever lift correctly must not strand it.
- A gang that has already started (some present member carries no gate of ours) releases its gated
  rest at once if it is complete or its gated members already carry our node pin (a release was
  interrupted: controller restart, API error). Holding them back would only keep the started part
  waiting for siblings; as ordinary Pending pods they can also use the scheduler's preemption.
  Pins already set are kept; no new ones are added (the running members' nodes are fixed anyway).
- A gang seen complete earlier (our mark annotation) that lost members, none of whom has an owner
  that would recreate them, is orphaned: its gated members are released with a Warning `GangOrphaned`.
- A gang with fewer present members than its size waits; after `descheduler.gangs.timeout_seconds`
  (from its first member's creation) it gets a Warning `GangIncomplete` and still waits: a partial
  gang is never released.
- A complete gang whose members still carry another controller's gate (e.g. Kueue's admission)
  waits for it: planning now could pin it to capacity that is gone when the other gate lifts.
- Complete gangs are queued by priority (highest member priority), then creation (oldest member),
  and each is placed on what the gangs before it left: every member at once, each within one
  NVLink domain where the node's topology is known (a member larger than the node's domains spans
  the fewest), preferring one node or one multi-node NVLink clique, else the fewest nodes. Pods
  released but not yet bound count against the node they are pinned to.
- Backfill off (default): a gang that cannot be placed reserves every node it could use; gangs
  behind it may start only on other nodes. Backfill on: they may use any free GPUs — better
  utilisation, but a large gang can starve behind a stream of small ones.
- Each member is pinned to the single node planned for it (`matchFields metadata.name In [node]`),
  not to the gang's node set: the scheduler may pack a set differently (e.g. 4+3 on one 8-GPU node,
  4+3 on the other) and leave the last member without room.
- Members that request no GPU (an MPI launcher counted in the gang's size) count toward completeness
  and are un-gated together with the rest, but are neither placed nor pinned: the plan finds room for
  GPUs only, and pinning such a pod to a GPU node would take a place a GPU pod needs. A gang without
  any GPU member is released as soon as it is complete (and no other controller's gate is left).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from common import fit, gangs, gpu, placement, settings, snapshot, timestamps

EventType = Literal["Normal", "Warning"]

RELEASED = "GangReleased"
WAITING = "GangWaiting"
INCOMPLETE = "GangIncomplete"
INVALID = "GangInvalid"
ORPHANED = "GangOrphaned"


def complete_mark(names: settings.Names) -> str:
    """Annotation the controller sets on members of a complete gang that has to wait (when it was seen)."""
    return f"{names.prefix}gang-complete-since"


class Action(enum.StrEnum):
    RELEASE = "release"  # placed: pin each member to its node, then remove our gate from all
    RESUME = "resume"  # already started: remove our gate from the rest now
    RELEASE_ALONE = "release-alone"  # invalid or orphaned: remove our gate, with a warning
    WAIT = "wait"
    TIMED_OUT = "timed-out"  # incomplete past the timeout: still waits, with a warning
    NONE = "none"  # no member carries our gate


class Waiting(enum.StrEnum):
    INCOMPLETE = "incomplete"
    OTHER_GATES = "other-gates"
    CAPACITY = "capacity"
    QUEUED = "queued"


@dataclasses.dataclass(frozen=True)
class Member:
    key: str
    uid: str
    gated: bool  # carries our gate
    request: gpu.GpuRequest
    node: str | None  # bound node, else the planned node (RELEASE), else None


@dataclasses.dataclass(frozen=True)
class Decision:
    gang: str  # namespace/name; the pod key for a pod with no usable gang
    action: Action
    message: str  # why, for the Event and the CLI
    event_type: EventType | None  # None: no event
    event_reason: str | None
    members: tuple[Member, ...]
    size: int | None = None
    priority: int = 0
    created: str = ""  # the oldest member's creation time
    waiting: Waiting | None = None
    mark: tuple[str, ...] = ()  # members to annotate with complete_mark()

    @property
    def ungate(self) -> tuple[str, ...]:
        """Members whose gate is to be removed now (after pinning, for RELEASE)."""
        if self.action in (Action.RELEASE, Action.RESUME, Action.RELEASE_ALONE):
            return tuple(m.key for m in self.members if m.gated)
        return ()

    @property
    def pins(self) -> Mapping[str, str]:
        """pod key -> node to pin it to before un-gating (RELEASE only)."""
        if self.action is not Action.RELEASE:
            return {}
        return {m.key: m.node for m in self.members if m.gated and m.node}


@dataclasses.dataclass(frozen=True)
class Demand:
    """A complete gang waiting only for free GPUs: what the idle-reclaim loop may free capacity for."""

    gang: str
    priority: int
    created: str
    members: tuple[snapshot.Pod, ...]  # the members to place (those that request GPUs)
    nodes: tuple[str, ...]  # nodes some member may use
    missing_gpus: int  # full GPUs short on those nodes (0: enough in number, too fragmented)


@dataclasses.dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]  # invalid first, then by queue order
    demand: tuple[Demand, ...]


@dataclasses.dataclass(frozen=True)
class Placement:
    nodes: Mapping[str, str]  # pod key -> node
    clique: str | None  # the multi-node NVLink domain holding the whole gang, if one does
    spanning: tuple[str, ...]  # members that span several NVLink domains (larger than any)

    def describe(self) -> str:
        used = sorted(set(self.nodes.values()))
        where = f"{len(self.nodes)} members on {len(used)} node(s) ({', '.join(used)})"
        if len(used) == 1:
            why = "one node"
        elif self.clique:
            why = f"one multi-node NVLink domain {self.clique}"
        else:
            why = "no single node or NVLink clique could hold the gang: fewest nodes"
        domains = (
            f"; {', '.join(self.spanning)} span several NVLink domains (larger than one)"
            if self.spanning
            else "; each member within one NVLink domain"
        )
        return f"{where}: {why}{domains}"


# --- node pins (the scheduler enforces required node affinity; `fit.why_not` evaluates it) -------


def _required_terms(raw: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    affinity = ((raw.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    return list(terms) if terms else None


def pinned_node(raw: Mapping[str, Any]) -> str | None:
    """The one node a pod's required terms name (`matchFields metadata.name In [node]`), if they name one."""
    pinned: set[str] = set()
    for term in _required_terms(raw) or []:
        for requirement in term.get("matchFields") or []:
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In":
                pinned |= set(requirement.get("values") or [])
    return next(iter(pinned)) if len(pinned) == 1 else None


# --- capacity while planning ---------------------------------------------------------------------


@dataclasses.dataclass
class _Room:
    """What a node has left while a plan is being made (mutable working copy)."""

    node: snapshot.Node
    free: int
    domains: list[list[int]]
    mig: dict[str, int]

    @classmethod
    def of(cls, node: snapshot.Node) -> _Room:
        mig = {profile: node.free_mig(profile) for profile in node.allocatable.mig}
        return cls(node, node.free_gpus, [list(d) for d in node.free_by_domain()], mig)

    def copy(self) -> _Room:
        return _Room(self.node, self.free, [list(d) for d in self.domains], dict(self.mig))

    def allocate(self, request: gpu.GpuRequest) -> placement.Allocation | None:
        """Where the request would land here; None if it does not fit (or would needlessly span domains)."""
        if any(self.mig.get(profile, 0) < count for profile, count in request.mig.items()):
            return None
        if request.full > self.free:
            return None
        choice = placement.allocate(self.domains, request.full)
        if choice is None:
            return None
        if self.node.topology.known and choice.spanned > 1 and request.full <= self.node.topology.domain_size:
            return None  # it could fit one domain of this node, just not now
        return choice

    def take(self, request: gpu.GpuRequest, choice: placement.Allocation) -> None:
        self.free -= request.full
        taken = set(choice.indices)
        self.domains = [[i for i in d if i not in taken] for d in self.domains]
        for profile, count in request.mig.items():
            self.mig[profile] = self.mig.get(profile, 0) - count


def _rooms(cluster: snapshot.Snapshot) -> dict[str, _Room]:
    rooms = {name: _Room.of(node) for name, node in cluster.nodes.items() if node.schedulable}
    # Released but not yet bound: their GPUs are spoken for on the node they are pinned to.
    for pod in sorted(cluster.pods.values(), key=lambda p: (p.created, p.key)):
        if (pod.node_name or pod.deleting or pod.phase in snapshot.TERMINAL_PHASES or pod.scheduling_gates
                or not pod.request.any):
            continue
        node = pinned_node(pod.raw)
        room = rooms.get(node) if node else None
        if room is None:
            continue
        choice = room.allocate(pod.request)
        if choice is not None:
            room.take(pod.request, choice)
        else:  # over-committed by our own view: still keep its count off the node
            room.free = max(0, room.free - pod.request.full)
    return rooms


def _candidates(pod: snapshot.Pod, cluster: snapshot.Snapshot) -> frozenset[str]:
    spec = pod.raw.get("spec") or {}
    out = set()
    for name, node in cluster.nodes.items():
        offers = node.allocatable
        if pod.request.full and not offers.full:
            continue
        if any(not offers.mig.get(profile) for profile in pod.request.mig):
            continue
        if fit.why_not(spec, node) is None:  # readiness, taints, nodeSelector, required node affinity
            out.add(name)
    return frozenset(out)


def _greedy(
    members: Sequence[snapshot.Pod],
    candidates: Mapping[str, frozenset[str]],
    rooms: Mapping[str, _Room],
    allowed: frozenset[str],
) -> tuple[dict[str, str], dict[str, _Room], list[str]] | None:
    """Largest member first: onto a node the gang already uses (tightest fit), else the emptiest new
    node (so fewer nodes are needed)."""
    trial: dict[str, _Room] = {}
    nodes: dict[str, str] = {}
    spanning: list[str] = []
    order = sorted(members, key=lambda p: (-p.request.full, -sum(p.request.mig.values()), p.key))
    for pod in order:
        best: tuple[tuple[bool, int, int, str], str, placement.Allocation] | None = None
        for name in sorted(candidates[pod.key] & allowed):
            if name not in rooms:
                continue
            room = trial.get(name) or rooms[name]
            choice = room.allocate(pod.request)
            if choice is None:
                continue
            fresh = name not in trial
            rank = (fresh, choice.spanned, -room.free if fresh else room.free - pod.request.full, name)
            if best is None or rank < best[0]:
                best = (rank, name, choice)
        if best is None:
            return None
        _, name, choice = best
        if name not in trial:
            trial[name] = rooms[name].copy()
        trial[name].take(pod.request, choice)
        nodes[pod.key] = name
        if choice.spanned > 1:
            spanning.append(pod.key)
    return nodes, trial, sorted(spanning)


def _place(
    members: Sequence[snapshot.Pod],
    candidates: Mapping[str, frozenset[str]],
    rooms: Mapping[str, _Room],
    allowed: frozenset[str],
) -> tuple[Placement, dict[str, _Room]] | None:
    """The best simultaneous placement: one node (the tightest), else one NVLink clique, else the
    fewest nodes. Each option is a greedy fill of a node subset; the best-ranked result wins."""
    usable = frozenset(n for n in allowed if n in rooms)
    everyone = frozenset.intersection(*(candidates[p.key] for p in members)) & usable if members else usable
    cliques: dict[str, set[str]] = {}
    for name in usable:
        clique = rooms[name].node.topology.clique
        if clique:
            cliques.setdefault(clique, set()).add(name)
    options = [frozenset([n]) for n in sorted(everyone)] + [frozenset(n) for _, n in sorted(cliques.items())]
    best: tuple[tuple[int, int, int, str], Placement, dict[str, _Room]] | None = None
    for nodes in [*options, usable]:
        result = _greedy(members, candidates, rooms, nodes)
        if result is None:
            continue
        assigned, trial, spanning = result
        used = sorted(set(assigned.values()))
        held = {rooms[n].node.topology.clique for n in used}
        clique = next(iter(held)) if len(held) == 1 else None
        together = len(used) == 1 or clique is not None
        leftover = sum(trial[n].free for n in used)
        rank = (0 if together else 1, len(used), leftover, ",".join(used))
        if best is None or rank < best[0]:
            best = (rank, Placement(assigned, clique, tuple(spanning)), trial)
    return None if best is None else (best[1], best[2])


def place(members: Sequence[snapshot.Pod], *, cluster: snapshot.Snapshot) -> Placement | None:
    """Whether these pods fit the cluster all at once (e.g. for reclaim: after evicting some pods)."""
    candidates = {p.key: _candidates(p, cluster) for p in members}
    result = _place(members, candidates, _rooms(cluster), frozenset(cluster.nodes))
    return None if result is None else result[0]


# --- the planner ---------------------------------------------------------------------------------


def _member(pod: snapshot.Pod, *, gate: str, node: str | None = None) -> Member:
    return Member(pod.key, pod.uid, gate in pod.scheduling_gates, pod.request, pod.node_name or node)


def _present(pod: snapshot.Pod) -> bool:
    return not pod.deleting and pod.phase not in snapshot.TERMINAL_PHASES


def _alone(pod: snapshot.Pod, message: str, *, gate: str, reason: str = INVALID) -> Decision:
    return Decision(pod.key, Action.RELEASE_ALONE, message, "Warning", reason, (_member(pod, gate=gate),))


@dataclasses.dataclass(frozen=True)
class _Gang:
    key: str
    size: int
    members: tuple[snapshot.Pod, ...]  # present members, by key

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.members)

    @property
    def created(self) -> str:
        return min(p.created for p in self.members)

    @property
    def placing(self) -> tuple[snapshot.Pod, ...]:
        """The members a release places and pins: those that request GPUs."""
        return tuple(p for p in self.members if p.request.any)

    def unpinned(self) -> str:
        """What a release says of its members without GPUs (un-gated with the rest, never pinned)."""
        free = [p.key for p in self.members if not p.request.any]
        return f"; un-gated with them, not pinned (no GPU): {', '.join(free)}" if free else ""

    def decide(
        self,
        action: Action,
        message: str,
        event_type: EventType,
        event_reason: str,
        *,
        members: tuple[Member, ...],
        waiting: Waiting | None = None,
        mark: tuple[str, ...] = (),
    ) -> Decision:
        return Decision(self.key, action, message, event_type, event_reason, members,
                        self.size, self.priority, self.created, waiting, mark)


def _group(
    cluster: snapshot.Snapshot, *, names: settings.Names
) -> tuple[list[_Gang], list[Decision], list[Decision]]:
    """Gangs with a gated member; pods released alone (invalid); gangs with nothing gated (for display)."""
    gate = names.gate
    found: dict[str, list[tuple[snapshot.Pod, gangs.Gang]]] = {}
    alone: list[Decision] = []
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        if not _present(pod):
            continue
        gang = gangs.identify(pod.raw, names=names, pod_groups=cluster.pod_groups)
        gated = gate in pod.scheduling_gates
        if gang is None:
            if gated:
                alone.append(_alone(pod, f"carries gate {gate} but names no gang; released", gate=gate))
            continue
        if gated and gang.enforced_elsewhere:
            alone.append(_alone(pod, f"gang {gang.key}: {gang.enforced_elsewhere}; our gate is not needed", gate=gate))
            continue
        if gated and gang.size is None:
            why = gang.problem or f"its size is unknown ({gang.convention} keeps it elsewhere)"
            alone.append(_alone(pod, f"gang {gang.key}: {why}; cannot tell when it is complete, released", gate=gate))
            continue
        found.setdefault(gang.key, []).append((pod, gang))

    ready: list[_Gang] = []
    idle: list[Decision] = []
    for key, entries in sorted(found.items()):
        pods = tuple(pod for pod, _ in entries)
        sizes = {size for _, g in entries if (size := g.size) is not None}
        if not any(gate in p.scheduling_gates for p in pods):
            idle.append(
                Decision(key, Action.NONE, "no member gated by us", None, None,
                         tuple(_member(p, gate=gate) for p in pods), size=max(sizes, default=None),
                         priority=max(p.priority for p in pods), created=min(p.created for p in pods))
            )
            continue
        if len(sizes) > 1:
            message = f"members disagree on the gang size ({', '.join(map(str, sorted(sizes)))}); released"
            alone += [_alone(p, f"gang {key}: {message}", gate=gate) for p in pods if gate in p.scheduling_gates]
            continue
        ready.append(_Gang(key, sizes.pop(), pods))
    return ready, alone, idle


def _before_queue(gang: _Gang, *, names: settings.Names, cfg: settings.Gangs, now: float) -> Decision | None:
    """The decision for a gang that cannot be queued for placement yet (None: queue it)."""
    gate, mark = names.gate, complete_mark(names)
    members = tuple(_member(p, gate=gate) for p in gang.members)
    gated = [p for p in gang.members if gate in p.scheduling_gates]
    count = len(gang.members)
    if len(gated) < count and (count >= gang.size or any(pinned_node(p.raw) for p in gated)):
        message = (f"{count - len(gated)} of {gang.size} members already released: releasing the other "
                   f"{len(gated)} now (an earlier release was interrupted, or a member was replaced)")
        return gang.decide(Action.RESUME, message, "Normal", RELEASED, members=members)
    if count < gang.size:
        if any(mark in p.annotations for p in gang.members) and not any(p.owner_kind for p in gang.members):
            message = (f"gang was complete, now {count} of {gang.size} members remain and nothing will "
                       "recreate the others; released")
            return gang.decide(Action.RELEASE_ALONE, message, "Warning", ORPHANED, members=members)
        age = now - (timestamps.epoch(gang.created) or now)
        present = f"{count} of {gang.size} members present"
        if age > cfg.timeout_seconds:
            message = (f"{present} after more than {cfg.timeout_seconds:g}s (the timeout); kept gated: "
                       "a partial gang is never released")
            return gang.decide(Action.TIMED_OUT, message, "Warning", INCOMPLETE, members=members,
                               waiting=Waiting.INCOMPLETE)
        return gang.decide(Action.WAIT, present, "Normal", WAITING, members=members, waiting=Waiting.INCOMPLETE)
    foreign = sorted({g for p in gated for g in p.scheduling_gates if g != gate})
    if foreign:
        message = f"complete; waiting for other controllers' gates: {', '.join(foreign)}"
        unmarked = tuple(p.key for p in gated if mark not in p.annotations)
        return gang.decide(Action.WAIT, message, "Normal", WAITING, members=members,
                           waiting=Waiting.OTHER_GATES, mark=unmarked)
    return None


def plan(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float) -> Plan:
    names, cfg = config.names, config.descheduler.gangs
    gate, mark = names.gate, complete_mark(names)
    ready, decisions, idle = _group(cluster, names=names)
    queue: list[_Gang] = []
    for gang in sorted(ready, key=lambda g: (-g.priority, g.created, g.key)):
        early = _before_queue(gang, names=names, cfg=cfg, now=now)
        if early is None:
            queue.append(gang)
        else:
            decisions.append(early)

    rooms = _rooms(cluster)
    demand: list[Demand] = []
    reserved: set[str] = set()  # nodes the blocked gangs ahead may use (backfill off)
    blockers: list[str] = []
    everywhere = frozenset(cluster.nodes)
    for gang in queue:
        placing = gang.placing
        if not placing:  # nothing holds GPUs: no room to find, no reason to queue behind GPU gangs
            message = f"no member requests a GPU: nothing to place, all {len(gang.members)} un-gated together"
            decisions.append(gang.decide(Action.RELEASE, message, "Normal", RELEASED,
                                         members=tuple(_member(p, gate=gate) for p in gang.members)))
            continue
        candidates = {p.key: _candidates(p, cluster) for p in placing}
        reachable: frozenset[str] = frozenset().union(*candidates.values())
        placed = _place(placing, candidates, rooms, everywhere if cfg.backfill else everywhere - reserved)
        if placed is not None:
            chosen, trial = placed
            rooms.update(trial)
            members = tuple(_member(p, gate=gate, node=chosen.nodes.get(p.key)) for p in gang.members)
            decisions.append(gang.decide(Action.RELEASE, chosen.describe() + gang.unpinned(), "Normal", RELEASED,
                                         members=members))
            continue
        members = tuple(_member(p, gate=gate) for p in gang.members)
        unmarked = tuple(p.key for p in gang.members if mark not in p.annotations)
        if not cfg.backfill and reserved & reachable and _place(placing, candidates, rooms, everywhere):
            message = (f"complete; fits, but queued behind {', '.join(blockers)} (backfill off: "
                       "the nodes they could use are kept for them)")
            decisions.append(gang.decide(Action.WAIT, message, "Normal", WAITING, members=members,
                                         waiting=Waiting.QUEUED, mark=unmarked))
        else:
            message, missing, never = _shortfall(placing, candidates, rooms)
            decisions.append(gang.decide(Action.WAIT, message, "Warning" if never else "Normal", WAITING,
                                         members=members, waiting=Waiting.CAPACITY, mark=unmarked))
            demand.append(Demand(gang.key, gang.priority, gang.created, placing, tuple(sorted(reachable)), missing))
        reserved |= reachable
        blockers.append(gang.key)
    return Plan(tuple(decisions) + tuple(idle), tuple(demand))


def _shortfall(
    members: Sequence[snapshot.Pod], candidates: Mapping[str, frozenset[str]], rooms: Mapping[str, _Room]
) -> tuple[str, int, bool]:
    """Why a complete gang does not fit: (message, full GPUs missing, can never fit)."""
    homeless = [p.key for p in members if not candidates[p.key]]
    if homeless:
        return f"complete; {', '.join(homeless)} match no GPU node (taints, selectors, affinity)", 0, True
    nodes = frozenset().union(*candidates.values())
    need = sum(p.request.full for p in members)
    free = sum(rooms[n].free for n in nodes if n in rooms)
    total = sum(rooms[n].node.allocatable.full for n in nodes if n in rooms)
    if need > total:
        return (f"complete; needs {need} GPUs but the nodes it may use have {total} in all: it can never fit "
                "as the cluster stands", need - free, True)
    if need > free:
        return f"complete; waiting for {need - free} more free GPUs ({need} needed, {free} free on its nodes)", \
            need - free, False
    return (f"complete; {free} GPUs free on its nodes but not in a simultaneous placement with each member "
            "inside one NVLink domain (fragmented)", 0, False)
