"""Which gang a pod belongs to — one parser for the webhook (gating) and the gang controller (release).

Conventions, first match wins:
- ours: `<prefix>gang-name` + `<prefix>gang-size` (labels, or annotations);
- Kueue pod groups: label `kueue.x-k8s.io/pod-group-name` + annotation
  `kueue.x-k8s.io/pod-group-total-count`;
- scheduler-plugins coscheduling: label `scheduling.x-k8s.io/pod-group` (size lives in a PodGroup);
- Volcano: annotation `scheduling.k8s.io/group-name` (size lives in a PodGroup);
- Kubernetes' native workload API (1.36 alpha, 1.37 beta): `spec.schedulingGroup.podGroupName` naming a
  `scheduling.k8s.io` PodGroup. Only a PodGroup with a `gang` policy is a gang kube-scheduler holds
  together; it wins over every other convention (two gang mechanisms on one pod would fight). A PodGroup
  with a `basic` policy groups nothing for scheduling: its pods are read like any other (Kubernetes 1.38 may
  give every Job one). A PodGroup we do not know (not read yet, or its API not served or granted to us: the
  feeder reads the first of `POD_GROUP_VERSIONS` the API server serves) is taken as a native gang, as every
  `podGroupName` was before PodGroups were read: our gate on a pod the native scheduler already holds could
  strand it. The reason says which of the two it was.

Our own gangs may be bound all-or-nothing by kube-scheduler too (`descheduler.gangs.native_binding`): where the
API server serves `scheduling.k8s.io/v1beta1` PodGroups, the webhook names the gang's own PodGroup
(`own_pod_group`) in a member's `spec.schedulingGroup` at creation, and whatever lifts our gate creates that
PodGroup first (`pod_group_body`; `common.pod_groups.ensure`): kube-scheduler holds a pod whose PodGroup does
not exist in its queue for ever. A pod naming its gang's own PodGroup stays one of our gangs (not one enforced
elsewhere): the PodGroup only makes its binding all-or-nothing once we release it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from common import label_values, settings

DEFAULT_SCHEDULER = "default-scheduler"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
# The PodGroup API versions we read, preferred first: 1.37 beta, 1.37 alpha, 1.36 alpha (same fields, but v1alpha2's
# `spec.disruptionMode` is a string, `Pod` or `PodGroup`, where later versions have `{single: {}}` or `{all: {}}`).
POD_GROUP_VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2")
_V1ALPHA2_DISRUPTION = {"PodGroup": "all", "Pod": "single"}
# The one version our own PodGroups are made in: 1.36's v1alpha2 gang scheduling ignores the members' nominations
# (tests/e2e/test_native_gang_binding_facts_e2e.py), and v1alpha3 was never seen here.
OWN_POD_GROUP_VERSION = "v1beta1"
OWN_POD_GROUP_PREFIX = "gpu-steward-"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclasses.dataclass(frozen=True)
class PodGroup:
    """What we read of a native `scheduling.k8s.io` PodGroup."""

    namespace: str
    name: str
    min_count: int | None  # the gang policy's minCount; None: no gang policy (basic)
    disruption: str | None = None  # `spec.disruptionMode`: "all" (its pods go together), "single", None: unset

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_group(raw: Mapping[str, Any]) -> PodGroup:
    meta = raw.get("metadata") or {}
    gang = ((raw.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
    min_count = None
    if isinstance(gang, Mapping):
        # The API server validates minCount >= 1; a gang policy without one still holds the pods together.
        number = gang.get("minCount")
        min_count = number if isinstance(number, int) and not isinstance(number, bool) and number > 0 else 1
    mode = (raw.get("spec") or {}).get("disruptionMode")
    disruption = (next((m for m in ("all", "single") if m in mode), None) if isinstance(mode, Mapping)
                  else _V1ALPHA2_DISRUPTION.get(mode) if isinstance(mode, str) else None)
    return PodGroup(meta.get("namespace") or "default", meta.get("name") or "", min_count, disruption)


@dataclasses.dataclass(frozen=True)
class PodGroups(Mapping[str, PodGroup]):
    """The native PodGroups known, by `namespace/name`, and the API version they were read from (None: the API
    is not served or not granted to us, so none can be known)."""

    by_key: Mapping[str, PodGroup] = dataclasses.field(default_factory=dict)
    version: str | None = POD_GROUP_VERSIONS[0]

    def __getitem__(self, key: str) -> PodGroup:
        return self.by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_key)

    def __len__(self) -> int:
        return len(self.by_key)


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


def identify(
    pod: Mapping[str, Any], *, names: settings.Names, pod_groups: PodGroups | None = None
) -> Gang | None:
    """`pod_groups`: the native PodGroups known (`Snapshot.pod_groups`); None: none known yet."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    notes: Mapping[str, str] = meta.get("annotations") or {}
    namespace = meta.get("namespace") or "default"
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    elsewhere = None if scheduler == DEFAULT_SCHEDULER else f"scheduler {scheduler} places the gang"

    def make(name: str, size_key: str | None, raw_size: str | None, convention: str,
             enforced: str | None = elsewhere) -> Gang:
        size = label_values.count(raw_size, key=size_key) if size_key else label_values.Parsed(None)
        return Gang(namespace, name, size.value, convention, enforced, size.problem)

    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    ours = label_values.value(meta, names.gang_name)
    if ours and group and group == own_pod_group(ours, spec.get("priorityClassName")):
        return make(ours, names.gang_size, label_values.value(meta, names.gang_size), "gpu-steward")
    known = pod_groups if pod_groups is not None else PodGroups()
    native = known.get(f"{namespace}/{group}") if group else None
    if group and (native is None or native.min_count is not None):
        why = (f"PodGroup {group} has a gang policy (minCount {native.min_count}) kube-scheduler enforces"
               if native is not None else f"PodGroup {group} not known here; taken as a native gang"
               if known.version is not None else
               f"PodGroup {group}: no PodGroup API served to us ({_versions()}); taken as a native gang")
        return Gang(namespace, group, native.min_count if native else None, "kubernetes-podgroup", elsewhere or why)
    if ours:
        return make(ours, names.gang_size, label_values.value(meta, names.gang_size), "gpu-steward")
    kueue = labels.get(KUEUE_GROUP_LABEL)
    if kueue:
        return make(kueue, KUEUE_COUNT_ANNOTATION, notes.get(KUEUE_COUNT_ANNOTATION), "kueue")
    coscheduling = labels.get(COSCHEDULING_LABEL)
    if coscheduling:
        return make(coscheduling, None, None, "scheduler-plugins")
    volcano = notes.get(VOLCANO_ANNOTATION)
    if volcano:
        return make(volcano, None, None, "volcano")
    return None


