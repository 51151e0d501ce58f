"""Pods the descheduler never evicts, whatever their utilisation or policy.

Each protection is a function `(pod, node, names) -> reason | None`; the first reason found is why
the pod is spared. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from common import label_values, settings, snapshot, topology

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PREFER_NO_EVICTION = "descheduler.alpha.kubernetes.io/prefer-no-eviction"
SYSTEM_CRITICAL = re.compile(r"^system-.*-critical$")

Protection = Callable[[snapshot.Pod, "snapshot.Node | None", settings.Names], "str | None"]


def not_running(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    return None if pod.phase == "Running" and pod.node_name else f"not running (phase {pod.phase})"


def terminating(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    return "already terminating" if pod.deleting else None


def daemonset(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    return "owned by a DaemonSet" if pod.owner_kind == "DaemonSet" else None


def mirror(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    return "mirror (static) pod" if MIRROR_ANNOTATION in pod.annotations else None


def system_critical(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    name = pod.priority_class_name or ""
    return f"system-critical PriorityClass {name}" if SYSTEM_CRITICAL.match(name) else None


def opted_out(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    for key in (names.skip, PREFER_NO_EVICTION):
        value = label_values.value({"labels": pod.labels, "annotations": pod.annotations}, key)
        if label_values.flag(value, key=key).value:
            return f"opted out by {key}={value!r}"
    return None


def mig_reconfiguring(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    if node is not None and node.topology.mig_config_state == "pending":
        return f"node {node.name} has {topology.MIG_CONFIG_STATE_LABEL}=pending"
    return None


PROTECTIONS: Sequence[Protection] = (
    not_running, terminating, daemonset, mirror, system_critical, opted_out, mig_reconfiguring,
)


def why_protected(
    pod: snapshot.Pod,
    *,
    node: snapshot.Node | None,
    names: settings.Names,
    protections: Sequence[Protection] = PROTECTIONS,
) -> str | None:
    for protection in protections:
        reason = protection(pod, node, names)
        if reason:
            return reason
    return None
