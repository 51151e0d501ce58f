"""Whether a new pod gets our gang scheduling gate, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import gangs, settings


@dataclasses.dataclass(frozen=True)
class GateDecision:
    add: bool
    reason: str
    gang: gangs.Gang | None
    warning: str | None = None


def decide(
    *, pod: Mapping[str, Any], names: settings.Names, pod_groups: Mapping[str, gangs.PodGroup]
) -> GateDecision:
    """Only called on CREATE: gates can be set at creation and never added later."""
    gang = gangs.identify(pod, names=names, pod_groups=pod_groups)
    if gang is None:
        return GateDecision(False, "not a gang member", None)
    existing = {g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []}
    if names.gate in existing:
        return GateDecision(False, f"gate {names.gate} already present", gang)
    if gang.enforced_elsewhere:
        return GateDecision(False, f"gang {gang.key}: {gang.enforced_elsewhere}", gang)
    if gang.problem:
        return GateDecision(False, f"gang {gang.key} not gated", gang, warning=f"gang {gang.key}: {gang.problem}")
    if gang.size is None:
        return GateDecision(False, f"gang {gang.key}: size unknown ({gang.convention}); not gated", gang,
                            warning=f"gang {gang.key}: no size known at admission, not gated")
    if gang.size == 1:
        return GateDecision(False, f"gang {gang.key} of 1 needs no gate", gang)
    return GateDecision(True, f"gang {gang.key} of {gang.size} ({gang.convention})", gang)
