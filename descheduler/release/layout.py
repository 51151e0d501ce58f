"""Where a gang (or a single pod, a gang of one) goes at release: a search over the one capacity model.

Pure. Every member at once, each within one NVLink domain where the node's topology is known (a member
larger than the node's domains spans the fewest), on what is free now (`common.capacity`).
- A gang of several members: one node (the tightest), else one multi-node NVLink clique, else the fewest
  nodes; the largest member first, onto a node the gang already uses (tightest) before a new one (the
  emptiest, so fewer nodes are needed).
- A gang of one (a single pod we govern): the node with the best NVLink score (`common.nvlink_score`: the
  brief's rule, the same as the webhook's ranking), then the packing rule: the fewest free GPUs left on the
  node after it, then on the NVLink domain it lands in (the placement policy fills the smallest free domain
  that fits). Whole domains and whole nodes so stay free for the pods that need them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from common import capacity, nvlink_score, placement, settings, snapshot


@dataclasses.dataclass(frozen=True)
class Layout:
    nodes: Mapping[str, str]  # pod key -> node
    clique: str | None  # the multi-node NVLink domain holding the whole gang, if one does
    spanning: tuple[str, ...]  # members that span several NVLink domains (larger than any)
    why: str = ""  # a gang of one: its score and what decided
    short: str = ""  # a gang of one: its score and what is left, for its Event
    apart: str = "no single node or NVLink clique could hold the gang: fewest nodes"  # why several unrelated nodes
    # pod key -> the GPU indices of the one NVLink domain its GPUs are planned in (its claim of its own asks it
    # first: `common.domain_claim`); absent where it spans domains or the node's topology is not known
    domains: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def describe(self, *, short: bool = False) -> str:
        used = sorted(set(self.nodes.values()))
        if len(self.nodes) == 1 and self.why:
            return f"placed on {used[0]}: {self.short if short and self.short else self.why}"
        where = f"{len(self.nodes)} members on {len(used)} node(s) ({', '.join(used)})"
        if len(used) == 1:
            why = "one node"
        elif self.clique:
            why = f"one multi-node NVLink domain {self.clique}"
        else:
            why = self.apart
        domains = (
            f"; {', '.join(self.spanning)} span several NVLink domains (larger than one)"
            if self.spanning
            else "; each member within one NVLink domain"
        )
        return f"{where}: {why}{domains}"


Rooms = Mapping[str, capacity.Room]


def _domain(room: capacity.Room, choice: placement.Allocation) -> tuple[int, ...]:
    """The indices of the one NVLink domain `choice` is in; () when it spans several or the topology is unknown."""
    topo = room.node.topology
    return tuple(topo.domains[choice.domains[0]]) if choice.spanned == 1 and topo.known else ()
NOWHERE = placement.Allocation((), ())  # taken when a pod's GPU indices are not known: its requests still count


def rooms(cluster: snapshot.Snapshot, *, assumed: Mapping[str, str] = {}) -> dict[str, capacity.Room]:
    """Every schedulable node's room now. `assumed`: pods we released (pod key -> node) that the snapshot
    does not show holding that node yet; their requests are taken from it, as the scheduler's cache does."""
    out = {name: capacity.Room.of(node) for name, node in cluster.nodes.items() if node.schedulable}
    for key, node in sorted(assumed.items()):
        pod, room = cluster.pods.get(key), out.get(node)
        if pod is None or room is None or pod.held_on is not None:
            continue
        choice = room.place_pod(pod, one_domain=False)
        if isinstance(choice, placement.Allocation):
            room.take_pod(pod, choice)
        else:  # over-committed in our view: still keep what it asks off the node
            room.take_pod(pod, NOWHERE)
    return out


def candidates(pod: snapshot.Pod, cluster: snapshot.Snapshot) -> frozenset[str]:
    """Nodes the pod could ever run on as they stand: the scheduler's filters and what they offer at all.
    Pods alike in what the filters read and in their requests (a Job's pods) are answered once per snapshot."""
    shape = capacity.key(pod, cluster)
    key = ("layout.candidates", shape)
    found: frozenset[str] | None = cluster.memo.get(key) if shape is not None else None
    if found is None:
        found = frozenset(name for name, node in cluster.nodes.items() if capacity.never_pod(pod, node) is None)
        if shape is not None:
            cluster.memo[key] = found
    return found


