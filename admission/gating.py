"""Whether a new pod gets our scheduling gate, and why: for its gang, or to be placed at release.

Two kinds of pods get `<prefix>gang` at creation (gates can be set then and never added later):
- members of a gang of two or more, held until the whole gang can start (the gang controller); they are
  gated even while the controller is not seen alive (with a warning): ungated, a gang's members would
  start one by one and hold GPUs while they wait for each other;
- governed pods: placement `strict`, at least `admission.release_min_gpus` whole GPUs, constraints the
  capacity model evaluates (`capacity.ungoverned`: not the pod's own required inter-pod affinity, hard topology
  spread, resource claims or volumes the scheduler filters on), scheduled by the default scheduler, not a
  DaemonSet's and held by no other controller's gate. The release controller
  places each as a gang of one on fresh state, nominates it to its node and removes the gate. They are gated only while
  that controller is seen alive (its leader Lease renewed recently, timed on our clock); otherwise
  nothing would ever lift the gate, so they get preferred terms instead.

A member of our own gang of two or more that we gate also names the gang's own PodGroup in `spec.schedulingGroup`
where the API server serves `scheduling.k8s.io/v1beta1` (`native_binding`): whatever lifts our gate creates it
first, and kube-scheduler then binds the gang all-or-nothing (docs/placement.md).

Never gated: a pod created with `spec.nodeName` (the API server rejects gates on it; it is not scheduled).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from common import capacity, dra, gangs, gpu, settings


class Release(enum.StrEnum):
    """What admission did about placement at release, for the metric (None: the pod is not governed)."""

    GATED = "gated"  # gated; the release controller places it
    CONTROLLER_DOWN = "controller-down"  # governed, but the controller is not seen alive: not gated


@dataclasses.dataclass(frozen=True)
class GateDecision:
    add: bool
    reason: str
    gang: gangs.Gang | None
    warning: str | None = None
    release: Release | None = None  # set for governed single pods

    @property
    def for_release(self) -> bool:
        """Gated to be placed at release: the release controller nominates it, preferred terms would be wasted bytes."""
        return self.release is Release.GATED


@dataclasses.dataclass(frozen=True)
class Controller:
    """The release controller as the webhook sees it: when its leader Lease was last seen renewed."""

    seen_at: float | None  # on the webhook's clock; None: never seen, released or deleted
    lease: str  # namespace/name, for the reasons

    def alive(self, *, now: float, stale_after: float) -> tuple[bool, str]:
        if self.seen_at is None:
            return False, f"Lease {self.lease} not seen held and renewed"
        age = max(0.0, now - self.seen_at)
        if age > stale_after:
            return False, f"Lease {self.lease} last seen renewed {age:.0f}s ago (over {stale_after:g}s)"
        return True, f"Lease {self.lease} renewed {age:.0f}s ago"


def decide(
    *,
    pod: Mapping[str, Any],
    request: gpu.GpuRequest,
    placement: settings.Placement,
    controller: Controller,
    config: settings.Settings,
    now: float,
    pod_groups: gangs.PodGroups,
    claims: dra.PodGpus = dra.NONE,
) -> GateDecision:
    """Only called on CREATE: gates can be set at creation and never added later. `claims`: what the DRA model
    makes of the pod's resource claims (`dra.pod_gpus`; `request` counts their GPUs already)."""
    names = config.names
    gang = gangs.identify(pod, names=names, pod_groups=pod_groups)
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return GateDecision(False, f"spec.nodeName {spec['nodeName']}: bound at creation, never gated "
                                   "(the API server refuses gates on it)", gang)
    existing = {g.get("name") for g in spec.get("schedulingGates") or []}
    if names.gate in existing:
        return GateDecision(False, f"gate {names.gate} already present", gang)
    alive, why = controller.alive(now=now, stale_after=config.admission.controller_stale_seconds)
    if gang is not None and gang.size != 1:
        held = _for_gang(gang)
        if held.add and not alive:
            # Still gated: released one by one, a gang would hold GPUs while it waits for its other members.
            return dataclasses.replace(held, warning=f"gang {gang.key} gated, but the descheduler that releases it "
                                                     f"is not seen running ({why})")
        return held
    single = _for_release(pod, existing, request, placement, config=config, controller=(alive, why), claims=claims)
    if gang is None:
        return single
    return dataclasses.replace(single, reason=f"gang {gang.key} of 1: {single.reason}", gang=gang)


