"""Closing the loop on every pin: which released, pinned pods are stuck, and what recovers them.

Pure: a `Snapshot`, the settings, `now` and what the shell read of the Jobs concerned in; recoveries with their
reasons out. The shell (`descheduler.release.controller`) acts on them. A pin is ours when the pod carries our
release record (`names.release`: `<time> <where and why>`, written by the patch that un-gates it) and a required
`metadata.name In [node]` term. Nothing is kept in memory: every pass derives it all from the pods, so a restart or
a new leader finds the same stuck pins. Rules:

- A pinned pod is stuck when it is not bound, not gated, not being deleted and
  - its node is gone (`node-gone`), or cordoned or not ready (`node-cordoned`): at once;
  - kube-scheduler reports it Unschedulable (condition PodScheduled False, reason Unschedulable) and more than
    `descheduler.gangs.pin_deadline_seconds` have passed since its release (`unschedulable`). Within the deadline,
    or before the scheduler has said so, it is left alone. A record without a time counts from the pod's creation.
    Past the deadline, a pod kube-scheduler has nominated (status.nominatedNodeName) to its pinned node — it
    preempts there for it (a gang released to preempt, `planning`) — is waited on longer, each wait bounded
    (`Wait`, listed by `waiting`; `descheduler.gangs.nominated_retry_seconds`, "retry" below):
    - a pod bound there is terminating (`victims-leaving`): until the latest such pod's deletion time (the end of
      its grace period) plus retry; past that, stuck (`nominated-stalled`);
    - none is and the capacity model (`common.capacity`, every other pod holding the node counted) finds room for
      it there (`retry-due`): until retry after its release; past that, stuck (`nominated-stalled`).
      kube-scheduler 1.37 can leave such a pod untried until its unschedulable-pod flush (5 min): when two
      preemptors share a victim, the one whose last victim the other deleted first stays gated by
      DefaultPreemption's PreEnqueue through every victim's deletion event, and nothing requeues it after
      (docs/operations.md, "A preemptor kube-scheduler does not retry"); recovering it would restart the
      gang's bound members for nothing. Boundary: measured from the release, so victims with long grace
      periods use part of it up.
    - no room for it there (another pod took it), or nominated to another node: stuck as `unschedulable`, the
      message says which.
- Recovered as a unit: a stuck gang member brings every member of its gang that is pinned, released and not bound
  (they are re-planned together, never half-placed by an old plan), and every member bound from the same release as
  one of those: the same release record, time and text, which the release pass writes alike on all the members it
  un-gates at once (`controller`). Such a gang never ran whole — part of it started and the rest of the same release
  is stuck — so its bound members are recovered too (by the rules below) and the whole gang comes back gated and is
  released whole again; left running, they would hold their GPUs forever beside re-created members that find no
  room, the gang part-running (tests/e2e/test_closed_loop_random_e2e.py, seed 20261128). The cost: those members
  are running, most likely waiting at their rendezvous for peers that never came; evicting them restarts their
  containers and loses what they did alone. Members bound from an earlier release are left running: that gang ran
  whole once and one member of it, created again since (its own release, alone), is what is stuck; evicting the
  rest would kill a gang that runs to recover one pod. Not tied in: a member being deleted or finished (it is not
  running and is leaving or done), and a bound member whose record has no time (releases cannot be told apart).
  Boundary: a gang whose release was split across passes (a failure while un-gating, `controller`) has two
  records; its members bound from the first pass are left running like an earlier release's.
- How, by what re-creates each pod of the unit:
  - a controller that re-creates a deleted pod at no cost: ReplicaSet, StatefulSet, ReplicationController; a Job
    whose pod failure policy ignores DisruptionTarget, or with retries to spare (`backoffLimit` minus its failed
    pods at least the unit's pods of that Job: the Job controller counts a deleted unfinished pod as failed) —
    `evict`: the Eviction API deletes it (marking it DisruptionTarget); its controller re-creates it, our webhook
    gates it again and release places it afresh;
  - no owner (a bare pod) — `recreate`: the same pod (name, labels, annotations, spec) minus our pin and our
    release record is created again once the old one is gone (the shell journals it first, so a restart between the
    deletion and the creation loses nothing);
  - any other owner (a Job without retries to spare or that could not be read, Argo Workflows, Tekton, a kind we
    do not know) — `report`: deleting it would cost the workload a failed attempt. A Warning Event on the pod and
    its owner says what the user can do; the pod is left as it is.
  A unit with any pod to `report` is reported as a whole: a gang is never half recovered.
  The shell acts on a unit's pods in `Recovery.in_order`: bound members to evict first, which a
  PodDisruptionBudget may refuse (the Eviction API never refuses a Pending pod), then the rest (`recoverer`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from common import capacity, gangs, label_values, settings, snapshot, timestamps

FREE_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
JOB = "Job"
DEFAULT_BACKOFF_LIMIT = 6  # batch/v1 Job's default

RECOVERED = "PinRecovered"
STUCK = "PinStuck"
WAITING = "PinWaiting"  # a Normal Event: past its deadline, waited on (`Wait`)


class Cause(enum.StrEnum):
    NODE_GONE = "node-gone"
    NODE_CORDONED = "node-cordoned"
    UNSCHEDULABLE = "unschedulable"
    NOMINATED_STALLED = "nominated-stalled"  # nominated to its node, waited on past its bound (`Wait`)


class Wait(enum.StrEnum):
    """Why a pin past its deadline is not stuck yet: kube-scheduler nominated it to its pinned node, and ..."""

    VICTIMS_LEAVING = "victims-leaving"  # ... a pod there is terminating (its preemption victims)
    RETRY_DUE = "retry-due"  # ... none is, and it fits there now: the scheduler's retry is due


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A pin past its deadline that is waited on, and until when."""

    key: str
    node: str
    wait: Wait
    why: str
    until: float  # epoch seconds: stuck after this