_Rank = tuple[float, int, int, int, str]
Contested = Mapping[str, int]  # node -> pending pods that prefer it (`contested`)


def contested(cluster: snapshot.Snapshot) -> Contested:
    """Per node, the pending pods kube-scheduler may bind there at any moment that no plan of ours counts: GPU pods
    not bound, holding nothing (not nominated), carrying no scheduling gate and not terminating,
    whose preferred node-affinity terms name the node (`matchFields metadata.name In`, as the webhook writes them for
    the pods it does not gate). A tie-break only: among nodes release ranks equal, it takes the one fewer such pods
    prefer, so that a nomination and a never-gated pod race for the same node less often. Counting them as holding
    the node instead cost gated pods their nodes (issue #20). Once per snapshot."""
    key = ("layout.contested",)
    found: dict[str, int] | None = cluster.memo.get(key)
    if found is None:
        found = {}
        for pod in cluster.pods.values():
            if (pod.node_name or pod.held_on or pod.scheduling_gates or pod.deleting or not pod.request.any
                    or pod.phase != "Pending"):
                continue
            for node in _preferred_nodes(pod.raw):
                found[node] = found.get(node, 0) + 1
        cluster.memo[key] = found
    return found


def _preferred_nodes(raw: Mapping[str, Any]) -> frozenset[str]:
    affinity = ((raw.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    named: set[str] = set()
    for term in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
        for requirement in (term.get("preference") or {}).get("matchFields") or ():
            if requirement.get("key") == snapshot.NAME_FIELD and requirement.get("operator") == "In":
                named.update(str(v) for v in requirement.get("values") or ())
    return frozenset(named)


Scores = dict[tuple[object, ...], "nvlink_score.NodeScore | None"]


def _score(room: capacity.Room, need: int, scoring: settings.Scoring, scores: Scores, *,
           first_fit: bool = True) -> nvlink_score.NodeScore | None:
    """`capacity.score`, once per GPU state (the score reads only the sizes of the node's free and whole domains,
    and where the DRA allocator's order is known and predicted (`first_fit`), it and which indices are free)."""
    topo = room.node.topology
    order = room.node.device_order if first_fit else None
    key = (need, tuple(map(len, room.domains)), room.free_gpus, room.node.gpu_count, topo.known,
           tuple(map(len, topo.domains)), (order, tuple(map(tuple, room.domains))) if order is not None else None)
    if key not in scores:
        scores[key] = capacity.score(room, need, scoring, first_fit=first_fit)
    return scores[key]


def _evaluate(pod: snapshot.Pod, room: capacity.Room, scoring: settings.Scoring, scores: Scores,
              contested: Mapping[str, int] = {}) -> tuple[_Rank, placement.Allocation, str, str] | str:
    """A gang of one on one node: its rank (lower is better), where its GPUs land, why and why in short; or why it
    does not fit."""
    choice = room.place_pod(pod)
    if not isinstance(choice, placement.Allocation):
        return choice
    need, name = pod.request.full, room.node.name
    score = _score(room, need, scoring, scores, first_fit=not pod.dra.domain_claim)
    points = score.score if score is not None else 0.0
    domain_left = min((len(room.domains[d]) for d in choice.domains), default=0) - need
    left = f"{room.free_gpus - need} GPUs left free there"
    why = f"NVLink score {points:g} ({score.explain()}); {left}" if score is not None else left
    short = f"NVLink score {points:g}; {left}" if score is not None else left
    return (-points, room.free_gpus - need, domain_left, contested.get(name, 0), name), choice, why, short


def _one(pod: snapshot.Pod, names: frozenset[str], rooms: Rooms, scoring: settings.Scoring,
         contested: Mapping[str, int] = {}) -> tuple[_Rank, str, placement.Allocation, str, str] | None:
    best: tuple[_Rank, str, placement.Allocation, str, str] | None = None
    scores: Scores = {}
    for name in sorted(names):
        found = _evaluate(pod, rooms[name], scoring, scores, contested)
        if not isinstance(found, str) and (best is None or found[0] < best[0]):
            best = (found[0], name, found[1], found[2], found[3])
    return best


def explain(pod: snapshot.Pod, cluster: snapshot.Snapshot, *, scoring: settings.Scoring,
            ) -> list[tuple[str, bool, str]]:
    """Where release would place this pod now, as a gang of one: every node as (name, could take it, why), the
    one release would choose first, then the others that could by rank, then those that could not."""
    fits: list[tuple[_Rank, str, str]] = []
    refused: list[tuple[str, bool, str]] = []
    for name, room in sorted(rooms(cluster).items()):
        why_never = capacity.never_pod(pod, room.node)
        found = why_never if why_never else _evaluate(pod, room, scoring, {}, contested(cluster))
        if isinstance(found, str):
            refused.append((name, False, found))
        else:
            fits.append((found[0], name, found[2]))
    refused += [(name, False, "node not ready or cordoned") for name, node in sorted(cluster.nodes.items())
                if not node.schedulable]
    return [(name, True, why) for _, name, why in sorted(fits)] + refused


def _greedy(
    members: Sequence[snapshot.Pod],
    candidates: Mapping[str, frozenset[str]],
    rooms: Rooms,
    allowed: frozenset[str],
    contested: Mapping[str, int] = {},
) -> tuple[dict[str, str], dict[str, capacity.Room], list[str], dict[str, tuple[int, ...]]] | None:
    trial: dict[str, capacity.Room] = {}
    nodes: dict[str, str] = {}
    domains: dict[str, tuple[int, ...]] = {}
    spanning: list[str] = []
    order = sorted(members, key=lambda p: (-p.request.full, -sum(p.request.mig.values()), p.key))
    for pod in order:
        best: tuple[tuple[bool, int, int, int, str], str, placement.Allocation] | None = None
        for name in sorted(candidates[pod.key] & allowed):
            if name not in rooms:
                continue
            room = trial.get(name) or rooms[name]
            choice = room.place_pod(pod)
            if not isinstance(choice, placement.Allocation):
                continue
            fresh = name not in trial
            left = room.free_gpus
            rank = (fresh, choice.spanned, -left if fresh else left - pod.request.full, contested.get(name, 0), name)
            if best is None or rank < best[0]:
                best = (rank, name, choice)
        if best is None:
            return None
        _, name, choice = best
        if name not in trial:
            trial[name] = rooms[name].copy()
        if domain := _domain(trial[name], choice):
            domains[pod.key] = domain
        trial[name].take_pod(pod, choice)
        nodes[pod.key] = name
        if choice.spanned > 1:
            spanning.append(pod.key)
    return nodes, trial, sorted(spanning), domains


def place(
    members: Sequence[snapshot.Pod],
    candidates: Mapping[str, frozenset[str]],
    rooms: Rooms,
    allowed: frozenset[str],
    *,
    scoring: settings.Scoring,
    contested: Mapping[str, int] = {},
) -> tuple[Layout, dict[str, capacity.Room]] | None:
    """The best simultaneous placement within `allowed` nodes, and the rooms it leaves (None: none fits). Among
    placements ranked equal, the one on nodes fewer pending never-gated pods prefer (`contested`)."""
    usable = frozenset(n for n in allowed if n in rooms)
    if len(members) == 1:
        pod = members[0]
        found = _one(pod, candidates[pod.key] & usable, rooms, scoring, contested)
        if found is None:
            return None
        _, name, choice, why, short = found
        room = rooms[name].copy()
        room.take_pod(pod, choice)
        return Layout({pod.key: name}, None, (pod.key,) if choice.spanned > 1 else (), why, short,
                      domains={pod.key: d} if (d := _domain(room, choice)) else {}), {name: room}
    everyone = frozenset.intersection(*(candidates[p.key] for p in members)) & usable if members else usable
    cliques: dict[str, set[str]] = {}
    for name in usable:
        clique = rooms[name].node.topology.clique
        if clique:
            cliques.setdefault(clique, set()).add(name)
    options = [frozenset([n]) for n in sorted(everyone)] + [frozenset(n) for _, n in sorted(cliques.items())]
    best: tuple[tuple[int, int, int, int, str], Layout, dict[str, capacity.Room]] | None = None
    for nodes in [*options, usable]:
        result = _greedy(members, candidates, rooms, nodes, contested)
        if result is None:
            continue
        assigned, trial, spanning, domains = result
        used = sorted(set(assigned.values()))
        held = {rooms[n].node.topology.clique for n in used}
        clique = next(iter(held)) if len(held) == 1 else None
        together = len(used) == 1 or clique is not None
        leftover = sum(trial[n].free_gpus for n in used)
        rank = (0 if together else 1, len(used), leftover, sum(contested.get(n, 0) for n in used), ",".join(used))
        if best is None or rank < best[0]:
            best = (rank, Layout(assigned, clique, tuple(spanning), domains=domains), trial)
    return None if best is None else (best[1], best[2])


def shortfall(
    members: Sequence[snapshot.Pod], candidates: Mapping[str, frozenset[str]], rooms: Rooms,
    cluster: snapshot.Snapshot,
) -> tuple[str, int, bool]:
    """Why a complete gang does not fit: (message, full GPUs missing, can never fit as the cluster stands)."""
    homeless = [p for p in members if not candidates[p.key]]
    if homeless:
        pod = homeless[0]
        reasons = sorted({r for node in cluster.nodes.values() if (r := capacity.never_pod(pod, node))})[:3]
        detail = f" ({'; '.join(reasons)})" if reasons else " (no GPU node)"
        names = ", ".join(p.key for p in homeless)
        return f"complete; {names} can run on no node as the cluster stands{detail}", 0, True
    nodes = frozenset().union(*candidates.values())
    need = sum(p.request.full for p in members)
    free = sum(rooms[n].free_gpus for n in nodes if n in rooms)
    total = sum(rooms[n].node.allocatable.full for n in nodes if n in rooms)
    if need > total:
        return (f"complete; needs {need} GPUs but the nodes it may use have {total} in all: it can never fit "
                "as the cluster stands", need - free, True)
    if need > free:
        return f"complete; waiting for {need - free} more free GPUs ({need} needed, {free} free on its nodes)", \
            need - free, False
    reasons = sorted({str(got) for p in members for n in sorted(candidates[p.key]) if n in rooms
                      and isinstance(got := rooms[n].place_pod(p), str)})[:3]
    return (f"complete; {free} GPUs free on its nodes but no simultaneous placement with each member inside "
            f"one NVLink domain and its other requests met ({'; '.join(reasons)})", 0, False)


def preemptor(pods: Sequence[snapshot.Pod]) -> int | None:
    """The priority with which kube-scheduler's preemption would act for these pods (all of them: the lowest of
    theirs, since each member preempts for itself), or None when one of them may not preempt (preemptionPolicy
    Never)."""
    if not pods or any(p.preemption_policy == "Never" for p in pods):
        return None
    return min(p.priority for p in pods)


def victims(node: snapshot.Node, cluster: snapshot.Snapshot, *, below: int) -> frozenset[str]:
    """The GPU pods holding the node that kube-scheduler's preemption may remove for a pod of priority `below`:
    those of lower priority (equal is never preempted). kube-scheduler respects PodDisruptionBudgets only as a
    preference among victims, not as a bar, so they do not protect a pod here either."""
    return frozenset(k for k in (*node.pods, *node.reserved) if k in cluster.pods and cluster.pods[k].priority < below)


def preempted_room(node: snapshot.Node, cluster: snapshot.Snapshot, *, below: int) -> capacity.Room | None:
    """The node's room once preemption removed every pod it may remove for priority `below` (what kube-scheduler
    checks before it chooses victims), or None when there is none to remove. Conservative: pods without GPUs are not
    counted as freeing CPU or memory. None on a node whose GPUs are DRA devices: kube-scheduler (1.36, 1.37) never
    preempts for them, its DynamicResources plugin counts a victim's devices taken while it simulates the removal
    (tests/e2e/test_nomination_facts_e2e.py, fact 8)."""
    if node.dra_gpus:
        return None
    lower = victims(node, cluster, below=below)
    return capacity.Room.of(node, cluster=cluster, leaving=lower) if lower else None


def preemptible(pod: snapshot.Pod, candidates: frozenset[str], cluster: snapshot.Snapshot) -> str | None:
    """Where kube-scheduler's own preemption could make room for this pod now (None: nowhere, or it may not
    preempt): a schedulable node among its candidates that would hold it once the GPU pods there of lower priority
    are gone (`preempted_room`: the victims the scheduler may choose; a pod's domains do not matter to it). Says the
    node with the fewest such pods."""
    below = preemptor([pod])
    if below is None:
        return None
    best: tuple[int, str] | None = None
    for name in sorted(candidates):
        node = cluster.nodes.get(name)
        if node is None or not node.schedulable:
            continue
        room = preempted_room(node, cluster, below=below)
        if room is None:
            continue
        count = len(victims(node, cluster, below=below))
        if isinstance(room.place_pod(pod, one_domain=False), placement.Allocation) and (
                best is None or count < best[0]):
            best = (count, name)
    if best is None:
        return None
    return f"preempting lower-priority pods on {best[1]} would make room ({best[0]} there)"


@dataclasses.dataclass(frozen=True)
class Preemption:
    """A gang placed once kube-scheduler's preemption has made room (`preempting`)."""

    layout: Layout
    rooms: dict[str, capacity.Room]  # the rooms it leaves on the nodes it uses (after preemption where it preempts)
    victims: Mapping[str, int]  # node where some member needs preemption -> lower-priority pods there it may remove
    preempting: frozenset[str] = frozenset()  # members that need a preemption (the rest fit free room)

    def describe(self) -> str:
        where = ", ".join(f"{n} ({c} there)" for n, c in sorted(self.victims.items()))
        return (f"fits no node now; once kube-scheduler preempts lower-priority pods on {where}: "
                f"{self.layout.describe()}")


def preempting(
    members: Sequence[snapshot.Pod],
    candidates: Mapping[str, frozenset[str]],
    rooms: Rooms,
    cluster: snapshot.Snapshot,
    allowed: frozenset[str],
    *,
    scoring: settings.Scoring,
    untouched: frozenset[str],
    contested: Mapping[str, int] = {},
) -> Preemption | None:
    """Where a gang that fits nowhere now (all members at once) goes once kube-scheduler's own preemption has removed
    pods of lower priority than every member (`preemptor`, `preempted_room`): the one model, asked per member.

    Members one at a time, the largest first, each as a gang of one (`place`: the best NVLink score, then packing):
    on free room if any node has it (free room is never given up for a preemption), else on the node whose room
    after preemption scores best. Only nodes in `untouched` (whose rooms no earlier placement of this plan changed)
    are counted as preemptible. None: a member may not preempt, or some member fits nowhere even after preemption
    (a gang is never started in part)."""
    below = preemptor(members)
    if below is None:
        return None
    usable = frozenset(n for n in allowed if n in rooms)
    free: dict[str, capacity.Room] = {n: rooms[n] for n in usable}
    after: dict[str, capacity.Room] = {}
    counts: dict[str, int] = {}
    for name in sorted(usable & untouched):
        node = cluster.nodes.get(name)
        room = preempted_room(node, cluster, below=below) if node is not None and node.schedulable else None
        if node is not None and room is not None:
            after[name], counts[name] = room, len(victims(node, cluster, below=below))
    assigned: dict[str, str] = {}
    spanning: list[str] = []
    preempts: set[str] = set()
    needing: set[str] = set()
    for pod in sorted(members, key=lambda p: (-p.request.full, -sum(p.request.mig.values()), p.key)):
        wanted = candidates[pod.key]
        found = _one(pod, wanted & frozenset(free), free, scoring, contested)
        needs = found is None
        if needs:
            found = _one(pod, wanted & frozenset(after), after, scoring, contested)
        if found is None:
            return None
        _, name, choice, _, _ = found
        view = after if needs else free
        view[name] = view[name].copy()
        view[name].take_pod(pod, choice)
        if needs:
            preempts.add(name)
            needing.add(pod.key)
            free.pop(name, None)  # preempted for one member, the node takes others only as its after-view allows
        elif name in after:  # keep the view after preemption true to what the member takes
            after[name] = after[name].copy()
            there = after[name].place_pod(pod, one_domain=False)
            after[name].take_pod(pod, there if isinstance(there, placement.Allocation) else NOWHERE)
        assigned[pod.key] = name
        if choice.spanned > 1:
            spanning.append(pod.key)
    used = sorted(set(assigned.values()))
    held = {rooms[n].node.topology.clique for n in used}
    clique = next(iter(held)) if len(held) == 1 and len(used) > 1 else None
    left = {n: after[n] if n in preempts else free[n] for n in used}
    chosen = Layout(assigned, clique, tuple(sorted(spanning)),
                    apart="member by member: free room first, else where preemption leaves the best NVLink score")
    return Preemption(chosen, left, {n: counts[n] for n in preempts}, frozenset(needing))