def native_binding(pod: Mapping[str, Any], *, gate: GateDecision, config: settings.Settings,
                   served: str | None) -> str | None:
    """The PodGroup of our own to name in `spec.schedulingGroup` of a member we gate (`pod`: as mutated, with its
    final PriorityClass), so that kube-scheduler binds the gang all-or-nothing once released; None where that
    would not hold: not a gang of several we gate, the setting is off, the gang is not ours, `served` (the
    PodGroup API version the API server serves; None: not known) is not `scheduling.k8s.io/v1beta1` (1.36's
    v1alpha2 gang scheduling ignores nominations), the pod names a PodGroup already (immutable), or the names
    make no PodGroup name."""
    gang = gate.gang
    if not gate.add or gang is None or gang.size is None or gang.size < 2 or gang.convention != "gpu-steward":
        return None
    if not config.descheduler.gangs.native_binding:
        return None
    if served != gangs.OWN_POD_GROUP_VERSION or (pod.get("spec") or {}).get("schedulingGroup"):
        return None
    return gangs.own_pod_group(gang.name, (pod.get("spec") or {}).get("priorityClassName"))


def _for_gang(gang: gangs.Gang) -> GateDecision:
    if gang.enforced_elsewhere:
        return GateDecision(False, f"gang {gang.key}: {gang.enforced_elsewhere}", gang)
    if gang.problem:
        return GateDecision(False, f"gang {gang.key} not gated", gang, warning=f"gang {gang.key}: {gang.problem}")
    if gang.size is None:
        return GateDecision(False, f"gang {gang.key}: size unknown ({gang.convention}); not gated", gang,
                            warning=f"gang {gang.key}: no size known at admission, not gated")
    return GateDecision(True, f"gang {gang.key} of {gang.size} ({gang.convention})", gang)


def _for_release(
    pod: Mapping[str, Any], existing: set[Any], request: gpu.GpuRequest, placement: settings.Placement, *,
    config: settings.Settings, controller: tuple[bool, str], claims: dra.PodGpus = dra.NONE,
) -> GateDecision:
    """`controller`: whether it is seen alive, and why."""
    cfg = config.admission
    if claims.left:  # checked first: its GPU count may read 0 because the model cannot count it
        return GateDecision(False, f"{claims.left}: DRA claims left to kube-scheduler, not placed at release", None)
    if request.full == 0:
        return GateDecision(False, "no whole GPUs: not placed at release", None)
    if placement is not settings.Placement.STRICT:
        return GateDecision(False, f"placement {placement.value}: never gated", None)
    if not cfg.release_enabled:
        return GateDecision(False, "placement at release is off (admission.release_enabled)", None)
    if not config.descheduler.gangs.enabled:  # the controller may hold its Lease without running the release loop
        return GateDecision(False, "placement at release is off (descheduler.gangs.enabled)", None)
    if request.full < cfg.release_min_gpus:
        return GateDecision(False, f"{request.full} GPUs, under admission.release_min_gpus={cfg.release_min_gpus}: "
                                   "not placed at release", None)
    spec = pod.get("spec") or {}
    unmodelled = capacity.ungoverned(spec, claims=claims)
    if unmodelled:  # the model cannot say where it fits: no exact placement to make
        return GateDecision(False, f"{unmodelled}: placed by kube-scheduler, not at release", None)
    scheduler = spec.get("schedulerName") or gangs.DEFAULT_SCHEDULER
    if scheduler != gangs.DEFAULT_SCHEDULER:
        return GateDecision(False, f"scheduler {scheduler} places it: not placed at release", None)
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if any(o.get("kind") == "DaemonSet" for o in owners):  # its controller pins it to its node already
        return GateDecision(False, "a DaemonSet pod, bound to its node by its controller: not placed at release", None)
    others = sorted(str(g) for g in existing)
    if others:
        return GateDecision(False, f"held by {', '.join(others)}: another controller decides when it starts; "
                                   "not placed at release", None)
    alive, why = controller
    if not alive:
        return GateDecision(False, f"not placed at release: controller down ({why})", None,
                            release=Release.CONTROLLER_DOWN)
    return GateDecision(True, f"placed at release ({why})", None, release=Release.GATED)
