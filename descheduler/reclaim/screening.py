"""Screening: may this running GPU pod be reclaimed once idle? Everything but its utilisation — protections,
operators' conventions, a reclaimable class policy, age, cooldowns. Pure: no I/O, no clock.

Done once per cycle for every pod holding GPUs (`screen_all`): the shell measures the screened pods' idleness
over their windows (`windows_needed`), the planner reads the same screening.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from common import settings, snapshot, timestamps
from descheduler import cooldowns, policy, protections


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
    for key, what in ((cooldowns.victim_key(pod.key), "refused-eviction"), (cooldowns.workload_key(pod), "workload"),
                      (cooldowns.node_key(pod.node_name or ""), "node")):
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

