"""Which gang a pod belongs to — one parser for the webhook (gating) and the gang controller (release).

Conventions, first match wins:
- ours: `<prefix>gang-name` + `<prefix>gang-size` (labels, or annotations);
- Kueue pod groups: label `kueue.x-k8s.io/pod-group-name` + annotation
  `kueue.x-k8s.io/pod-group-total-count`;
- scheduler-plugins coscheduling: label `scheduling.x-k8s.io/pod-group` (size lives in a PodGroup);
- Volcano: annotation `scheduling.k8s.io/group-name` (size lives in a PodGroup);
- Kubernetes' native workload API (1.35+ alpha): `spec.schedulingGroup.podGroupName`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import settings

DEFAULT_SCHEDULER = "default-scheduler"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"


@dataclasses.dataclass(frozen=True)
class Gang:
    namespace: str
    name: str
    size: int | None  # None: unknown here (kept in a PodGroup object) or invalid
    convention: str  # which convention named it
    enforced_elsewhere: str | None  # why another scheduler already holds the gang together
    problem: str | None = None  # e.g. a gang size that is not a positive integer

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _size(raw: str | None, *, key: str) -> tuple[int | None, str | None]:
    if raw is None:
        return None, f"{key} is missing"
    try:
        size = int(str(raw).strip())
    except ValueError:
        return None, f"{key}={raw!r} is not a positive integer"
    if size < 1:
        return None, f"{key}={raw!r} is not a positive integer"
    return size, None


def identify(pod: Mapping[str, Any], *, names: settings.Names) -> Gang | None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    namespace = meta.get("namespace") or "default"
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    elsewhere = None if scheduler == DEFAULT_SCHEDULER else f"scheduler {scheduler} places the gang"

    def make(name: str, size_key: str | None, raw_size: str | None, convention: str,
             enforced: str | None = elsewhere) -> Gang:
        size, problem = _size(raw_size, key=size_key) if size_key else (None, None)
        return Gang(namespace, name, size, convention, enforced, problem)

    ours = labels.get(names.gang_name) or annotations.get(names.gang_name)
    if ours:
        raw = labels.get(names.gang_size) or annotations.get(names.gang_size)
        return make(ours, names.gang_size, raw, "gpu-steward")
    kueue = labels.get(KUEUE_GROUP_LABEL)
    if kueue:
        return make(kueue, KUEUE_COUNT_ANNOTATION, annotations.get(KUEUE_COUNT_ANNOTATION), "kueue")
    coscheduling = labels.get(COSCHEDULING_LABEL)
    if coscheduling:
        return make(coscheduling, None, None, "scheduler-plugins")
    volcano = annotations.get(VOLCANO_ANNOTATION)
    if volcano:
        return make(volcano, None, None, "volcano")
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if group:
        # The native PodGroup's policy decides; the scheduler enforces its gang policy itself.
        return make(group, None, None, "kubernetes-podgroup",
                    enforced=elsewhere or "the native PodGroup's policy is enforced by kube-scheduler")
    return None


def involved(pod: Mapping[str, Any], *, names: settings.Names) -> bool:
    """Whether the gang controller must see this pod even if it requests no GPU: it declares a gang (a gang
    counts every member, e.g. an MPI launcher), or it carries our gate (which only the controller lifts)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return identify(pod, names=names) is not None or any(g.get("name") == names.gate for g in gates)