class How(enum.StrEnum):
    EVICT = "evict"  # its controller re-creates it at no cost
    RECREATE = "recreate"  # a bare pod: we create it again, minus our pin
    REPORT = "report"  # deleting would cost the workload: a Warning, nothing else


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What decides whether deleting one of a Job's pods costs it an attempt."""

    retries_left: int  # backoffLimit minus failed pods (per index with backoffLimitPerIndex)
    ignores_disruption: bool  # a podFailurePolicy rule Ignore on condition DisruptionTarget


def job_facts(job: Mapping[str, Any]) -> JobFacts:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    per_index = spec.get("backoffLimitPerIndex")
    if per_index is not None:
        # Each index has its own budget; a pending pod's index has not failed yet as far as we can tell cheaply.
        left = int(per_index)
    else:
        limit = spec.get("backoffLimit")
        left = (DEFAULT_BACKOFF_LIMIT if limit is None else int(limit)) - int(status.get("failed") or 0)
    ignores = any(
        rule.get("action") == "Ignore"
        and any(c.get("type") == "DisruptionTarget" and c.get("status", "True") == "True"
                for c in rule.get("onPodConditions") or ())
        for rule in (spec.get("podFailurePolicy") or {}).get("rules") or ()
    )
    return JobFacts(max(0, left), ignores)


@dataclasses.dataclass(frozen=True)
class Stuck:
    """One pod of a unit: pinned and not bound, or bound from the same release as the unit's pinned pods."""

    key: str
    uid: str
    node: str  # the node it is pinned to (bound: the node it runs on)
    cause: Cause | None  # None: not stuck itself, recovered with its gang
    how: How
    owner: tuple[str, str] | None  # (kind, name) of its controller
    why: str  # for `how`
    bound: bool = False  # a member bound from the same release as the unit's stuck pods: running, not pinned


@dataclasses.dataclass(frozen=True)
class Recovery:
    unit: str  # the gang key, or the pod key
    cause: Cause  # of the first stuck pod
    how: How  # the unit's: REPORT if any pod is to be reported
    pods: tuple[Stuck, ...]
    message: str  # the Event and the CLI line

    @property
    def acting(self) -> bool:
        return self.how is not How.REPORT

    @property
    def in_order(self) -> tuple[Stuck, ...]:
        """The pods in the order the shell acts on them: the bound ones to evict first (a PodDisruptionBudget may
        refuse those, and a refusal then leaves the rest untouched), then the other bound ones, then the unbound."""
        return tuple(sorted(self.pods, key=lambda s: (not s.bound, not (s.bound and s.how is How.EVICT), s.key)))


def owner(pod: snapshot.Pod) -> tuple[str, str] | None:
    return (pod.owner_kind, pod.owner_name or "") if pod.owner_kind else None


def released_at(pod: snapshot.Pod, *, names: settings.Names) -> float | None:
    """When our release un-gated this pod (None: we did not, as far as the pod says)."""
    record = pod.annotations.get(names.release)
    if record is None:
        return None
    at, _ = label_values.stamped(record)
    return at


def _pinned(pod: snapshot.Pod, *, names: settings.Names) -> str | None:
    """The node our release pinned this pod to, while it waits to be bound."""
    if (pod.node_name or pod.deleting or pod.phase != "Pending" or names.gate in pod.scheduling_gates
            or names.release not in pod.annotations):
        return None
    return snapshot.pinned_node(pod.raw)


def _release_of(pod: snapshot.Pod, *, names: settings.Names) -> str | None:
    """The release that un-gated this pod, as its record says (time and text); None without a time in it."""
    record = pod.annotations.get(names.release)
    return record if record is not None and label_values.stamped(record)[0] is not None else None


