"""Closing the loop on every release by observation: did each released pod bind where its plan said, in time?

Pure: a `Snapshot`, the settings and `now` in; what did not go as planned, with its reasons, out. Level-triggered:
nothing is kept in memory, every pass derives it from the pods and their release record (`names.release`, written by
the patch that un-gates a pod: `<time> [planned=<node>] [domains=1] <why>`, `record`), so a restart or a new leader
reports the same. The shell (`controller`) tells each outcome once (log line + metric + Event) and never acts on it:
nothing here deletes, evicts or re-creates a pod. Rules, per released pod that is still present (not being deleted,
not finished):

- bound to another node than the one it was nominated to: `placed-elsewhere` (kube-scheduler found the node full —
  another pod took it first, or a higher-priority pod ignored the nomination — and bound it where it fitted);
- bound to its node but, as DCGM reports its GPUs, on several NVLink domains where the plan had one:
  `split-domains` (the device plugin's choice, docs/placement.md); estimated GPU indices are never judged;
- not bound more than `descheduler.gangs.bind_bound_seconds` after its release: `not-bound` (the message says where
  it was nominated, and whether an older release pinned it with a required `metadata.name` term: such a pod is
  reported, never deleted). A record without a time counts from the pod's creation. Boundary: exactly the bound is
  not late yet.
- a gang (`common.gangs`) is judged as a whole, over its present released members: when any of them is `not-bound`,
  every member is reported `gang-not-bound` (a gang whose other members hold their GPUs while one cannot start,
  e.g. a member with a volume claim the model cannot judge) instead of the members' own outcomes; when its members
  that were nominated are bound on more nodes than their nominations named, each of them is reported `gang-spread`.
"""

from __future__ import annotations

import dataclasses
import enum

from common import gangs, label_values, settings, snapshot, timestamps

PLANNED = "planned="
ONE_DOMAIN = "domains=1"


class Cause(enum.StrEnum):
    PLACED_ELSEWHERE = "placed-elsewhere"
    SPLIT_DOMAINS = "split-domains"
    NOT_BOUND = "not-bound"
    GANG_NOT_BOUND = "gang-not-bound"
    GANG_SPREAD = "gang-spread"


# The Event each cause is told with: (type, reason).
EVENTS: dict[Cause, tuple[str, str]] = {
    Cause.PLACED_ELSEWHERE: ("Normal", "PlacedElsewhere"),
    Cause.SPLIT_DOMAINS: ("Normal", "PlacedOnMoreDomains"),
    Cause.NOT_BOUND: ("Warning", "NotBoundInTime"),
    Cause.GANG_NOT_BOUND: ("Warning", "GangNotBoundInTime"),
    Cause.GANG_SPREAD: ("Normal", "GangPlacedElsewhere"),
}


@dataclasses.dataclass(frozen=True)
class Record:
    """What a release wrote on the pod."""

    at: float | None  # when it was released (epoch seconds)
    node: str | None  # where it was nominated, if it was
    one_domain: bool  # planned inside one NVLink domain
    why: str


def record(*, at: str, node: str | None, one_domain: bool, why: str) -> str:
    """The release record's value (`read` parses it)."""
    tokens = [f"{PLANNED}{node}"] if node else []
    if node and one_domain:
        tokens.append(ONE_DOMAIN)
    return label_values.stamp(at, " ".join([*tokens, why]))


def read(raw: str) -> Record:
    at, text = label_values.stamped(raw)
    node, one_domain = None, False
    while True:
        head, _, rest = text.partition(" ")
        if head.startswith(PLANNED) and node is None:
            node = head[len(PLANNED):] or None
        elif head == ONE_DOMAIN:
            one_domain = True
        else:
            break
        text = rest
    return Record(at, node, one_domain, text)


@dataclasses.dataclass(frozen=True)
class Outcome:
    key: str
    uid: str
    cause: Cause
    message: str
    gang: str | None = None  # namespace/name, for a gang member

    @property
    def event(self) -> tuple[str, str]:
        return EVENTS[self.cause]


@dataclasses.dataclass(frozen=True)
class _Released:
    pod: snapshot.Pod
    record: Record
    since: float | None  # release time, else creation