def own_pod_group(gang_name: str, priority_class: str | None) -> str | None:
    """The name of our gang's own PodGroup for its members of `priority_class` (kube-scheduler refuses a PodGroup
    whose pods' priority differs from its own: an MPI launcher without GPUs, hence without a tier, goes in a group
    of its own); None when that makes no valid name (a DNS label)."""
    name = OWN_POD_GROUP_PREFIX + gang_name + (f"-{priority_class}" if priority_class else "")
    return name if len(name) <= 63 and _DNS_LABEL.fullmatch(name) else None


def named_pod_group(pod: Mapping[str, Any], *, names: settings.Names) -> str | None:
    """The PodGroup of our own gang that `pod` names in `spec.schedulingGroup`; None if it names none of ours."""
    spec = pod.get("spec") or {}
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    ours = label_values.value(pod.get("metadata") or {}, names.gang_name)
    return group if ours and group and group == own_pod_group(ours, spec.get("priorityClassName")) else None


def same_pod_group(pods: Iterable[Mapping[str, Any]], *, like: Mapping[str, Any], names: settings.Names
                   ) -> list[Mapping[str, Any]]:
    """Those of `pods` that name the same PodGroup of ours as `like` (in its namespace); [] if `like` names none."""
    group = named_pod_group(like, names=names)
    namespace = (like.get("metadata") or {}).get("namespace")
    return [p for p in pods if group and named_pod_group(p, names=names) == group
            and (p.get("metadata") or {}).get("namespace") == namespace]


def pod_group_bodies(members: Sequence[Mapping[str, Any]], *, names: settings.Names) -> list[dict[str, Any]]:
    """Our gang's own PodGroups for `members` (the live pods of one gang), one per PodGroup they name: a gang
    policy of minCount = the members naming it (a gang released incomplete at its bound must not wait in
    kube-scheduler for members that were never created; a complete one's are all there), their PriorityClass,
    owned by each of them, so the garbage collector deletes it once they are all gone."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for member in members:
        if group := named_pod_group(member, names=names):
            groups.setdefault(group, []).append(member)
    return [_body(group, named) for group, named in sorted(groups.items())]


def _body(group: str, named: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    first = named[0]
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": len(named)}}}
    if (first.get("spec") or {}).get("priorityClassName"):
        spec["priorityClassName"] = first["spec"]["priorityClassName"]
    owners = [{"apiVersion": "v1", "kind": "Pod", "name": m["metadata"]["name"], "uid": m["metadata"]["uid"]}
              for m in named if (m.get("metadata") or {}).get("uid")]
    return {"apiVersion": f"scheduling.k8s.io/{OWN_POD_GROUP_VERSION}", "kind": "PodGroup",
            "metadata": {"name": group, "namespace": (first.get("metadata") or {}).get("namespace") or "default",
                         "ownerReferences": owners, "labels": {"app.kubernetes.io/managed-by": "gpu-steward"}},
            "spec": spec}


def _versions() -> str:
    return ", ".join(f"scheduling.k8s.io/{v}" for v in POD_GROUP_VERSIONS)


def gated(pod: Mapping[str, Any], *, names: settings.Names) -> bool:
    """Whether the pod carries our gate (which only the controller lifts)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == names.gate for g in gates)


def involved(pod: Mapping[str, Any], *, names: settings.Names) -> bool:
    """Whether the gang controller must see this pod even if it requests no GPU: it declares a gang (a gang
    counts every member, e.g. an MPI launcher), or it carries our gate."""
    return identify(pod, names=names) is not None or gated(pod, names=names)