def _running(pod: snapshot.Pod) -> bool:
    """Bound and neither finished nor being deleted: what a recovery unit may have to take down."""
    return pod.bound and not pod.deleting


def _unschedulable(pod: snapshot.Pod) -> bool:
    conditions = (pod.raw.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in conditions if isinstance(c, Mapping))


def cause(pod: snapshot.Pod, node: str, cluster: snapshot.Snapshot, *, names: settings.Names,
          cfg: settings.Gangs, now: float) -> tuple[Cause, str] | None:
    """Why this pinned pod is stuck, and how we know; None when it is not (yet)."""
    found = _verdict(pod, node, cluster, names=names, cfg=cfg, now=now)
    return found if found is None or isinstance(found, tuple) else None


def _verdict(pod: snapshot.Pod, node: str, cluster: snapshot.Snapshot, *, names: settings.Names,
             cfg: settings.Gangs, now: float) -> tuple[Cause, str] | Waiting | None:
    """`cause`, or the wait that holds it off (`Wait`)."""
    found = cluster.nodes.get(node)
    if found is None:
        return Cause.NODE_GONE, f"its node {node} is gone"
    if not found.schedulable:
        return Cause.NODE_CORDONED, f"its node {node} is cordoned or not ready"
    since = released_at(pod, names=names)
    if since is None:
        since = timestamps.epoch(pod.created)
    if since is None or not _unschedulable(pod) or now - since <= cfg.pin_deadline_seconds:
        return None  # within the deadline, or not reported Unschedulable (or no time to count from)
    # No running count in the texts: a reported pin is told again only when what it says changes.
    late = f"kube-scheduler reports it Unschedulable more than {cfg.pin_deadline_seconds:g}s after its release"
    nominated = (pod.raw.get("status") or {}).get("nominatedNodeName")
    if nominated != node:
        return Cause.UNSCHEDULABLE, late + (f" (nominated to {nominated} instead)" if nominated else "")
    retry = cfg.nominated_retry_seconds
    leaving = [cluster.pods[k] for k in found.pods if k in cluster.pods and cluster.pods[k].deleting]
    if leaving:
        ends = [timestamps.epoch((p.raw.get("metadata") or {}).get("deletionTimestamp")) for p in leaving]
        until = max((e for e in ends if e is not None), default=since) + retry
        who = ", ".join(p.key for p in leaving)
        if now <= until:
            return Waiting(pod.key, node, Wait.VICTIMS_LEAVING, f"kube-scheduler nominated it to {node}, where "
                           f"it preempts: {who} terminating; waited on until {retry:g}s past their deletion time",
                           until)
        return Cause.NOMINATED_STALLED, (f"{late}; nominated to {node}, where {who} still terminating more than "
                                         f"{retry:g}s past their deletion time")
    room = capacity.place_pod(pod, capacity.Room.of(found, cluster=cluster, leaving={pod.key}), one_domain=False)
    if isinstance(room, str):
        return Cause.UNSCHEDULABLE, f"{late} (nominated to {node}, no room for it there now: {room})"
    until = since + retry
    if now <= until:
        return Waiting(pod.key, node, Wait.RETRY_DUE, f"kube-scheduler nominated it to {node}, where no pod is "
                       f"terminating and it fits now: its retry is due; waited on until {retry:g}s after its "
                       "release", until)
    return Cause.NOMINATED_STALLED, (f"{late}; nominated to {node}, where it fits, yet not bound {retry:g}s "
                                     "after its release")


def waiting(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float) -> tuple[Waiting, ...]:
    """The pins past their deadline that are waited on (`Wait`), by pod key."""
    names, cfg = config.names, config.descheduler.gangs
    out = []
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        node = _pinned(pod, names=names)
        if node is not None and isinstance(found := _verdict(pod, node, cluster, names=names, cfg=cfg, now=now),
                                           Waiting):
            out.append(found)
    return tuple(out)


def _how(pod: snapshot.Pod, *, jobs: Mapping[str, JobFacts], unit_pods_of_job: int) -> tuple[How, str]:
    kind = pod.owner_kind
    if kind is None:
        return How.RECREATE, "a bare pod: created again as it was, without our pin"
    if kind in FREE_OWNERS:
        return How.EVICT, f"its {kind} {pod.owner_name} re-creates it"
    if kind == JOB:
        facts = jobs.get(f"{pod.namespace}/{pod.owner_name}")
        if facts is None:
            return How.REPORT, f"its Job {pod.owner_name} could not be read"
        if facts.ignores_disruption:
            return How.EVICT, f"its Job {pod.owner_name} re-creates it (its podFailurePolicy ignores DisruptionTarget)"
        if facts.retries_left >= unit_pods_of_job:
            return How.EVICT, (f"its Job {pod.owner_name} re-creates it ({facts.retries_left} retries left, "
                               f"{unit_pods_of_job} used)")
        return How.REPORT, (f"its Job {pod.owner_name} has {facts.retries_left} retries left: deleting "
                            f"{unit_pods_of_job} pod(s) would fail it")
    return How.REPORT, f"its owner {kind} {pod.owner_name} may count a deleted pod as a failure"


