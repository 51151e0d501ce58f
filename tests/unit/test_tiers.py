"""Tiers in real clusters: the globalDefault class, a pod's `preemptionPolicy: Never`, claims by label.

Through the whole admission engine (`mutation.decide`), so each row shows the class, priority and
policy the pod leaves with, the record's reason, and the warning the user sees."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from admission import mutation
from common import settings, snapshot
from tests import builders

NOW = 1_000.0
TIER = "gpu-steward.io/tier"
CLAIMS = settings.Tiers(label_claims=[
    settings.LabelClaim(name="serving", tier=settings.Tier.CRITICAL, namespaces=["serving"]),
    settings.LabelClaim(name="prod-labelled", tier=settings.Tier.NORMAL, namespace_labels={"env": "prod"}),
], rules=[settings.TierRule(name="batch", tier=settings.Tier.SCAVENGER, namespaces=["batch"])])
DEFAULT_CLASS = builders.priority_class("cluster-default", 1000)
DEFAULT_CLASS["globalDefault"] = True
NEVER_DEFAULT = builders.priority_class("cluster-default", 1000, policy="Never")
NEVER_DEFAULT["globalDefault"] = True
OWN_CLASS = builders.priority_class("team-low", 50, policy="Never")


def cluster(*extra: dict[str, Any]) -> snapshot.Snapshot:
    return snapshot.build(
        nodes=[builders.gpu_node("n1", gpus=8)], pods=[], priority_classes=[*builders.tier_classes(), *extra],
        namespaces=[builders.namespace(n) for n in ("default", "serving", "batch")]
        + [builders.namespace("shop", {"env": "prod"})],
        names=settings.Names(), taken_at=NOW)


def pod(namespace: str = "default", *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return builders.pod("p", namespace=namespace, gpus=1, labels=labels, mutate=lambda p: p["spec"].update(spec))


# What the in-tree Priority plugin leaves in a pod that named no class under a globalDefault class.
AS_DEFAULTED = {"priorityClassName": "cluster-default", "priority": 1000, "preemptionPolicy": "PreemptLowerPriority"}
AS_DEFAULTED_NEVER = {**AS_DEFAULTED, "preemptionPolicy": "Never"}


@pytest.mark.parametrize(
    ("the_pod", "the_cluster", "tiers", "spec", "reason", "warnings"),
    [
        pytest.param(pod(**AS_DEFAULTED), cluster(DEFAULT_CLASS), settings.Tiers(),
                     ("gpu-steward-normal", 10_000, "PreemptLowerPriority"),
                     "tier normal: class cluster-default is the cluster's globalDefault: no class chosen; default tier",
                     (), id="global-default-is-no-choice"),
        pytest.param(pod(priorityClassName="cluster-default"), cluster(builders.priority_class("cluster-default", 1)),
                     settings.Tiers(), ("cluster-default", None, None),
                     "tier none: kept the pod's priorityClassName cluster-default", (),
                     id="same-name-not-global-default-is-a-choice"),
        pytest.param(pod(**AS_DEFAULTED_NEVER), cluster(NEVER_DEFAULT), settings.Tiers(),
                     ("cluster-default", 1000, "Never"),
                     "tier none: class cluster-default is the cluster's globalDefault: no class chosen; default tier; "
                     "tier normal not applied: the pod's preemptionPolicy Never is kept (class gpu-steward-normal "
                     "preempts)", (), id="never-kept-under-non-preempting-default"),
        pytest.param(pod(**AS_DEFAULTED_NEVER, labels={TIER: "scavenger"}), cluster(NEVER_DEFAULT), settings.Tiers(),
                     ("gpu-steward-scavenger", 100, "Never"),
                     "tier scavenger: class cluster-default is the cluster's globalDefault: no class chosen; label "
                     f"{TIER}=scavenger (not above the operator's tier)", (), id="never-with-a-never-tier-applies"),
        pytest.param(pod(priorityClassName="team-low", priority=50, preemptionPolicy="Never"), cluster(OWN_CLASS),
                     settings.Tiers(override_explicit_class=True), ("team-low", 50, "Never"),
                     "tier none: default tier; tier normal not applied: the pod's preemptionPolicy Never is kept "
                     "(class gpu-steward-normal preempts)", (), id="never-kept-when-overriding-classes"),
        pytest.param(pod(labels={TIER: "critical"}), cluster(), settings.Tiers(),
                     ("gpu-steward-normal", 10_000, "PreemptLowerPriority"), "tier normal: default tier",
                     (f"gpu-steward: label {TIER}=critical refused: namespace default may not claim it "
                      "(tiers.label_claims); tier normal (default tier)",), id="self-promotion-refused-by-default"),
        pytest.param(pod(labels={TIER: "critical"}), cluster(), CLAIMS,
                     ("gpu-steward-normal", 10_000, "PreemptLowerPriority"), "tier normal: default tier",
                     (f"gpu-steward: label {TIER}=critical refused: namespace default may not claim it "
                      "(tiers.label_claims); tier normal (default tier)",), id="critical-refused-outside-its-rule"),
        pytest.param(pod("serving", labels={TIER: "critical"}), cluster(), CLAIMS,
                     ("gpu-steward-critical", 100_000, "PreemptLowerPriority"),
                     f"tier critical: label {TIER}=critical (label claim 'serving')", (), id="critical-claim-allowed"),
        pytest.param(pod("serving", labels={TIER: "normal"}), cluster(), CLAIMS,
                     ("gpu-steward-normal", 10_000, "PreemptLowerPriority"), "tier normal: default tier", (),
                     id="label-equal-to-operator-tier"),
        pytest.param(pod("batch", labels={TIER: "normal"}), cluster(), CLAIMS,
                     ("gpu-steward-scavenger", 100, "Never"), "tier scavenger: rule 'batch'",
                     (f"gpu-steward: label {TIER}=normal refused: namespace batch may not claim it "
                      "(tiers.label_claims); tier scavenger (rule 'batch')",), id="escaping-a-scavenger-rule-refused"),
        pytest.param(pod("shop", labels={TIER: "critical"}), cluster(), CLAIMS,
                     ("gpu-steward-normal", 10_000, "PreemptLowerPriority"), "tier normal: default tier",
                     (f"gpu-steward: label {TIER}=critical refused: namespace shop may not claim it "
                      "(tiers.label_claims); tier normal (default tier)",), id="normal-claim-not-critical"),
        pytest.param(pod(schedulingGroup={"podGroupName": "pg"}, labels={TIER: "scavenger"}), cluster(),
                     settings.Tiers(override_explicit_class=True), (None, None, None),
                     "tier none: not applied: a pod of PodGroup pg must keep the PodGroup's priority", (),
                     id="native-pod-group-member-keeps-its-priority"),
        pytest.param(pod("serving", labels={TIER: "scavenger"}), cluster(), settings.Tiers(),
                     ("gpu-steward-scavenger", 100, "Never"),
                     f"tier scavenger: label {TIER}=scavenger (not above the operator's tier)", (),
                     id="lowering-always-allowed"),
    ],
)
def test_tier(
    the_pod: dict[str, Any], the_cluster: snapshot.Snapshot, tiers: settings.Tiers,
    spec: tuple[str, int | None, str | None], reason: str, warnings: tuple[str, ...],
) -> None:
    config = settings.Settings(tiers=tiers)
    original = copy.deepcopy(the_pod)
    outcome = mutation.decide(operation="CREATE", namespace=the_pod["metadata"]["namespace"], pod=the_pod,
                              cluster=the_cluster, config=config, now=NOW)
    result = jsonpatch.apply_patch(original, outcome.patch)["spec"]
    assert (result.get("priorityClassName"), result.get("priority"), result.get("preemptionPolicy")) == spec
    assert reason in outcome.record.split("; ", 1)[1]
    assert outcome.warnings == warnings
    assert not outcome.skipped