def _domains(pod: snapshot.Pod, node: snapshot.Node | None) -> int:
    """NVLink domains of its node the pod's GPUs are in (0 when the node is gone)."""
    held = set(pod.gpu_indices)
    return sum(1 for domain in (node.topology.domains if node is not None else ()) if held & set(domain))


def _alone(item: _Released, cluster: snapshot.Snapshot, *, bound: float, now: float) -> Outcome | None:
    pod, rec = item.pod, item.record
    if pod.node_name is not None:
        if rec.node is not None and pod.node_name != rec.node:
            return Outcome(pod.key, pod.uid, Cause.PLACED_ELSEWHERE,
                           f"nominated to {rec.node} at release, bound to {pod.node_name} (the node no longer fitted "
                           "it when kube-scheduler tried it)")
        node = cluster.nodes.get(pod.node_name)
        if rec.one_domain and pod.indices_observed and (spanned := _domains(pod, node)) > 1:
            return Outcome(pod.key, pod.uid, Cause.SPLIT_DOMAINS,
                           f"planned inside one NVLink domain of {pod.node_name}; its GPUs "
                           f"{', '.join(map(str, pod.gpu_indices))} span {spanned} (the device plugin's choice)")
        return None
    waited = now - item.since if item.since is not None else 0.0
    if waited <= bound:
        return None
    where = f"nominated to {rec.node}" if rec.node else "released without a nomination"
    pinned = snapshot.pinned_node(pod.raw)
    old = (f"; an older release pinned it to {pinned} (a required metadata.name term): gpu-steward no longer "
           "deletes or re-creates pods, delete it yourself so that its controller creates it afresh"
           if pinned and rec.node is None else "")
    return Outcome(pod.key, pod.uid, Cause.NOT_BOUND,
                   f"{where}, not bound {waited:.0f}s after its release (bound: {bound:g}s){old}")


def assess(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float) -> tuple[Outcome, ...]:
    """Every released pod whose release did not go as planned, by pod key; gang members grouped by gang."""
    names, bound = config.names, config.descheduler.gangs.bind_bound_seconds
    by_gang: dict[str | None, list[_Released]] = {}
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        raw = pod.annotations.get(names.release)
        if raw is None or pod.deleting or pod.phase in snapshot.TERMINAL_PHASES or names.gate in pod.scheduling_gates:
            continue
        rec = read(raw)
        since = rec.at if rec.at is not None else timestamps.epoch(pod.created)
        member_of = gangs.identify(pod.raw, names=names, pod_groups=cluster.pod_groups)
        by_gang.setdefault(member_of.key if member_of is not None else None, []).append(_Released(pod, rec, since))
    found: list[Outcome] = []
    for gang, items in sorted(by_gang.items(), key=lambda kv: kv[0] or ""):
        alone = {i.pod.key: _alone(i, cluster, bound=bound, now=now) for i in items}
        if gang is None:
            found += [o for o in alone.values() if o is not None]
            continue
        late = sorted(k for k, o in alone.items() if o is not None and o.cause is Cause.NOT_BOUND)
        if late:
            meanwhile = ("none is bound: they wait for room together" if len(late) == len(items)
                         else "the others hold their GPUs meanwhile")
            message = (f"gang {gang}: {len(late)} of {len(items)} released members not bound within {bound:g}s "
                       f"({', '.join(late)}); {meanwhile}")
            found += [Outcome(i.pod.key, i.pod.uid, Cause.GANG_NOT_BOUND, message, gang) for i in items]
            continue
        nominated = [i for i in items if i.record.node is not None and i.pod.node_name is not None]
        planned = {i.record.node for i in nominated}
        landed = {i.pod.node_name for i in nominated}
        if len(landed) > len(planned):
            message = (f"gang {gang}: nominated to {len(planned)} node(s) ({', '.join(sorted(map(str, planned)))}), "
                       f"bound on {len(landed)} ({', '.join(sorted(map(str, landed)))})")
            found += [Outcome(i.pod.key, i.pod.uid, Cause.GANG_SPREAD, message, gang) for i in nominated]
            continue
        found += [dataclasses.replace(o, gang=gang) for o in alone.values() if o is not None]
    return tuple(found)
