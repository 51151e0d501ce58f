"""Gates that outlive their controller: which pods our gate holds, past their bound, while no release controller runs.

Pure: the snapshot, the settings, `now`, when the descheduler's leader Lease was last seen renewed and since when this
replica has watched it; the pods to release and why out. The shell (`admission.gate_lifter`) runs in every webhook
replica, which already watches that Lease to decide whether to gate. Rules:

- Nothing is lifted while the controller is alive: its Lease seen renewed within `admission.controller_stale_seconds`.
  A replica that has not seen it at all counts that bound from when it started watching (it cannot know yet).
- A gated pod that names no gang is due once older than `descheduler.gangs.max_wait_seconds` (from its creation):
  the bound the release controller keeps itself (it releases such a pod unpinned then).
- A gang is due as a whole once its oldest present member is older than `descheduler.gangs.gang_max_wait_seconds`:
  every member carrying our gate is released together. Without a controller nothing can start them all at once, so
  they start one by one, as in `gpu-steward release-gates`; the record on each pod says so.
- Only our gate is removed (other controllers' gates stay) and no pin is added: the pod becomes an ordinary pending
  pod that kube-scheduler, its preemption and cluster autoscalers can act on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from common import gangs, settings, snapshot, timestamps


@dataclasses.dataclass(frozen=True)
class Lift:
    unit: str  # the pod key, or the gang key
    pods: tuple[str, ...]  # keys of the pods whose gate to lift
    why: str


def controller_down(*, seen_at: float | None, watching_since: float, now: float, stale_after: float) -> str | None:
    """Why the release controller counts as down (None: it may be alive)."""
    if seen_at is None:
        watched = now - watching_since
        return (f"no renewal of the descheduler's Lease seen in the {watched:.0f}s this replica has watched it"
                if watched > stale_after else None)
    age = now - seen_at
    return f"the descheduler's Lease last seen renewed {age:.0f}s ago" if age > stale_after else None


def due(cluster: snapshot.Snapshot, *, config: settings.Settings, now: float, seen_at: float | None,
        watching_since: float) -> tuple[Lift, ...]:
    down = controller_down(seen_at=seen_at, watching_since=watching_since, now=now,
                           stale_after=config.admission.controller_stale_seconds)
    if down is None:
        return ()
    names, cfg = config.names, config.descheduler.gangs
    units: dict[str, list[snapshot.Pod]] = {}
    singles: list[snapshot.Pod] = []
    for pod in sorted(cluster.pods.values(), key=lambda p: p.key):
        if pod.deleting or pod.phase in snapshot.TERMINAL_PHASES:
            continue
        gang = gangs.identify(pod.raw, names=names, pod_groups=cluster.pod_groups)
        if gang is None:
            if names.gate in pod.scheduling_gates:
                singles.append(pod)
            continue
        units.setdefault(gang.key, []).append(pod)
    out = [Lift(pod.key, (pod.key,), _why(down, "pod", _age(pod, now), cfg.max_wait_seconds))
           for pod in singles if _age(pod, now) > cfg.max_wait_seconds]
    for key, members in sorted(units.items()):
        gated = tuple(p.key for p in members if names.gate in p.scheduling_gates)
        oldest = max(_age(p, now) for p in members)
        if gated and oldest > cfg.gang_max_wait_seconds:
            why = _why(down, f"gang {key}", oldest, cfg.gang_max_wait_seconds)
            out.append(Lift(key, gated, why + "; its members start one by one (no controller to start them together)"))
    return tuple(out)


def _age(pod: snapshot.Pod, now: float) -> float:
    created = timestamps.epoch(pod.created)
    return 0.0 if created is None else now - created


def _why(down: str, what: str, age: float, bound: float) -> str:
    return (f"released unpinned by the webhook: {down}, and this {what} was gated {age:.0f}s "
            f"(over {bound:g}s); check the descheduler (kubectl -n <namespace> logs deploy/<release>-descheduler)")


def keys(lifts: Sequence[Lift]) -> list[str]:
    return [key for lift in lifts for key in lift.pods]
