"""GPU resources of pods and nodes: full GPUs (`nvidia.com/gpu`) and MIG slices (`nvidia.com/mig-<profile>`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

FULL_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


class QuantityError(ValueError):
    """A GPU quantity that is not a whole, non-negative number."""


@dataclasses.dataclass(frozen=True)
class GpuRequest:
    """What a pod asks for (or a node offers): whole GPUs and MIG slices by profile (e.g. `3g.40gb`)."""

    full: int = 0
    mig: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def any(self) -> bool:
        return self.full > 0 or any(self.mig.values())

    def describe(self) -> str:
        parts = [f"{self.full} GPU"] if self.full else []
        parts += [f"{count}x MIG {profile}" for profile, count in sorted(self.mig.items()) if count]
        return ", ".join(parts) or "no GPU"


def parse_quantity(value: Any, *, resource: str) -> int:
    """GPUs are counted in whole units; '1', 1 and '1.0' are accepted, '500m' or '-1' are not."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        raise QuantityError(f"{resource}: {text!r} is not a whole number of devices") from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise QuantityError(f"{resource}: {text!r} is not a whole number of devices")
    return int(number)


def from_resources(resources: Mapping[str, Any]) -> GpuRequest:
    full = 0
    mig: dict[str, int] = {}
    for name, value in resources.items():
        if name == FULL_GPU:
            full += parse_quantity(value, resource=name)
        elif name.startswith(MIG_PREFIX):
            profile = name[len(MIG_PREFIX):]
            mig[profile] = mig.get(profile, 0) + parse_quantity(value, resource=name)
    return GpuRequest(full=full, mig={k: v for k, v in mig.items() if v})


def _container_request(container: Mapping[str, Any]) -> GpuRequest:
    resources = container.get("resources") or {}
    # Extended resources must be set in limits; requests, if given, must equal them.
    return from_resources(resources.get("limits") or resources.get("requests") or {})


def add(a: GpuRequest, b: GpuRequest) -> GpuRequest:
    """Both requests together."""
    mig = dict(a.mig)
    for profile, count in b.mig.items():
        mig[profile] = mig.get(profile, 0) + count
    return GpuRequest(full=a.full + b.full, mig=mig)


def _max(a: GpuRequest, b: GpuRequest) -> GpuRequest:
    profiles = set(a.mig) | set(b.mig)
    return GpuRequest(
        full=max(a.full, b.full), mig={p: max(a.mig.get(p, 0), b.mig.get(p, 0)) for p in profiles}
    )


def pod_request(pod: Mapping[str, Any]) -> GpuRequest:
    """The pod's effective GPU request, as the scheduler counts it.

    Regular containers add up; an init container runs alone, so the pod needs the larger of the
    two. Restartable (sidecar) init containers keep running and add up like regular ones.
    Raises QuantityError for a malformed quantity.
    """
    running, peak_init = _requests(pod)
    return _max(running, peak_init)


def running_request(pod: Mapping[str, Any]) -> GpuRequest:
    """The GPUs the pod's running containers hold once it has started: its containers' and its restartable
    (sidecar) init containers' requests, without the peak of a one-off init container's.

    The scheduler accounts the larger of the two (`pod_request`: what evicting the pod frees), but once its init
    containers are done no running container holds the extra GPUs, so DCGM attributes none of their samples to the
    pod: what a measurement of the pod can expect to see. Raises QuantityError for a malformed quantity."""
    return _requests(pod)[0]


def _requests(pod: Mapping[str, Any]) -> tuple[GpuRequest, GpuRequest]:
    """(containers + sidecars, the peak of any one init container run with the sidecars started before it)."""
    spec = pod.get("spec") or {}
    total = GpuRequest()
    for container in spec.get("containers") or []:
        total = add(total, _container_request(container))
    sidecars = GpuRequest()
    peak_init = GpuRequest()
    for container in spec.get("initContainers") or []:
        request = _container_request(container)
        if container.get("restartPolicy") == "Always":
            sidecars = add(sidecars, request)
        else:
            peak_init = _max(peak_init, add(sidecars, request))
    return add(total, sidecars), peak_init


def node_allocatable(node: Mapping[str, Any]) -> GpuRequest:
    """GPUs the node offers (allocatable, else capacity); malformed values count as none."""
    status = node.get("status") or {}
    resources = status.get("allocatable") or status.get("capacity") or {}
    try:
        return from_resources(resources)
    except QuantityError:
        return GpuRequest()
