"""A PriorityClass's reclaim policy, read from the ReclaimIdleResource plugin's annotations.

Prefix `reclaim-idle-resource.scheduling.x-k8s.io/`; both name sets are accepted:
- `minimum-preemptable-priority`: a pending pod needs at least this priority to take the GPUs of an
  idle pod of this class. Default: the idle pod's own `spec.priority` + 1 (`ReclaimPolicy.minimum_for`),
  not the class's current value: the value is copied into the pod at admission and a class re-created
  with a lower value must not let a lower pod take a running one's GPUs. It may be *lower* than the class
  value — idleness, not rank, decides.
- `toleration-seconds`: how long after scheduling a pod is safe. Default 0; negative: never reclaimed.
- `resource-idle-seconds` (alias `gpu-idle-seconds`): the idle window. No window: not reclaimable.
- `resource-idle-usage-threshold` (alias `gpu-idle-usage-threshold`): utilisation in percent under
  which the pod is idle. Default: `descheduler.reclaim.default_idle_threshold_percent`.
- `resource-type`, when given, must be `gpu`.
An unparsable value makes the class not reclaimable; the problem is returned for the shell to report.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from common import label_values, snapshot

PREFIX = "reclaim-idle-resource.scheduling.x-k8s.io/"
MIN_PRIORITY = f"{PREFIX}minimum-preemptable-priority"
TOLERATION = f"{PREFIX}toleration-seconds"
IDLE_SECONDS = (f"{PREFIX}resource-idle-seconds", f"{PREFIX}gpu-idle-seconds")
THRESHOLD = (f"{PREFIX}resource-idle-usage-threshold", f"{PREFIX}gpu-idle-usage-threshold")
RESOURCE_TYPE = f"{PREFIX}resource-type"


@dataclasses.dataclass(frozen=True)
class ReclaimPolicy:
    class_name: str
    reclaimable: bool
    reason: str  # why (not) reclaimable, in words
    minimum_preemptable_priority: int | None  # None: the victim's own priority + 1 (`minimum_for`)
    toleration_seconds: int = 0
    idle_seconds: int | None = None
    threshold_percent: float = 0.0
    problem: str | None = None  # an annotation that could not be parsed (report once)

    def minimum_for(self, priority: int) -> int:
        """The lowest preemptor priority that may take the GPUs of an idle pod of this class whose own
        `spec.priority` is `priority`."""
        explicit = self.minimum_preemptable_priority
        return priority + 1 if explicit is None else explicit


class _Bad(ValueError):
    pass


def _integer(annotations: Mapping[str, str], key: str) -> int | None:
    parsed = label_values.integer(annotations.get(key), key=key)
    if parsed.problem:
        raise _Bad(parsed.problem)
    return parsed.value


def _first(annotations: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    """The first name set present wins; when both are given they must agree (else the class is bad)."""
    present = [k for k in keys if k in annotations]
    values = {str(annotations[k]).strip() for k in present}
    if len(values) > 1:
        raise _Bad(" and ".join(f"{k}={annotations[k]!r}" for k in present) + " disagree")
    return present[0] if present else None


def parse(pc: snapshot.PriorityClass, *, default_threshold_percent: float) -> ReclaimPolicy:
    annotations = pc.annotations
    base = ReclaimPolicy(
        pc.name, False, "", None, threshold_percent=default_threshold_percent
    )
    try:
        minimum = _integer(annotations, MIN_PRIORITY)
        toleration = _integer(annotations, TOLERATION)
        window_key = _first(annotations, IDLE_SECONDS)
        window = _integer(annotations, window_key) if window_key else None
        threshold_key = _first(annotations, THRESHOLD)
        threshold = default_threshold_percent
        if threshold_key:
            raw = annotations[threshold_key]
            try:
                threshold = float(str(raw).strip())
            except ValueError:
                raise _Bad(f"{threshold_key}={raw!r} is not a number") from None
            if not math.isfinite(threshold) or not 0 <= threshold <= 100:
                raise _Bad(f"{threshold_key}={raw!r} is not a percentage in 0..100")
        if window is not None and window <= 0:
            raise _Bad(f"{window_key}={annotations[window_key or '']!r} must be a positive number of seconds")
        resource_type = annotations.get(RESOURCE_TYPE)
        if resource_type is not None and resource_type.strip().lower() != "gpu":
            raise _Bad(f"{RESOURCE_TYPE}={resource_type!r}: only 'gpu' is reclaimed")
    except _Bad as exc:
        return dataclasses.replace(
            base, reason=f"PriorityClass {pc.name} not reclaimable: {exc}", problem=str(exc)
        )
    policy = dataclasses.replace(
        base,
        minimum_preemptable_priority=minimum,
        toleration_seconds=toleration or 0,
        idle_seconds=window,
        threshold_percent=threshold,
    )
    if window is None:
        return dataclasses.replace(policy, reason=f"PriorityClass {pc.name} sets no idle window")
    if policy.toleration_seconds < 0:
        return dataclasses.replace(policy, reason=f"PriorityClass {pc.name} tolerates reclaim forever")
    return dataclasses.replace(
        policy,
        reclaimable=True,
        reason=(
            f"PriorityClass {pc.name}: idle below {threshold:g}% for {window}s, "
            f"after {policy.toleration_seconds}s, for priority {_floor(policy.minimum_preemptable_priority)}"
        ),
    )


def _floor(minimum: int | None) -> str:
    return "above the pod's own" if minimum is None else f">= {minimum}"


def parse_all(
    classes: Mapping[str, snapshot.PriorityClass], *, default_threshold_percent: float
) -> dict[str, ReclaimPolicy]:
    return {name: parse(pc, default_threshold_percent=default_threshold_percent) for name, pc in classes.items()}


def for_pod(pod: snapshot.Pod, policies: Mapping[str, ReclaimPolicy]) -> ReclaimPolicy | str:
    """The pod's policy, or why it has none."""
    if not pod.priority_class_name:
        return "no priorityClassName, so no reclaim policy"
    found = policies.get(pod.priority_class_name)
    if found is None:
        return f"PriorityClass {pod.priority_class_name} not found"
    return found
