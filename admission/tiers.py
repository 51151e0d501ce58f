"""Which priority tier a GPU pod belongs to, and why.

Order: a priorityClassName the user set (kept unless `tiers.override_explicit_class`), the pod's
`<prefix>tier` label, the first matching rule in settings, the default tier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import settings


@dataclasses.dataclass(frozen=True)
class TierDecision:
    tier: settings.Tier | None  # None: the user's own class, not one of ours
    keep_user_class: bool
    reason: str
    warning: str | None = None


def _rule_matches(
    rule: settings.TierRule, *, namespace: str, namespace_labels: Mapping[str, str], pod: Mapping[str, Any]
) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owner_kinds = {o.get("kind") for o in meta.get("ownerReferences") or []}
    return (
        (not rule.namespaces or namespace in rule.namespaces)
        and all(namespace_labels.get(k) == v for k, v in rule.namespace_labels.items())
        and all(labels.get(k) == v for k, v in rule.pod_labels.items())
        and (not rule.owner_kinds or bool(owner_kinds & set(rule.owner_kinds)))
    )


def decide(
    *,
    pod: Mapping[str, Any],
    namespace: str,
    namespace_labels: Mapping[str, str],
    tiers: settings.Tiers,
    names: settings.Names,
) -> TierDecision:
    user_class = (pod.get("spec") or {}).get("priorityClassName")
    if user_class and not tiers.override_explicit_class:
        return TierDecision(tiers.tier_of_class(user_class), True, f"kept the pod's priorityClassName {user_class}")

    warning = None
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(names.tier)
    if label is not None:
        try:
            return TierDecision(settings.Tier(label), False, f"label {names.tier}={label}")
        except ValueError:
            allowed = ", ".join(t.value for t in settings.Tier)
            warning = f"label {names.tier}={label!r} is not one of {allowed}; ignored"

    for rule in tiers.rules:
        if _rule_matches(rule, namespace=namespace, namespace_labels=namespace_labels, pod=pod):
            return TierDecision(rule.tier, False, f"rule {rule.name!r}", warning)
    return TierDecision(tiers.default, False, "default tier", warning)
