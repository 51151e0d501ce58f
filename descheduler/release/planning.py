"""Gang release planning: which gated gangs may start now, where, and why the others wait.

Pure: a `Snapshot`, the settings and `now` in, decisions with their reasons out. The shell
(`descheduler.release.controller`) applies them. Rules, in the order they are checked:

- A gated pod (our gate) that names no gang is a gang of one: the webhook gated it so that it is placed
  exactly at release (`admission.gating`), and it goes through every rule below like any gang.
- A gated pod (our gate) whose gang labels are unusable — a bad size, no size we can know, a gang
  another scheduler enforces, members disagreeing on the size — or that names no gang and requests no
  GPU, is released alone with a Warning `GangInvalid`: a gate nobody can ever lift correctly must not
  strand it.
- A gang that has already started (some present member carries no gate of ours) releases its gated
  rest at once if it is complete or a gated member is already nominated (a release was interrupted: controller
  restart, API error). Holding them back would only keep the started part waiting for siblings; as ordinary
  Pending pods they can also use the scheduler's preemption. Nominations already set are kept; no new ones are
  added.
- A gated member already nominated (`status.nominatedNodeName`: by an interrupted release of ours, or by anyone
  else, e.g. native topology-aware scheduling) keeps its nomination: it is never overwritten. The model counts it
  on that node (`snapshot`: a nominated pod holds its node) and the release places only the other members; a
  single pod so nominated is released at once without a nomination of ours.
- A gang seen complete earlier (our mark annotation) that lost members, none of whom has an owner
  that would recreate them, is orphaned: its gated members are released with a Warning `GangOrphaned`.
- A gang with fewer present members than its size waits; after `descheduler.gangs.timeout_seconds`
  (from its first member's creation) it gets a Warning `GangIncomplete` and still waits: a partial
  gang is never released.
- A complete gang whose members still carry another controller's gate (e.g. Kueue's admission)
  waits for it: planning now could nominate it to capacity that is gone when the other gate lifts.
- Complete gangs are queued by priority (highest member priority), then creation (oldest member),
  and each is placed on what the gangs before it left (`descheduler.release.layout`, on the one
  capacity model `common.capacity`: GPUs per NVLink domain, CPU, memory, pod slots and every other
  requested resource; bound, terminating, nominated and released-but-unbound pods all hold theirs).
  Pods this controller released that the snapshot does not show yet (`assumed`) hold their node too.
- Backfill off (default): a gang that cannot be placed reserves every node it could use; gangs
  behind it may start only on other nodes. Backfill on: they may use any free GPUs — better
  utilisation, but a large gang can starve behind a stream of small ones. A reservation is bounded:
  a gang that can never fit as the cluster stands reserves nothing, and none reserves for longer than
  `descheduler.gangs.reservation_seconds`. A single pod (a gang of one) reserves nothing: as with the
  stock scheduler, smaller pods may use what a larger one waits for.
- A single pod (a gang of one) that fits no node now (reserved nodes included) but would fit once
  kube-scheduler's preemption removed pods of lower priority (`layout.preemptible`; its preemptionPolicy is not
  Never) is released at once without a nomination, with a `ReleasedToPreempt` Event: a gated pod is invisible to
  preemption, and kube-scheduler nominates it itself where it preempts. Never on a node whose GPUs are DRA devices
  (kube-scheduler does not preempt for them; for gangs too).
- A gang of several that fits nowhere now (not even on nodes kept for gangs ahead) but whose every member would fit
  once preemption removed pods of lower priority than all of its members (`layout.preempting`: every member's
  preemptionPolicy not Never; equal priority is never preempted) is planned all at once on that view and released at
  once, with a `ReleasedToPreempt` Event: a member that fits free room is nominated there; a member that needs a
  preemption is released without a nomination, so kube-scheduler preempts for it where its own rules choose and
  nominates it itself (a nomination of ours to a full node would only hold that node against other pods, never
  choose the victims). All members are un-gated together; the release's expected outcome (every member bound within
  `descheduler.gangs.bind_bound_seconds`) is checked by `outcomes`, which reports the gang if it is not met. A gang
  that only partly fits even after preemption waits (never started in part). Nodes an earlier placement of the
  same pass changed are not counted as preemptible.
- No pod waits on us forever: a complete gang that cannot be placed within
  `descheduler.gangs.max_wait_seconds` (a gang of one; several members: `gang_max_wait_seconds`) is
  released without a nomination with a Warning `ReleasedUnplaced`, so that kube-scheduler's preemption and cluster
  autoscalers, which ignore gated pods, can act on it.
- Each member is nominated to the single node planned for it (`status.nominatedNodeName`), never pinned: the
  scheduler tries that node first and binds the member elsewhere only if it no longer fits, so nothing strands.
- Members that request no GPU (an MPI launcher counted in the gang's size) count toward completeness
  and are un-gated together with the rest, but are neither placed nor nominated: holding a GPU node for such a pod
  would take a place a GPU pod needs. So are members whose constraints the capacity model does not evaluate
  (`capacity.ungoverned`: own inter-pod affinity, hard topology spread, claims, volumes): the model cannot say
  where they fit. Such a gang is released with an expected outcome — every member bound within
  `descheduler.gangs.bind_bound_seconds` — that `outcomes` checks on every pass: if a member is not bound by then,
  every member gets a Warning and the gang is reported (docs/placement.md). A gang without any member to place is
  released as soon as it is complete (and no other controller's gate is left).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from common import capacity, gangs, gpu, hostports, resources, settings, snapshot, timestamps
from descheduler.release import layout, patches

EventType = Literal["Normal", "Warning"]

RELEASED = "GangReleased"
WAITING = "GangWaiting"
INCOMPLETE = "GangIncomplete"
INVALID = "GangInvalid"
ORPHANED = "GangOrphaned"
UNPLACED = "ReleasedUnplaced"
PREEMPTING = "ReleasedToPreempt"


def complete_mark(names: settings.Names) -> str:
    """Annotation the controller sets on members of a complete gang that has to wait (when it was seen)."""
    return f"{names.prefix}gang-complete-since"


class Action(enum.StrEnum):
    RELEASE = "release"  # placed: nominate each member to its node, then remove our gate from all
    RESUME = "resume"  # already started: remove our gate from the rest now
    RELEASE_ALONE = "release-alone"  # invalid, orphaned, past its max wait or to preempt: un-gate, no nomination
    WAIT = "wait"
    TIMED_OUT = "timed-out"  # incomplete past the timeout: still waits, with a warning
    NONE = "none"  # no member carries our gate


class Waiting(enum.StrEnum):
    INCOMPLETE = "incomplete"
    OTHER_GATES = "other-gates"
    CAPACITY = "capacity"
    QUEUED = "queued"


# What the user can do, at the end of every waiting message (Event and `gpu-steward gangs`).
TO_DO = {
    Waiting.INCOMPLETE: "create its missing members, or delete its pods to give it up",
    Waiting.OTHER_GATES: "it starts once those controllers lift their gates (Kueue: once it admits the workload)",
    Waiting.QUEUED: "it starts after them, or set descheduler.gangs.backfill to let it pass",
    Waiting.CAPACITY: "it starts as GPUs free up (idle reclaim may free them for it), or ask for fewer GPUs",
}
NEVER_TO_DO = "ask for fewer GPUs or less of each resource, or add nodes it can use"


def to_do(message: str, what: str) -> str:
    return f"{message}; what to do: {what}"


@dataclasses.dataclass(frozen=True)
class MemberStatus:
    key: str
    uid: str
    gated: bool  # carries our gate
    request: gpu.GpuRequest
    node: str | None  # bound node, else its nomination (anyone's), else the planned node (RELEASE), else None
    nominated: bool = False  # already nominated (by anyone): kept, never overwritten
    one_domain: bool = False  # planned inside one NVLink domain (what `outcomes` checks once it is bound)
    domain: tuple[int, ...] = ()  # the GPU indices of that NVLink domain, where known (its claim asks it first)


@dataclasses.dataclass(frozen=True)
class Decision:
    gang: str  # namespace/name; the pod key for a pod with no usable gang
    action: Action
    message: str  # why, for the Event and the CLI
    event_type: EventType | None  # None: no event
    event_reason: str | None
    members: tuple[MemberStatus, ...]
    size: int | None = None
    priority: int = 0
    created: str = ""  # the oldest member's creation time
    waiting: Waiting | None = None
    mark: tuple[str, ...] = ()  # members to annotate with complete_mark()
    single: bool = False  # a gated pod that names no gang (a gang of one)
    summary: str = ""  # the Event's text when shorter than `message` (a single pod's release)

    @property
    def ungate(self) -> tuple[str, ...]:
        """Members whose gate is to be removed now (after nominating, for RELEASE)."""
        if self.action in (Action.RELEASE, Action.RESUME, Action.RELEASE_ALONE):
            return tuple(m.key for m in self.members if m.gated)
        return ()

    @property
    def nominations(self) -> Mapping[str, str]:
        """pod key -> node to nominate it to before un-gating (RELEASE only; never a pod nominated already)."""
        if self.action is not Action.RELEASE:
            return {}
        return {m.key: m.node for m in self.members if m.gated and m.node and not m.nominated}


@dataclasses.dataclass(frozen=True)
class Shortage:
    """A complete gang waiting only for free GPUs: what the idle-reclaim loop may free capacity for."""

    gang: str
    priority: int
    created: str
    members: tuple[snapshot.Pod, ...]  # the members to place (those that request GPUs)
    nodes: tuple[str, ...]  # nodes some member may use
    missing_gpus: int  # full GPUs short on those nodes (0: enough in number, too fragmented)


@dataclasses.dataclass(frozen=True)
class ReleasePlan:
    decisions: tuple[Decision, ...]  # invalid first, then by queue order
    shortages: tuple[Shortage, ...]  # complete gangs waiting only for GPUs: what reclaim may free capacity for
    left: Mapping[str, capacity.Room] = dataclasses.field(default_factory=dict)  # each node's room after the plan


def place(members: Sequence[snapshot.Pod], *, cluster: snapshot.Snapshot,
          scoring: settings.Scoring | None = None) -> layout.Layout | None:
    """Whether these pods fit the cluster all at once (e.g. for reclaim: after evicting some pods)."""
    candidates = {p.key: layout.candidates(p, cluster) for p in members}
    result = layout.place(members, candidates, layout.rooms(cluster), frozenset(cluster.nodes),
                                 scoring=scoring or settings.Scoring())
    return None if result is None else result[0]


# --- the planner ---------------------------------------------------------------------------------


def _member(pod: snapshot.Pod, *, gate: str, node: str | None = None, one_domain: bool = False,
            domain: tuple[int, ...] = ()) -> MemberStatus:
    nominated = patches.nominated(pod.raw)
    return MemberStatus(pod.key, pod.uid, gate in pod.scheduling_gates, pod.request,
                        pod.node_name or nominated or node, nominated is not None, one_domain and not nominated,
                        domain if one_domain and not nominated else ())


def _present(pod: snapshot.Pod) -> bool:
    return not pod.deleting and pod.phase not in snapshot.TERMINAL_PHASES


def _alone(pod: snapshot.Pod, message: str, *, gate: str, reason: str = INVALID) -> Decision:
    return Decision(pod.key, Action.RELEASE_ALONE, message, "Warning", reason, (_member(pod, gate=gate),))


@dataclasses.dataclass(frozen=True)
class _Gang:
    key: str
    size: int
    members: tuple[snapshot.Pod, ...]  # present members, by key
    single: bool = False  # a pod we gated for placement that names no gang: a gang of one

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.members)

    @property
    def created(self) -> str:
        return min(p.created for p in self.members)

    @property
    def placing(self) -> tuple[snapshot.Pod, ...]:
        """The members a release places and nominates: those that request GPUs, whose constraints the capacity
        model evaluates and that nobody has nominated yet."""
        return tuple(p for p in self.members if p.request.any and not _ungoverned(p) and not _kept(p))

    def unplaced(self) -> str:
        """What a release says of its members it does not nominate (un-gated with the rest)."""
        free = [p.key for p in self.members if not p.request.any]
        kept = [f"{p.key} (to {node})" for p in self.members if p.request.any and (node := _kept(p))]
        odd = [f"{p.key} ({why})" for p in self.members if p.request.any and not _kept(p) and (why := _ungoverned(p))]
        return "".join([f"; un-gated with them, not nominated (no GPU): {', '.join(free)}" if free else "",
                        f"; nominated already, kept: {', '.join(kept)}" if kept else "",
                        f"; un-gated with them, not nominated: {', '.join(odd)}"
                        if odd else ""])

    def waited(self, *, mark: str, now: float) -> float:
        """How long it has been ready to place: a gang of one since its creation; a gang since it was first
        seen complete (our mark), else since its newest member's creation."""
        if self.single:
            since = timestamps.epoch(self.created)
        else:
            marks = [t for p in self.members if (t := timestamps.epoch(p.annotations.get(mark)))]
            since = min(marks) if marks else timestamps.epoch(max(p.created for p in self.members))
        return max(0.0, now - (since if since is not None else now))

    def decide(
        self,
        action: Action,
        message: str,
        event_type: EventType | None,
        event_reason: str | None,
        *,
        members: tuple[MemberStatus, ...],
        waiting: Waiting | None = None,
        mark: tuple[str, ...] = (),
        summary: str = "",
    ) -> Decision:
        return Decision(self.key, action, message, event_type, event_reason, members,
                        self.size, self.priority, self.created, waiting, mark, self.single, summary)


