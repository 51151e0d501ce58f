"""Tiers in real clusters: the globalDefault class, a pod's `preemptionPolicy: Never`, claims by label.

Through the whole admission engine (`mutation.decide`), so each row shows the class, priority and
policy the pod leaves with, the record's reason, and the warning the user sees."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from admission import mutation
from admission import tiers as tier_rules
from common import settings, snapshot, snapshot_build
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
    return snapshot_build.build(
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


# --- every stated rule of admission/tiers.py, straight through `tiers.decide` --------------------------------------

Tier = settings.Tier
RULES = settings.Tiers(rules=[
    settings.TierRule(name="jobs", tier=Tier.SCAVENGER, owner_kinds=["Job", "CronJob"]),
    settings.TierRule(name="serving-ns", tier=Tier.CRITICAL, namespaces=["serving", "serving-b"]),
    settings.TierRule(name="prod-web", tier=Tier.CRITICAL, namespace_labels={"env": "prod"}, pod_labels={"app": "web"}),
    settings.TierRule(name="research", tier=Tier.SCAVENGER, namespace_labels={"team": "research"}),
], label_claims=[
    settings.LabelClaim(name="research-normal", tier=Tier.NORMAL, namespace_labels={"team": "research"}),
    settings.LabelClaim(name="lab-critical", tier=Tier.CRITICAL, namespaces=["lab"], namespace_labels={"env": "prod"}),
])
CLASSES = {pc.name: pc for pc in cluster(DEFAULT_CLASS).priority_classes.values()}


def raw_pod(*, labels: dict[str, str] | None = None, owners: tuple[str, ...] = (), **spec: Any) -> dict[str, Any]:
    body = pod(labels=labels, **spec)
    if owners:
        body["metadata"]["ownerReferences"] = [{"kind": kind, "name": "o", "controller": not i}
                                               for i, kind in enumerate(owners)]
    return body


@pytest.mark.parametrize(
    ("the_pod", "namespace", "namespace_labels", "tiers", "expected"),
    [
        # Odd inputs first: a tier label that is no tier, owner references that are no objects, a class that names
        # one of our tiers, a PodGroup member under override.
        pytest.param(raw_pod(labels={TIER: "gold"}), "default", {}, RULES,
                     (Tier.NORMAL, False, "default tier", (f"label {TIER}='gold' is not one of critical, normal, "
                                                           "scavenger; using normal",)), id="label-not-a-tier"),
        pytest.param(raw_pod(owners=("Job",)) | {"metadata": {"ownerReferences": ["junk", {"kind": "Job"}]}},
                     "default", {}, RULES, (Tier.SCAVENGER, False, "rule 'jobs'", ()),
                     id="owner-reference-not-an-object-is-skipped"),
        pytest.param(raw_pod(priorityClassName="gpu-steward-critical"), "default", {}, RULES,
                     (Tier.CRITICAL, True, "kept the pod's priorityClassName gpu-steward-critical", ()),
                     id="own-tier-class-kept-with-its-tier"),
        pytest.param(raw_pod(schedulingGroup={"podGroupName": "pg"}, priorityClassName="gpu-steward-normal"),
                     "serving", {}, RULES.model_copy(update={"override_explicit_class": True}),
                     (Tier.NORMAL, True, "not applied: a pod of PodGroup pg must keep the PodGroup's priority", ()),
                     id="pod-group-member-keeps-its-class-under-override"),
        pytest.param(raw_pod(schedulingGroup={}), "serving", {}, RULES,
                     (Tier.CRITICAL, False, "rule 'serving-ns'", ()), id="boundary-scheduling-group-without-a-name"),
        # Rules: first match wins; every criterion given must match.
        pytest.param(raw_pod(owners=("Job",)), "serving", {}, RULES, (Tier.SCAVENGER, False, "rule 'jobs'", ()),
                     id="first-matching-rule-wins"),
        pytest.param(raw_pod(owners=("ReplicaSet", "CronJob")), "default", {}, RULES,
                     (Tier.SCAVENGER, False, "rule 'jobs'", ()), id="owner-kinds-any-owner-reference"),
        pytest.param(raw_pod(owners=("ReplicaSet",)), "default", {}, RULES, (Tier.NORMAL, False, "default tier", ()),
                     id="owner-kinds-other-kind-no-match"),
        pytest.param(raw_pod(), "serving-b", {}, RULES, (Tier.CRITICAL, False, "rule 'serving-ns'", ()),
                     id="namespaces-any-listed"),
        pytest.param(raw_pod(), "serving-c", {}, RULES, (Tier.NORMAL, False, "default tier", ()),
                     id="namespaces-not-listed"),
        pytest.param(raw_pod(labels={"app": "web"}), "shop", {"env": "prod"}, RULES,
                     (Tier.CRITICAL, False, "rule 'prod-web'", ()), id="namespace-and-pod-labels"),
        pytest.param(raw_pod(labels={"app": "db"}), "shop", {"env": "prod"}, RULES,
                     (Tier.NORMAL, False, "default tier", ()), id="pod-labels-other-value"),
        pytest.param(raw_pod(labels={"app": "web"}), "shop", {"env": "dev"}, RULES,
                     (Tier.NORMAL, False, "default tier", ()), id="namespace-labels-other-value"),
        pytest.param(raw_pod(labels={"app": "web"}), "shop", {}, RULES, (Tier.NORMAL, False, "default tier", ()),
                     id="boundary-namespace-without-labels"),
        pytest.param(raw_pod(), "default", {}, RULES.model_copy(update={"default": Tier.SCAVENGER}),
                     (Tier.SCAVENGER, False, "default tier", ()), id="no-rule-default-tier"),
        # Class chosen by the user
        pytest.param(raw_pod(priorityClassName="team-low"), "serving", {}, RULES,
                     (None, True, "kept the pod's priorityClassName team-low", ()), id="user-class-kept"),
        pytest.param(raw_pod(priorityClassName="team-low"), "serving", {},
                     RULES.model_copy(update={"override_explicit_class": True}),
                     (Tier.CRITICAL, False, "rule 'serving-ns'", ()), id="user-class-overridden"),
        pytest.param(raw_pod(priorityClassName="cluster-default"), "serving", {}, RULES,
                     (Tier.CRITICAL, False, "class cluster-default is the cluster's globalDefault: no class chosen; "
                      "rule 'serving-ns'", ()), id="global-default-is-no-choice"),
        pytest.param(raw_pod(priorityClassName=5), "serving", {}, RULES,
                     (None, True, "kept the pod's priorityClassName 5", ()), id="class-not-a-string-kept"),
        pytest.param(raw_pod(priorityClassName=["x"]), "serving", {}, RULES,
                     (None, True, "kept the pod's priorityClassName ['x']", ()), id="class-not-even-hashable-kept"),
        # Label claims: lowering (or repeating) always; raising within a claim of that tier or higher
        pytest.param(raw_pod(labels={TIER: "scavenger"}), "serving", {}, RULES,
                     (Tier.SCAVENGER, False, f"label {TIER}=scavenger (not above the operator's tier)", ()),
                     id="label-lowers"),
        pytest.param(raw_pod(labels={TIER: "critical"}), "serving", {}, RULES,
                     (Tier.CRITICAL, False, "rule 'serving-ns'", ()), id="boundary-label-repeats-the-tier"),
        pytest.param(raw_pod(labels={TIER: "critical"}), "default", {}, RULES.model_copy(update={
                         "critical": settings.TierClass(name="gpu-steward-critical", value=10_000)}),
                     (Tier.CRITICAL, False, f"label {TIER}=critical (not above the operator's tier)", ()),
                     id="boundary-a-claim-of-equal-rank-is-not-above"),
        pytest.param(raw_pod(labels={TIER: "normal"}), "r", {"team": "research"}, RULES,
                     (Tier.NORMAL, False, f"label {TIER}=normal (label claim 'research-normal')", ()),
                     id="claim-of-exactly-that-tier"),
        pytest.param(raw_pod(labels={TIER: "critical"}), "r", {"team": "research"}, RULES,
                     (Tier.SCAVENGER, False, "rule 'research'", (
                         f"label {TIER}=critical refused: namespace r may not claim it (tiers.label_claims); "
                         "tier scavenger (rule 'research')",)), id="claim-of-a-lower-tier-refuses-higher"),
        pytest.param(raw_pod(labels={TIER: "normal"}, owners=("Job",)), "lab", {"env": "prod"}, RULES,
                     (Tier.NORMAL, False, f"label {TIER}=normal (label claim 'lab-critical')", ()),
                     id="claim-of-a-higher-tier-allows-lower"),
        pytest.param(raw_pod(labels={TIER: "critical"}), "lab", {"env": "dev"}, RULES,
                     (Tier.NORMAL, False, "default tier", (
                         f"label {TIER}=critical refused: namespace lab may not claim it (tiers.label_claims); "
                         "tier normal (default tier)",)), id="claim-needs-its-namespace-labels-too"),
        pytest.param(raw_pod(labels={TIER: "critical"}), "lab2", {"env": "prod"}, RULES,
                     (Tier.NORMAL, False, "default tier", (
                         f"label {TIER}=critical refused: namespace lab2 may not claim it (tiers.label_claims); "
                         "tier normal (default tier)",)), id="claim-needs-its-namespace-too"),
        # preemptionPolicy Never
        pytest.param(raw_pod(preemptionPolicy="Never"), "serving", {}, RULES,
                     (None, True, "rule 'serving-ns'; tier critical not applied: the pod's preemptionPolicy Never is "
                      "kept (class gpu-steward-critical preempts)", ()), id="never-kept-against-a-preempting-tier"),
        pytest.param(raw_pod(preemptionPolicy="Never", priorityClassName="gpu-steward-normal"), "serving", {},
                     RULES.model_copy(update={"override_explicit_class": True}),
                     (Tier.NORMAL, True, "rule 'serving-ns'; tier critical not applied: the pod's preemptionPolicy "
                      "Never is kept (class gpu-steward-critical preempts)", ()),
                     id="never-kept-says-the-tier-of-the-class-it-keeps"),
        pytest.param(raw_pod(preemptionPolicy="Never", labels={TIER: "critical"}), "default", {}, RULES,
                     (None, True, "default tier; tier normal not applied: the pod's preemptionPolicy Never is kept "
                      "(class gpu-steward-normal preempts)", (
                          f"label {TIER}=critical refused: namespace default may not claim it (tiers.label_claims); "
                          "tier normal (default tier)",)), id="never-kept-keeps-the-refusal-warning"),
        pytest.param(raw_pod(preemptionPolicy="Never", owners=("Job",)), "default", {}, RULES,
                     (Tier.SCAVENGER, False, "rule 'jobs'", ()), id="never-with-a-never-tier-applies"),
        pytest.param(raw_pod(preemptionPolicy="PreemptLowerPriority"), "serving", {}, RULES,
                     (Tier.CRITICAL, False, "rule 'serving-ns'", ()), id="boundary-preempting-pod-takes-the-tier"),
    ],
)
def test_tier_rules(the_pod: dict[str, Any], namespace: str, namespace_labels: dict[str, str],
                    tiers: settings.Tiers, expected: tuple[Any, ...]) -> None:
    decision = tier_rules.decide(pod=the_pod, namespace=namespace, namespace_labels=namespace_labels,
                                   priority_classes=CLASSES, tiers=tiers, names=settings.Names())
    assert (decision.tier, decision.keep_user_class, decision.reason, decision.warnings) == expected
