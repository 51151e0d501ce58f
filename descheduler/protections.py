"""Pods the descheduler never evicts, whatever their utilisation or policy.

Each protection is a function `(pod, node, names) -> reason | None`; the first reason found is why
the pod is spared. Then the operators' conventions, each a setting (`descheduler.reclaim.conventions`),
as kubernetes-sigs/descheduler's DefaultEvictor, Cluster Autoscaler and Karpenter have them:
- no controller owner (a bare pod: evicting it deletes it for good) and local storage (hostPath, or an
  emptyDir; one of medium Memory only if `memory_emptydir_is_local_storage`) protect the pod unless
  allowed, or unless the pod says it may go (`cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` or
  `descheduler.alpha.kubernetes.io/evict`, as those tools read them);
- `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` and `karpenter.sh/do-not-disrupt: "true"`
  protect it. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from common import label_values, settings, snapshot, topology

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PREFER_NO_EVICTION = "descheduler.alpha.kubernetes.io/prefer-no-eviction"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
EVICT = "descheduler.alpha.kubernetes.io/evict"
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


def dra_uncounted(pod: snapshot.Pod, node: snapshot.Node | None, names: settings.Names) -> str | None:
    """A pod whose DRA GPUs the model cannot count (its claims are left to kube-scheduler: `common.dra`), or that
    holds more GPU devices than it is counted for, could be judged idle on part of its GPUs: never evicted."""
    if pod.dra.left:
        return f"its DRA GPUs cannot be counted ({pod.dra.left})"
    if len(pod.dra.devices) > pod.request.full:
        return (f"holds {len(pod.dra.devices)} DRA GPU devices ({', '.join(d.describe() for d in pod.dra.devices)}) "
                f"but is counted for {pod.request.full} GPU")
    if len(pod.dra.mig_devices) > sum(pod.request.mig.values()):
        return (f"holds {len(pod.dra.mig_devices)} DRA MIG devices "
                f"({', '.join(d.describe() for d in pod.dra.mig_devices)}) but is counted for "
                f"{sum(pod.request.mig.values())} MIG slices")
    return None


PROTECTIONS: Sequence[Protection] = (
    not_running, terminating, daemonset, mirror, system_critical, opted_out, mig_reconfiguring, dra_uncounted,
)


def _annotation(pod: snapshot.Pod, key: str) -> str | None:
    value = pod.annotations.get(key)
    return None if value is None else value.strip().lower()


def _may_go(pod: snapshot.Pod) -> str | None:
    """The pod's own permission to be evicted despite bare-pod and local-storage protections."""
    if _annotation(pod, SAFE_TO_EVICT) == "true":
        return f'{SAFE_TO_EVICT}: "true"'
    return EVICT if EVICT in pod.annotations else None


def _local_volume(pod: snapshot.Pod, conventions: settings.Conventions) -> str | None:
    for volume in (pod.raw.get("spec") or {}).get("volumes") or []:
        if "hostPath" in volume:
            return f"hostPath volume {volume.get('name')}"
        empty = volume.get("emptyDir")
        in_memory = isinstance(empty, dict) and empty.get("medium") == "Memory"
        if isinstance(empty, dict) and (not in_memory or conventions.memory_emptydir_is_local_storage):
            return f"emptyDir volume {volume.get('name')}"
    return None


def convention(pod: snapshot.Pod, conventions: settings.Conventions) -> str | None:
    """Why an operators' convention keeps this pod, or None."""
    if conventions.honour_safe_to_evict and _annotation(pod, SAFE_TO_EVICT) == "false":
        return f'{SAFE_TO_EVICT}: "false"'
    if conventions.honour_do_not_disrupt and _annotation(pod, DO_NOT_DISRUPT) == "true":
        return f'{DO_NOT_DISRUPT}: "true"'
    if _may_go(pod):
        return None
    if not conventions.evict_bare_pods and not pod.owner_kind:
        return "no owner (a bare pod): eviction would delete it for good (conventions.evict_bare_pods)"
    local = None if conventions.evict_local_storage_pods else _local_volume(pod, conventions)
    if local:
        return f"local storage ({local}) would be lost (conventions.evict_local_storage_pods)"
    return None


def why_protected(
    pod: snapshot.Pod,
    *,
    node: snapshot.Node | None,
    names: settings.Names,
    conventions: settings.Conventions,
    protections: Sequence[Protection] = PROTECTIONS,
) -> str | None:
    for protection in protections:
        reason = protection(pod, node, names)
        if reason:
            return reason
    return convention(pod, conventions)