def _group(
    cluster: snapshot.Snapshot, *, names: settings.Names
) -> tuple[list[_Gang], list[Decision], list[Decision]]:
    """Gangs with a gated member (gated single pods as gangs of one); pods released alone (invalid); gangs
    with nothing gated (for display)."""
    gate = names.gate
    found: dict[str, list[tuple[snapshot.Pod, gangs.Gang]]] = {}
    alone: list[Decision] = []
    singles: list[_Gang] = []
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        if not _present(pod):
            continue
        gang = gangs.identify(pod.raw, names=names, pod_groups=cluster.pod_groups)
        gated = gate in pod.scheduling_gates
        if gang is None:
            if gated and pod.request.any:
                singles.append(_Gang(pod.key, 1, (pod,), single=True))
            elif gated:
                alone.append(_alone(pod, f"carries gate {gate}, names no gang and requests no GPU; released",
                                    gate=gate))
            continue
        if gated and gang.enforced_elsewhere:
            alone.append(_alone(pod, f"gang {gang.key}: {gang.enforced_elsewhere}; our gate is not needed", gate=gate))
            continue
        if gated and gang.size is None:
            why = gang.problem or f"its size is unknown ({gang.convention} keeps it elsewhere)"
            alone.append(_alone(pod, f"gang {gang.key}: {why}; cannot tell when it is complete, released", gate=gate))
            continue
        found.setdefault(gang.key, []).append((pod, gang))

    ready: list[_Gang] = singles
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
    if len(gated) < count and (count >= gang.size or any(patches.nominated(p.raw) for p in gated)):
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
            return gang.decide(Action.TIMED_OUT, to_do(message, TO_DO[Waiting.INCOMPLETE]), "Warning", INCOMPLETE,
                               members=members, waiting=Waiting.INCOMPLETE)
        # No Event while a gang may still be arriving (members created in a burst): only once it has stayed
        # incomplete for the grace.
        told = age >= cfg.incomplete_event_grace_seconds
        return gang.decide(Action.WAIT, to_do(present, TO_DO[Waiting.INCOMPLETE]), "Normal" if told else None,
                           WAITING if told else None, members=members, waiting=Waiting.INCOMPLETE)
    foreign = sorted({g for p in gated for g in p.scheduling_gates if g != gate})
    if foreign:
        message = to_do(f"complete; waiting for other controllers' gates: {', '.join(foreign)}",
                        TO_DO[Waiting.OTHER_GATES])
        unmarked = tuple(p.key for p in gated if mark not in p.annotations)
        return gang.decide(Action.WAIT, message, "Normal", WAITING, members=members,
                           waiting=Waiting.OTHER_GATES, mark=unmarked)
    return None