def _unit_key(pod: snapshot.Pod, cluster: snapshot.Snapshot, *, names: settings.Names) -> str:
    gang = gangs.identify(pod.raw, names=names, pod_groups=cluster.pod_groups)
    return f"gang:{gang.key}" if gang is not None and gang.size is not None else f"pod:{pod.key}"


def assess(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float,
           jobs: Mapping[str, JobFacts] = {}) -> tuple[Recovery, ...]:
    """Every unit with a stuck pin, by unit key. `jobs`: namespace/name -> facts, for the Jobs owning pinned pods
    (`jobs_to_read`); a Job missing from it is reported, never evicted."""
    names, cfg = config.names, config.descheduler.gangs
    pinned: dict[str, list[tuple[snapshot.Pod, str]]] = {}
    running: dict[str, list[snapshot.Pod]] = {}  # gang unit -> its members bound by one of our releases
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        node = _pinned(pod, names=names)
        if node is not None:
            pinned.setdefault(_unit_key(pod, cluster, names=names), []).append((pod, node))
        elif _running(pod) and _release_of(pod, names=names) is not None:
            running.setdefault(_unit_key(pod, cluster, names=names), []).append(pod)
    out: list[Recovery] = []
    for unit, members in sorted(pinned.items()):
        causes = {pod.key: found for pod, node in members
                  if (found := cause(pod, node, cluster, names=names, cfg=cfg, now=now)) is not None}
        if not causes:
            continue
        releases = {_release_of(pod, names=names) for pod, _ in members} - {None}
        together = [(pod, pod.node_name or "") for pod in running.get(unit, ()) if unit.startswith("gang:")
                    and _release_of(pod, names=names) in releases]
        per_job: dict[str, int] = {}
        for pod, _ in [*members, *together]:
            if pod.owner_kind == JOB:
                job = f"{pod.namespace}/{pod.owner_name}"
                per_job[job] = per_job.get(job, 0) + 1
        stuck: list[Stuck] = []
        for pod, node in sorted([*members, *together], key=lambda m: m[0].key):
            how, why = _how(pod, jobs=jobs, unit_pods_of_job=per_job.get(f"{pod.namespace}/{pod.owner_name}", 0))
            found = causes.get(pod.key)
            stuck.append(Stuck(pod.key, pod.uid, node, found[0] if found else None, how, owner(pod), why,
                               bound=pod.node_name is not None))
        first = next(s for s in stuck if s.cause is not None)
        how = How.REPORT if any(s.how is How.REPORT for s in stuck) else How.EVICT
        out.append(Recovery(unit.partition(":")[2], first.cause or Cause.UNSCHEDULABLE,
                            how if how is How.REPORT else _acting(stuck), tuple(stuck),
                            _message(unit, stuck, causes)))
    return tuple(out)


def _acting(stuck: Sequence[Stuck]) -> How:
    return How.RECREATE if all(s.how is How.RECREATE for s in stuck) else How.EVICT


def _message(unit: str, stuck: Sequence[Stuck], causes: Mapping[str, tuple[Cause, str]]) -> str:
    kind, _, key = unit.partition(":")
    first = next(s for s in stuck if s.key in causes)
    what = f"pinned to {first.node}, not bound: {causes[first.key][1]}"
    if kind == "gang":
        what = f"gang {key}: {first.key} {what}"
    blocked = [s for s in stuck if s.how is How.REPORT]
    if blocked:
        return (f"{what}; left as it is: {blocked[0].why}. To recover, delete the pod"
                f"{'s' if len(stuck) > 1 else ''} ({', '.join(s.key for s in stuck)}) and create "
                f"{'them' if len(stuck) > 1 else 'it'} again (without the node affinity on metadata.name)")
    done = "; ".join(f"{s.key}: {s.why}" for s in stuck)
    bound = sum(1 for s in stuck if s.bound)
    unbound = len(stuck) - 1 - bound
    together = [f"the {unbound} other unbound member(s)"] if unbound else []
    if bound:
        together.append(f"the {bound} member(s) bound from the same release (the gang never ran whole)")
    return f"{what}; recovered{' with ' + ' and '.join(together) if together else ''}: {done}"


def jobs_to_read(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float) -> tuple[str, ...]:
    """namespace/name of the Jobs owning pods of a stuck unit: what the shell reads before `assess`."""
    found = assess(cluster, config=config, now=now)
    return tuple(sorted({f"{s.key.partition('/')[0]}/{s.owner[1]}" for r in found for s in r.pods
                         if s.owner is not None and s.owner[0] == JOB}))
