"""Which priority tier a GPU pod belongs to, and why.

Order: a priorityClassName the user set (kept unless `tiers.override_explicit_class`), else the
operator's tier (first matching rule in settings, else the default tier), which the pod's
`<prefix>tier` label may replace within what the operator allows.

- The cluster's `globalDefault` PriorityClass counts as no class chosen: the in-tree Priority admission
  plugin runs before mutating webhooks and writes its name into every pod that named none.
- A label may always lower the operator's tier (or repeat it); raising it needs a `tiers.label_claims`
  rule for that tier (or a higher one) matching the namespace. A refused claim is a warning, never a
  denial: the pod gets the operator's tier.
- A pod that arrives with `preemptionPolicy: Never` keeps it: when the chosen tier's class would
  preempt, the tier is not applied (the pod keeps its class), and the record says so.
- A pod of a native PodGroup (`spec.schedulingGroup`) keeps its class: kube-scheduler refuses to schedule
  a PodGroup whose pods' priority differs from the PodGroup's own (seen on 1.37.2: "all pods in a single pod
  group should have the same priority as the pod group's priority"); the PodGroup's class sets it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from common import label_selectors, label_values, settings, snapshot

NEVER = "Never"


@dataclasses.dataclass(frozen=True)
class TierDecision:
    tier: settings.Tier | None  # None: the user's own class, not one of ours
    keep_user_class: bool  # True: leave priorityClassName, priority and preemptionPolicy as they came
    reason: str
    warnings: tuple[str, ...] = ()


def _namespace_matches(
    namespaces: Sequence[str], wanted_labels: Mapping[str, str], *, namespace: str, labels: Mapping[str, str]
) -> bool:
    return (not namespaces or namespace in namespaces) and label_selectors.has_labels(wanted_labels, labels)


def _rule_matches(
    rule: settings.TierRule, *, namespace: str, namespace_labels: Mapping[str, str], pod: Mapping[str, Any]
) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owner_kinds = {o.get("kind") for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping)}
    return (
        _namespace_matches(rule.namespaces, rule.namespace_labels, namespace=namespace, labels=namespace_labels)
        and label_selectors.has_labels(rule.pod_labels, labels)
        and (not rule.owner_kinds or bool(owner_kinds & set(rule.owner_kinds)))
    )


def _operator_tier(
    *, pod: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, str], tiers: settings.Tiers
) -> tuple[settings.Tier, str]:
    for rule in tiers.rules:
        if _rule_matches(rule, namespace=namespace, namespace_labels=namespace_labels, pod=pod):
            return rule.tier, f"rule {rule.name!r}"
    return tiers.default, "default tier"


def _claim(
    claimed: settings.Tier, *, base: settings.Tier, namespace: str, namespace_labels: Mapping[str, str],
    tiers: settings.Tiers,
) -> str | None:
    """Why the label's tier is allowed (None: refused)."""
    rank = tiers.for_tier(claimed).value
    if rank <= tiers.for_tier(base).value:
        return "not above the operator's tier"
    for claim in tiers.label_claims:
        if tiers.for_tier(claim.tier).value >= rank and _namespace_matches(
            claim.namespaces, claim.namespace_labels, namespace=namespace, labels=namespace_labels
        ):
            return f"label claim {claim.name!r}"
    return None


def decide(
    *,
    pod: Mapping[str, Any],
    namespace: str,
    namespace_labels: Mapping[str, str],
    priority_classes: Mapping[str, snapshot.PriorityClass],
    tiers: settings.Tiers,
    names: settings.Names,
) -> TierDecision:
    spec = pod.get("spec") or {}
    user_class = spec.get("priorityClassName")
    kept = tiers.tier_of_class(user_class) if isinstance(user_class, str) else None
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if group:
        return TierDecision(kept, True, f"not applied: a pod of PodGroup {group} must keep the PodGroup's priority")
    notes: list[str] = []
    known = priority_classes.get(user_class) if isinstance(user_class, str) else None
    if known is not None and known.global_default:
        notes.append(f"class {user_class} is the cluster's globalDefault: no class chosen")
    elif user_class and not tiers.override_explicit_class:
        return TierDecision(kept, True, f"kept the pod's priorityClassName {user_class}")

    tier, why = _operator_tier(pod=pod, namespace=namespace, namespace_labels=namespace_labels, tiers=tiers)
    warnings: list[str] = []
    meta = pod.get("metadata") or {}
    label = label_values.choice((meta.get("labels") or {}).get(names.tier), settings.Tier, key=names.tier, default=tier)
    if label.problem:
        warnings.append(f"label {label.problem}")
    elif label.value is not tier:
        allowed = _claim(label.value, base=tier, namespace=namespace, namespace_labels=namespace_labels, tiers=tiers)
        if allowed:
            tier, why = label.value, f"label {names.tier}={label.value.value} ({allowed})"
        else:
            warnings.append(f"label {names.tier}={label.value.value} refused: namespace {namespace} may not claim "
                            f"it (tiers.label_claims); tier {tier.value} ({why})")
    notes.append(why)

    wanted = tiers.for_tier(tier)
    if spec.get("preemptionPolicy") == NEVER and wanted.preemption_policy != NEVER:
        notes.append(f"tier {tier.value} not applied: the pod's preemptionPolicy {NEVER} is kept "
                     f"(class {wanted.name} preempts)")
        return TierDecision(kept, True, "; ".join(notes), tuple(warnings))
    return TierDecision(tier, False, "; ".join(notes), tuple(warnings))