def _ungoverned(pod: snapshot.Pod) -> str | None:
    return capacity.ungoverned(pod.raw.get("spec") or {}, claims=pod.dra)


def _kept(pod: snapshot.Pod) -> str | None:
    """A gated pod's nomination, which a release keeps (an interrupted release of ours, or anyone else's)."""
    return patches.nominated(pod.raw) if pod.node_name is None else None


def plan(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float,
         assumed: Mapping[str, str] = {}) -> ReleasePlan:
    """`assumed`: pods this controller released (pod key -> nominated node, or "" without one) that the snapshot
    may not show released yet: they hold their node and are not planned again."""
    names, cfg = config.names, config.descheduler.gangs
    gate, mark = names.gate, complete_mark(names)
    ready, decisions, idle = _group(cluster, names=names)
    queue: list[_Gang] = []
    for gang in sorted(ready, key=lambda g: (-g.priority, g.created, g.key)):
        if any(p.key in assumed for p in gang.members if gate in p.scheduling_gates):
            continue  # released already; the snapshot is behind our own writes
        early = _before_queue(gang, names=names, cfg=cfg, now=now)
        if early is None:
            queue.append(gang)
        else:
            decisions.append(early)

    held = {k: n for k, n in assumed.items() if n}
    rooms = layout.rooms(cluster, assumed=held)
    touched = set(held.values())  # nodes whose rooms this plan changed: preemption is not counted on them
    contested = layout.contested(cluster)
    shortages: list[Shortage] = []
    reserved: set[str] = set()  # nodes the blocked gangs ahead may use (backfill off)
    blockers: list[str] = []
    everywhere = frozenset(cluster.nodes)
    for gang in queue:
        placing = gang.placing
        if not placing:  # nothing to place: no room to find, no reason to queue behind GPU gangs
            message = (f"no member to place: all {len(gang.members)} un-gated together, none nominated by us"
                       f"{gang.unplaced()}")
            decisions.append(gang.decide(Action.RELEASE, message, "Normal", RELEASED,
                                         members=tuple(_member(p, gate=gate) for p in gang.members)))
            continue
        candidates = {p.key: layout.candidates(p, cluster) for p in placing}
        reachable: frozenset[str] = frozenset().union(*candidates.values())
        allowed = everywhere if cfg.backfill else everywhere - reserved
        placed = layout.place(placing, candidates, rooms, allowed, scoring=config.scoring, contested=contested)
        if placed is not None:
            chosen, trial = placed
            rooms.update(trial)
            touched.update(trial)
            members = tuple(_member(p, gate=gate, node=chosen.nodes.get(p.key),
                                    one_domain=p.key in chosen.nodes and p.key not in chosen.spanning,
                                    domain=chosen.domains.get(p.key, ()))
                            for p in gang.members)
            decisions.append(gang.decide(Action.RELEASE, chosen.describe() + gang.unplaced(), "Normal", RELEASED,
                                         members=members, summary=chosen.describe(short=True) + gang.unplaced()))
            continue
        members = tuple(_member(p, gate=gate) for p in gang.members)
        # Backfill off: it may fit now, on nodes kept for the gangs ahead.
        queued = not cfg.backfill and bool(reserved & reachable) and layout.place(
            placing, candidates, rooms, everywhere, scoring=config.scoring) is not None
        if gang.single and not queued and (
                room := layout.preemptible(placing[0], candidates[placing[0].key] - touched, cluster)):
            # Gated, it is invisible to kube-scheduler's preemption: released at once without a nomination, it preempts
            # as the stock scheduler would have (which pods, on which node, is the scheduler's choice; it nominates it).
            message = (f"fits no node now; {room}: released at once without a nomination so that kube-scheduler "
                       "preempts for it")
            decisions.append(gang.decide(Action.RELEASE_ALONE, message, "Normal", PREEMPTING, members=members))
            continue
        if not gang.single and not queued and (pre := layout.preempting(
                placing, candidates, rooms, cluster, allowed, scoring=config.scoring,
                untouched=everywhere - touched, contested=contested)):
            # Gated, its members are invisible to kube-scheduler's preemption: all released together; those with free
            # room nominated there, those that need a preemption left to kube-scheduler's (it nominates them itself).
            rooms.update(pre.rooms)
            touched.update(pre.rooms)
            members = tuple(_member(p, gate=gate, node=None if p.key in pre.preempting else pre.layout.nodes.get(p.key),
                                    one_domain=p.key in pre.layout.nodes and p.key not in pre.layout.spanning)
                            for p in gang.members)
            message = (f"{pre.describe()}{gang.unplaced()}; released at once, members that need a preemption without "
                       "a nomination, so that kube-scheduler preempts for them")
            decisions.append(gang.decide(Action.RELEASE, message, "Normal", PREEMPTING, members=members))
            continue
        waited = gang.waited(mark=mark, now=now)
        limit = cfg.max_wait_seconds if gang.single else cfg.gang_max_wait_seconds
        if waited > limit:
            message, _, _ = layout.shortfall(placing, candidates, rooms, cluster)
            message = (f"not placed within {limit:g}s ({message}); released without a nomination so that "
                       "kube-scheduler's preemption and cluster autoscalers can act on it")
            decisions.append(gang.decide(Action.RELEASE_ALONE, message, "Warning", UNPLACED, members=members))
            continue
        unmarked = () if gang.single else tuple(p.key for p in gang.members if mark not in p.annotations)
        never = False
        if queued:
            message = to_do(f"complete; fits, but queued behind {', '.join(blockers)} (backfill off: "
                            "the nodes they could use are kept for them)", TO_DO[Waiting.QUEUED])
            decisions.append(gang.decide(Action.WAIT, message, "Normal", WAITING, members=members,
                                         waiting=Waiting.QUEUED, mark=unmarked))
        else:
            message, missing, never = layout.shortfall(placing, candidates, rooms, cluster)
            message = to_do(message + "; reserves no node", NEVER_TO_DO) if never else to_do(
                message, TO_DO[Waiting.CAPACITY])
            decisions.append(gang.decide(Action.WAIT, message, "Warning" if never else "Normal", WAITING,
                                         members=members, waiting=Waiting.CAPACITY, mark=unmarked))
            if not never:
                shortages.append(Shortage(gang.key, gang.priority, gang.created, placing, tuple(sorted(reachable)),
                                     missing))
        # A gang that can never fit would hold its nodes forever; none holds them past the reservation bound. A single
        # pod holds none: like the stock scheduler, smaller pods may use what a larger one waits for.
        if not never and not gang.single and waited <= cfg.reservation_seconds:
            reserved |= reachable
            blockers.append(gang.key)
    return ReleasePlan(tuple(decisions) + tuple(idle), tuple(shortages), rooms)


def _holders(cluster: snapshot.Snapshot, node: str) -> Mapping[str, Mapping[str, int]]:
    """Every pod holding the node (GPU pods or not: bound or nominated) -> its requests; indexed
    once per snapshot."""
    key = ("planning.holders",)
    index: dict[str, dict[str, Mapping[str, int]]] | None = cluster.memo.get(key)
    if index is None:
        index = {}
        for pod_key, (_, entry) in cluster.parsed.items():
            if entry.held_on:
                index.setdefault(entry.held_on, {})[pod_key] = entry.requests
        cluster.memo[key] = index
    return index.get(node, {})


def overtaken(decision: Decision, *, planned: snapshot.Snapshot, fresh: snapshot.Snapshot,
              left: Mapping[str, capacity.Room], names: settings.Names, assumed: Mapping[str, str] = {},
              unbuilt: Mapping[str, Mapping[str, Any]] = {}) -> str | None:
    """Why a release planned on `planned` must not nominate its members where planned now that `fresh` (a newer
    snapshot, kept current by the feeder's watch) shows its nodes (None: it still may). Asked right before the release's
    first call: a pod bound to (or nominated to) a node since the plan takes it from the nomination only when it needs
    more than the plan left free there (`left`: the nodes' rooms after every release of the plan; a pod this controller
    released meanwhile, `assumed`, is counted there already on the node it was nominated to, and only there); a node
    gone, cordoned or no longer ready, a filter that now refuses a member (taints, labels, a host port or an
    anti-affinity term of a pod there) take it too.
    `unbuilt`: pods the watch delivered since `fresh` was built that newly hold a node (key -> object,
    `feeder.Feeder.unbuilt`; one `fresh` shows already is not counted twice): they count as arrivals too (their
    requests as the snapshot counts them, DRA GPUs included, and their host ports against the members'; not their
    anti-affinity), so that a pod kube-scheduler bound there a moment ago is seen before the nomination goes out, not
    a rebuild later; one whose requests cannot be read takes the node. A gang is judged as a unit: one node taken
    holds back all of its members, to be planned afresh on the next pass."""
    pins = decision.nominations
    if not pins or (fresh is planned and not unbuilt):
        return None
    late_on: dict[str, dict[str, Mapping[str, Any]]] = {}
    for key, raw in unbuilt.items():
        if (node_name := snapshot.held_on(raw)) is not None:
            late_on.setdefault(node_name, {})[key] = raw
    for name in sorted(set(pins.values())):
        members = sorted(k for k, n in pins.items() if n == name)
        if fresh is not planned:  # on the plan's own snapshot its filters let the members in
            node = fresh.nodes.get(name)
            if node is None or not node.schedulable:
                return f"node {name} is gone, cordoned or not ready since the plan"
            for key in members:
                pod = fresh.pods.get(key)
                why = capacity.never_pod(pod, node) if pod is not None else f"{key} is gone"
                if why:
                    return f"node {name} refuses {key} since the plan: {why}"
        before = _holders(planned, name)
        arrived = {k: r for k, r in _holders(fresh, name).items() if k not in before and assumed.get(k) != name}
        late = {k: raw for k, raw in late_on.get(name, {}).items()
                if k not in before and assumed.get(k) != name and k not in arrived}
        for key, raw in sorted(late.items()):
            try:
                entry = snapshot.parse(raw, names=names, inventory=fresh.dra)
            except (ValueError, TypeError) as exc:
                return f"node {name} was taken since the plan by {key} (not in a snapshot yet; its requests: {exc})"
            arrived[key] = entry.requests
            for member in members:
                if (pod := fresh.pods.get(member)) is not None and (
                        clash := hostports.conflicts(pod.host_ports, entry.host_ports)):
                    return (f"node {name} was taken since the plan by {key} (not in a snapshot yet): host port "
                            f"{clash[0][2]}/{clash[0][1]} that {member} needs")
        if not arrived:
            continue
        grown = resources.add(*arrived.values(), {resources.PODS: len(arrived)})
        room = left.get(name)
        free = room.free if room is not None else {}
        short = sorted(r for r, amount in grown.items() if amount > 0 and amount > free.get(r, 0))
        if short:
            unseen = " (not in a snapshot yet)" if late else ""
            return (f"node {name} was taken since the plan by {', '.join(sorted(arrived))}{unseen} "
                    f"(short of {', '.join(short)})")
    return None
