"""The admission engine end to end on plain dicts: apply the patch, compare whole pods."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest

from admission import gating, mutation
from common import settings, snapshot, snapshot_build
from tests import builders

CONFIG = settings.Settings()
ONE_GPU_GOVERNED = settings.Settings(admission=settings.Admission(release_min_gpus=1))  # default 2
NOW = 1_000.0
DECISION = "gpu-steward.io/decision"


def make_cluster(*, taken_at: float | None = NOW, classes: list[dict] | None = None) -> snapshot.Snapshot:
    return snapshot_build.build(
        nodes=[
            builders.gpu_node("dgx-1", gpus=8, domains=[range(4), range(4, 8)]),
            builders.gpu_node("pair-1", gpus=2),
        ],
        pods=[builders.pod("old", gpus=1, node="pair-1", phase="Running")],
        priority_classes=builders.tier_classes() if classes is None else classes,
        namespaces=[builders.namespace("ml", {"team": "research"}), builders.namespace("default")],
        names=CONFIG.names,
        taken_at=taken_at,
    )


CLUSTER = make_cluster()


ALIVE = NOW - 1  # the descheduler's Lease seen renewed a second ago
GATE = "gpu-steward.io/gang"


def admit(pod: dict, *, operation: str = "CREATE", cluster: snapshot.Snapshot = CLUSTER,
          config: settings.Settings = CONFIG, controller: float | None = None,
          ) -> tuple[mutation.Outcome, dict[str, Any]]:
    """`controller`: when the descheduler's Lease was seen renewed (default: not seen, nothing gated for release)."""
    original = copy.deepcopy(pod)
    outcome = mutation.decide(operation=operation, namespace=pod["metadata"].get("namespace"), pod=pod,
                              cluster=cluster, config=config, now=NOW, controller_seen_at=controller)
    assert pod == original, "decide() must not mutate its input"
    return outcome, jsonpatch.apply_patch(pod, outcome.patch)


def prefer(node: str, weight: int) -> dict:
    return {"weight": weight,
            "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}}


def test_gpu_pod_is_gated_for_release_while_the_controller_lives_as_a_whole():
    pod = builders.pod("train", namespace="default", gpus=1)
    outcome, result = admit(pod, controller=ALIVE, config=ONE_GPU_GOVERNED)

    expected = copy.deepcopy(pod)
    expected["spec"].update(priorityClassName="gpu-steward-normal", priority=10_000,
                            preemptionPolicy="PreemptLowerPriority", schedulingGates=[{"name": GATE}])
    expected["metadata"]["annotations"] = {DECISION: outcome.record}
    assert result == expected  # no affinity at all: the release controller pins it
    assert outcome.changes == ("tier", "gate", "decision")
    assert (outcome.tier, outcome.gated, outcome.release, outcome.warnings) == (
        "normal", True, gating.Release.GATED, ())
    assert outcome.record == (
        "1 GPU; tier normal: default tier; class gpu-steward-normal (priority 10000, PreemptLowerPriority); "
        "placement strict: at release, no preferred terms; gate gpu-steward.io/gang added: placed at release "
        "(Lease gpu-steward/gpu-steward-descheduler renewed 1s ago)")


def test_gpu_pod_gets_preferred_terms_only_when_the_controller_is_down_as_a_whole():
    pod = builders.pod("train", namespace="default", gpus=1)
    outcome, result = admit(pod, config=ONE_GPU_GOVERNED)

    expected = copy.deepcopy(pod)
    expected["spec"].update(
        priorityClassName="gpu-steward-normal",
        priority=10_000,
        preemptionPolicy="PreemptLowerPriority",
        affinity={"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [prefer("pair-1", 95), prefer("dgx-1", 40)],
        }},
    )
    expected["metadata"]["annotations"] = {DECISION: outcome.record}
    assert result == expected
    assert outcome.changes == ("tier", "affinity-preferred", "decision")
    assert (outcome.tier, outcome.gated, outcome.release, outcome.warnings) == (
        "normal", False, gating.Release.CONTROLLER_DOWN, ())
    assert "tier normal: default tier" in outcome.record
    assert "pair-1=250->95" in outcome.record
    assert ("gate gpu-steward.io/gang not added: not placed at release: controller down "
            "(Lease gpu-steward/gpu-steward-descheduler not seen held and renewed)") in outcome.record


def test_admitting_the_mutated_pod_again_changes_nothing():
    _, once = admit(builders.pod("train", gpus=4, labels={"gpu-steward.io/gang-name": "g",
                                                          "gpu-steward.io/gang-size": "2"}))
    outcome, twice = admit(once)
    assert outcome.patch == [] and twice == once
    assert outcome.skipped == "already mutated (decision record present)"


@pytest.mark.parametrize(
    ("pod", "operation", "reason"),
    [
        pytest.param(builders.pod("p", gpus=1), "UPDATE", "operation UPDATE is never mutated", id="update"),
        pytest.param(builders.pod("p", gpus=1), "DELETE", "operation DELETE is never mutated", id="delete"),
        pytest.param(builders.pod("p"), "CREATE", "requests no GPU", id="no-gpu"),
        pytest.param(builders.pod("p", gpus=1, namespace="kube-system"), "CREATE",
                     "namespace kube-system is excluded", id="excluded-namespace"),
        pytest.param(builders.pod("p", gpus=1, annotations={"kubernetes.io/config.mirror": "abc"}), "CREATE",
                     "mirror pod", id="mirror-pod"),
        pytest.param(builders.pod("p", gpus=1, labels={"gpu-steward.io/skip": "true"}), "CREATE",
                     "opted out with gpu-steward.io/skip", id="skip-label"),
        pytest.param(builders.pod("p", gpus=1, annotations={"gpu-steward.io/skip": "yes"}), "CREATE",
                     "opted out with gpu-steward.io/skip", id="skip-annotation"),
    ],
)
def test_left_alone(pod, operation, reason):
    outcome, result = admit(pod, operation=operation)
    assert (outcome.patch, outcome.skipped) == ([], reason)
    assert result == pod


@pytest.mark.parametrize("value", ["false", "0", "off", "No"])
def test_skip_set_to_false_is_no_opt_out(value):
    outcome, _ = admit(builders.pod("p", gpus=1, labels={"gpu-steward.io/skip": value}))
    assert outcome.skipped is None and "decision" in outcome.changes


def test_unreadable_gpu_quantity_is_left_alone_with_a_warning():
    pod = builders.pod("p", mutate=lambda p: p["spec"]["containers"][0].update(
        resources={"limits": {"nvidia.com/gpu": "500m"}}))
    outcome, result = admit(pod)
    assert result == pod
    assert outcome.skipped.startswith("unreadable GPU request")
    assert outcome.warnings == ("gpu-steward: nvidia.com/gpu: '500m' is not a whole number of devices; pod unchanged",)


def test_object_that_is_not_a_pod_is_left_alone():
    for pod in ({"metadata": {}}, {"spec": {}}, {"metadata": [], "spec": {}}, {"metadata": "x", "spec": {}}):
        outcome = mutation.decide(operation="CREATE", namespace="x", pod=pod, cluster=CLUSTER, config=CONFIG,
                                  now=NOW)
        assert outcome.patch == [] and outcome.skipped == "request object is not a pod with metadata and a spec"


@pytest.mark.parametrize(
    ("pod", "config", "tier", "class_name", "reason", "warning"),
    [
        pytest.param(builders.pod("p", gpus=1, labels={"gpu-steward.io/tier": "scavenger"}), CONFIG,
                     "scavenger", "gpu-steward-scavenger",
                     "label gpu-steward.io/tier=scavenger (not above the operator's tier)", None, id="label-lowers"),
        pytest.param(builders.pod("p", gpus=1, labels={"gpu-steward.io/tier": "gold"}), CONFIG,
                     "normal", "gpu-steward-normal", "default tier",
                     "gpu-steward: label gpu-steward.io/tier='gold' is not one of critical, normal, scavenger; "
                     "using normal", id="unknown-label-value"),
        pytest.param(builders.pod("p", gpus=1, namespace="ml"),
                     settings.Settings(tiers=settings.Tiers(rules=[settings.TierRule(
                         name="research-batch", tier=settings.Tier.SCAVENGER,
                         namespace_labels={"team": "research"})])),
                     "scavenger", "gpu-steward-scavenger", "rule 'research-batch'", None, id="namespace-rule"),
        pytest.param(builders.pod("p", gpus=1, mutate=lambda p: p["metadata"].update(
                         ownerReferences=[{"kind": "Job", "name": "j", "controller": True}])),
                     settings.Settings(tiers=settings.Tiers(rules=[settings.TierRule(
                         name="jobs", tier=settings.Tier.SCAVENGER, owner_kinds=["Job"])])),
                     "scavenger", "gpu-steward-scavenger", "rule 'jobs'", None, id="owner-kind-rule"),
    ],
)
def test_tier_choice(pod, config, tier, class_name, reason, warning):
    outcome, result = admit(pod, config=config)
    assert outcome.tier == tier
    assert result["spec"]["priorityClassName"] == class_name
    assert f"tier {tier}: {reason}" in outcome.record
    assert outcome.warnings == ((warning,) if warning else ())


def test_priority_and_policy_come_from_the_cluster_class():
    _, result = admit(builders.pod("p", gpus=1, labels={"gpu-steward.io/tier": "scavenger"}))
    assert (result["spec"]["priority"], result["spec"]["preemptionPolicy"]) == (100, "Never")


def test_users_priority_class_is_kept():
    pod = builders.pod("p", gpus=1, mutate=lambda p: p["spec"].update(priorityClassName="team-a-high"))
    outcome, result = admit(pod)
    assert result["spec"]["priorityClassName"] == "team-a-high" and "priority" not in result["spec"]
    assert "tier none: kept the pod's priorityClassName team-a-high" in outcome.record
    assert "tier" not in outcome.changes


def test_missing_priority_class_leaves_priority_alone_with_a_warning():
    outcome, result = admit(builders.pod("p", gpus=1), cluster=make_cluster(classes=[]))
    assert "priorityClassName" not in result["spec"]
    assert outcome.warnings == (
        "gpu-steward: PriorityClass gpu-steward-normal for tier normal does not exist; priority left unchanged",)
    assert "affinity-preferred" in outcome.changes


def test_user_affinity_is_kept_and_our_preferences_come_after_the_users():
    user_terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                  {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["dgx-1"]}]}]
    user_pref = {"weight": 7, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}

    def with_affinity(p: dict) -> None:
        p["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": copy.deepcopy(user_terms)},
            "preferredDuringSchedulingIgnoredDuringExecution": [copy.deepcopy(user_pref)]}}

    _, result = admit(builders.pod("p", gpus=4, mutate=with_affinity))
    node_affinity = result["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": user_terms}
    preferred = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [user_pref, prefer("dgx-1", 64)]


@pytest.mark.parametrize("required", [{}, {"nodeSelectorTerms": []}, {"nodeSelectorTerms": [{}]}])
def test_a_required_affinity_without_terms_stays_as_the_user_wrote_it(required):
    """It matches no node (the API server refuses most of these): no node can take it, so no preferred term."""
    def with_affinity(p: dict) -> None:
        p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}

    outcome, result = admit(builders.pod("p", gpus=4, mutate=with_affinity))
    assert result["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    assert "affinity-preferred" not in outcome.changes


PRODUCT = "nvidia.com/gpu.product"
NEEDS_H100 = {"key": PRODUCT, "operator": "In", "values": ["H100"]}


def product_cluster() -> snapshot.Snapshot:
    """A100 nodes half used (the best score for a 1-GPU pod), empty H100 nodes, and an H100 node without
    our NVLink labels."""
    nodes = [builders.gpu_node(name, gpus=2, labels={PRODUCT: product})
             for name, product in (("a100-1", "A100"), ("a100-2", "A100"), ("h100-1", "H100"), ("h100-2", "H100"))]
    nodes.append(builders.gpu_node("h100-unlabelled", gpus=2, labels={PRODUCT: "H100"}, topology="none"))
    return snapshot_build.build(
        nodes=nodes,
        pods=[builders.pod(f"busy-{n}", gpus=1, node=n, phase="Running") for n in ("a100-1", "a100-2")],
        priority_classes=builders.tier_classes(), namespaces=[builders.namespace("default")],
        names=CONFIG.names, taken_at=NOW,
    )


def requiring(*expressions: dict) -> Callable[[dict], None]:
    def mutate(pod: dict) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}
    return mutate


@pytest.mark.parametrize("placement", ["strict", "prefer"])
def test_preferred_terms_go_only_to_nodes_the_required_affinity_admits(placement):
    """Nodes without our NVLink labels stay candidates (topology unknown: no domain terms)."""
    required_terms = [{"matchExpressions": [NEEDS_H100]}]
    preferred = [prefer("h100-1", 77), prefer("h100-2", 77), prefer("h100-unlabelled", 64)]
    cluster = product_cluster()
    mode = {"gpu-steward.io/placement": placement}
    _, anywhere = admit(builders.pod("anywhere", gpus=1, labels=mode), cluster=cluster)
    assert anywhere["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][:2] == [
        prefer("a100-1", 95), prefer("a100-2", 95)]

    outcome, result = admit(builders.pod("h100", gpus=1, labels=mode, mutate=requiring(NEEDS_H100)), cluster=cluster)
    node_affinity = result["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": required_terms},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred,
    }
    assert "preferred h100-1=180->77, h100-2=180->77" in outcome.record


def test_a_required_affinity_no_node_meets_gets_no_preferred_terms():
    outcome, result = admit(builders.pod("p", gpus=1, mutate=requiring({**NEEDS_H100, "values": ["B200"]})),
                            cluster=product_cluster())
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in result["spec"]["affinity"]["nodeAffinity"]
    assert "affinity-preferred" not in outcome.changes
    assert ("no node can take 1 GPUs now (5 with room ruled out, e.g. a100-1: required node affinity does not "
            "match (term 1: nvidia.com/gpu.product In [B200]))") in outcome.record


@pytest.mark.parametrize(
    ("labels", "changes", "warning"),
    [
        pytest.param({"gpu-steward.io/placement": "prefer"}, ("tier", "affinity-preferred", "decision"), None,
                     id="prefer"),
        pytest.param({"gpu-steward.io/placement": "off"}, ("tier", "decision"), None, id="off"),
        pytest.param({"gpu-steward.io/placement": "sometimes"},
                     ("tier", "affinity-preferred", "decision"),
                     "gpu-steward: gpu-steward.io/placement='sometimes' is not one of strict, prefer, off; "
                     "using strict",
                     id="invalid-falls-back-to-default"),
    ],
)
def test_placement_modes(labels, changes, warning):
    outcome, _ = admit(builders.pod("p", gpus=2, labels=labels))
    assert outcome.changes == changes
    assert outcome.warnings == ((warning,) if warning else ())


@pytest.mark.parametrize("taken_at", [pytest.param(None, id="never-synced"), pytest.param(NOW - 500, id="stale")])
def test_stale_snapshot_adds_no_affinity_but_still_tiers_and_gates(taken_at):
    pod = builders.pod("p", gpus=2, labels={"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "2"})
    outcome, result = admit(pod, cluster=make_cluster(taken_at=taken_at))
    assert "affinity" not in result["spec"]
    # Never synced: which PodGroup API is served is not known either, so no PodGroup is named.
    assert outcome.changes == ("tier", "gate", "decision") if taken_at is None else (
        "tier", "gate", "pod-group", "decision")
    assert outcome.warnings[0].endswith("NVLink affinity not added")


def test_mig_only_pod_gets_no_nvlink_affinity():
    outcome, result = admit(builders.pod("p", mig={"3g.40gb": 1}))
    assert "affinity" not in result["spec"]
    assert "MIG slices only" in outcome.record


@pytest.mark.parametrize(
    ("labels", "annotations", "spec", "gated", "reason", "warning"),
    [
        pytest.param({"gpu-steward.io/gang-name": "train", "gpu-steward.io/gang-size": "4"}, {}, {}, True,
                     "gang default/train of 4 (gpu-steward)", None, id="ours"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "grp"}, {"kueue.x-k8s.io/pod-group-total-count": "3"},
                     {}, True, "gang default/grp of 3 (kueue)", None, id="kueue"),
        pytest.param({"gpu-steward.io/gang-name": "train", "gpu-steward.io/gang-size": "four"}, {}, {}, False,
                     "gang default/train not gated",
                     "gpu-steward: gang default/train: gpu-steward.io/gang-size='four' is not a positive integer",
                     id="bad-size"),
        pytest.param({"gpu-steward.io/gang-name": "train", "gpu-steward.io/gang-size": "4"}, {},
                     {"schedulerName": "volcano"}, False,
                     "gang default/train: scheduler volcano places the gang", None, id="other-scheduler"),
        pytest.param({"scheduling.x-k8s.io/pod-group": "pg"}, {}, {}, False,
                     "gang default/pg: size unknown (scheduler-plugins); not gated",
                     "gpu-steward: gang default/pg: no size known at admission, not gated", id="size-unknown"),
        pytest.param({}, {}, {}, True, "placed at release", None, id="no-gang-gated-for-release"),
    ],
)
def test_gang_gate(labels, annotations, spec, gated, reason, warning):
    pod = builders.pod("w-0", gpus=2, labels=labels, annotations=annotations,
                       mutate=lambda p: p["spec"].update(spec))
    outcome, result = admit(pod, controller=ALIVE)
    gates = [g["name"] for g in result["spec"].get("schedulingGates", [])]
    assert (outcome.gated, gates) == (gated, ["gpu-steward.io/gang"] if gated else [])
    assert reason in outcome.record
    assert outcome.warnings == ((warning,) if warning else ())


def stale_after(seconds: float) -> settings.Settings:
    return settings.Settings(admission=settings.Admission(controller_stale_seconds=seconds))


GANG_OF_4 = {"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "4"}
PLACE = "gpu-steward.io/placement"
KUEUE_GATE = "kueue.x-k8s.io/admission"


def with_spec(**fields: Any) -> Callable[[dict], None]:
    return lambda p: p["spec"].update(copy.deepcopy(fields))


@pytest.mark.parametrize(
    ("pod", "config", "controller", "gated", "release", "reason"),
    [
        # which pods are governed (placed at release)
        pytest.param(builders.pod("p", gpus=2), CONFIG, ALIVE, True, gating.Release.GATED,
                     "placed at release (Lease gpu-steward/gpu-steward-descheduler renewed 1s ago)",
                     id="strict-2-gpus"),
        pytest.param(builders.pod("p", gpus=2, labels={PLACE: "prefer"}), CONFIG, ALIVE, False, None,
                     "placement prefer: never gated", id="prefer-never-gated"),
        pytest.param(builders.pod("p", gpus=2, annotations={PLACE: "off"}), CONFIG, ALIVE, False, None,
                     "placement off: never gated", id="off-never-gated"),
        pytest.param(builders.pod("p", gpus=2),
                     settings.Settings(admission=settings.Admission(default_placement=settings.Placement.PREFER)),
                     ALIVE, False, None, "placement prefer: never gated", id="default-placement-prefer"),
        pytest.param(builders.pod("p", mig={"3g.40gb": 1}), CONFIG, ALIVE, False, None,
                     "no whole GPUs: not placed at release", id="mig-only-not-governed"),
        pytest.param(builders.pod("p", gpus=1), CONFIG, ALIVE, False, None,
                     "1 GPUs, under admission.release_min_gpus=2: not placed at release",
                     id="one-gpu-under-the-default-release-min-gpus"),
        pytest.param(builders.pod("p", gpus=1), settings.Settings(admission=settings.Admission(release_min_gpus=1)),
                     ALIVE, True, gating.Release.GATED, "placed at release", id="one-gpu-governed-when-set"),
        pytest.param(builders.pod("p", gpus=2), settings.Settings(admission=settings.Admission(release_min_gpus=2)),
                     ALIVE, True, gating.Release.GATED, "placed at release", id="at-release-min-gpus"),
        pytest.param(builders.pod("p", gpus=8), settings.Settings(admission=settings.Admission(release_enabled=False)),
                     ALIVE, False, None, "placement at release is off (admission.release_enabled)",
                     id="release-off"),
        pytest.param(builders.pod("p", gpus=8), settings.Settings(descheduler=settings.Descheduler(
                         gangs=settings.Gangs(enabled=False))),
                     ALIVE, False, None, "placement at release is off (descheduler.gangs.enabled)",
                     id="release-loop-off"),
        pytest.param(builders.pod("p", gpus=2, mutate=with_spec(volumes=[
                         {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}])), CONFIG, ALIVE, False,
                     None, "volume data is persistentVolumeClaim (volume filters not modelled): placed by "
                     "kube-scheduler, not at release", id="claim-left-to-kube-scheduler"),
        pytest.param(builders.pod("p", gpus=2, mutate=with_spec(volumes=[{"name": "cfg", "configMap": {"name": "c"}}])),
                     CONFIG, ALIVE, True, gating.Release.GATED, "placed at release", id="config-map-still-governed"),
        pytest.param(builders.pod("p", gpus=2, mutate=lambda p: p["spec"]["containers"][0].update(
                         ports=[{"containerPort": 80, "hostPort": 8080}])), CONFIG, ALIVE, True, gating.Release.GATED,
                     "placed at release", id="host-port-is-modelled-so-governed"),
        pytest.param(builders.pod("p", gpus=2, mutate=with_spec(schedulerName="volcano")), CONFIG, ALIVE, False,
                     None, "scheduler volcano places it: not placed at release", id="another-scheduler"),
        pytest.param(builders.pod("p", gpus=2, mutate=lambda p: p["metadata"].update(
                         ownerReferences=[{"kind": "DaemonSet", "name": "ds", "controller": True}])),
                     CONFIG, ALIVE, False, None, "a DaemonSet pod, bound to its node by its controller",
                     id="daemonset"),
        pytest.param(builders.pod("p", gpus=2, mutate=with_spec(schedulingGates=[{"name": KUEUE_GATE}])),
                     CONFIG, ALIVE, False, None, "held by kueue.x-k8s.io/admission: another controller decides when "
                     "it starts; not placed at release", id="another-controllers-gate"),
        pytest.param(builders.pod("p", gpus=2, labels={"gpu-steward.io/gang-name": "solo",
                                                       "gpu-steward.io/gang-size": "1"}),
                     CONFIG, ALIVE, True, gating.Release.GATED, "gang default/solo of 1: placed at release",
                     id="gang-of-one-is-a-single-pod"),
        pytest.param(builders.pod("p", gpus=2, labels=GANG_OF_4), CONFIG, None, True, None,
                     "gang default/g of 4 (gpu-steward)", id="gang-member-keeps-its-gang-gate"),
        # spec.nodeName: the API server refuses gates on it, and it is never scheduled
        pytest.param(builders.pod("p", gpus=2, mutate=with_spec(nodeName="dgx-1")), CONFIG, ALIVE, False, None,
                     "spec.nodeName dgx-1: bound at creation, never gated", id="node-name"),
        pytest.param(builders.pod("p", gpus=2, labels=GANG_OF_4, mutate=with_spec(nodeName="dgx-1")), CONFIG, ALIVE,
                     False, None, "spec.nodeName dgx-1: bound at creation, never gated", id="gang-member-node-name"),
        # controller liveness: seen renewed within admission.controller_stale_seconds, on our clock
        pytest.param(builders.pod("p", gpus=2), CONFIG, None, False, gating.Release.CONTROLLER_DOWN,
                     "controller down (Lease gpu-steward/gpu-steward-descheduler not seen held and renewed)",
                     id="controller-never-seen"),
        pytest.param(builders.pod("p", gpus=2), CONFIG, NOW - 30, True, gating.Release.GATED,
                     "placed at release (Lease gpu-steward/gpu-steward-descheduler renewed 30s ago)",
                     id="controller-seen-at-the-limit"),
        pytest.param(builders.pod("p", gpus=2), CONFIG, NOW - 30.5, False, gating.Release.CONTROLLER_DOWN,
                     "controller down (Lease gpu-steward/gpu-steward-descheduler last seen renewed 30s ago "
                     "(over 30s))", id="controller-stale"),
        pytest.param(builders.pod("p", gpus=2), stale_after(120), NOW - 100, True, gating.Release.GATED,
                     "renewed 100s ago", id="stale-after-is-a-setting"),
    ],
)
def test_governed_pods_are_gated_for_release_only_while_the_controller_lives(
        pod, config, controller, gated, release, reason):
    outcome, result = admit(pod, config=config, controller=controller)
    ours = [g for g in result["spec"].get("schedulingGates", []) if g["name"] == GATE]
    assert (outcome.gated, len(ours), outcome.release) == (gated, int(gated), release)
    assert reason in outcome.record
    if outcome.release is gating.Release.GATED:
        assert "affinity" not in result["spec"]  # the release controller pins it
    required = (pod["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    assert (result["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") == required


def test_a_gang_is_gated_even_while_the_controller_is_down_with_a_warning():
    """Ungated, its members would start one by one and hold GPUs while they wait for each other."""
    outcome, result = admit(builders.pod("w-0", gpus=1, labels=GANG_OF_4), controller=NOW - 100)
    assert result["spec"]["schedulingGates"] == [{"name": GATE}]
    assert outcome.warnings == (
        "gpu-steward: gang default/g gated, but the descheduler that releases it is not seen running (Lease "
        "gpu-steward/gpu-steward-descheduler last seen renewed 100s ago (over 30s))",)
    assert outcome.release is None


def test_a_pod_with_node_name_gets_no_affinity_and_no_gate():
    pod = builders.pod("p", gpus=2, labels=GANG_OF_4, mutate=with_spec(nodeName="pair-1"))
    outcome, result = admit(pod, controller=ALIVE)
    assert "affinity" not in result["spec"] and "schedulingGates" not in result["spec"]
    assert outcome.changes == ("tier", "decision")
    assert "placement: none, the pod names its node (pair-1)" in outcome.record


def test_admitting_a_pod_gated_for_release_again_changes_nothing():
    _, once = admit(builders.pod("train", gpus=2), controller=ALIVE)
    outcome, twice = admit(once, controller=ALIVE)
    assert once["spec"]["schedulingGates"] == [{"name": GATE}]
    assert outcome.patch == [] and twice == once


def test_another_controllers_gate_is_kept():
    pod = builders.pod("w", gpus=1, labels={"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "2"},
                       mutate=lambda p: p["spec"].update(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]))
    _, result = admit(pod)
    assert result["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"},
                                                 {"name": "gpu-steward.io/gang"}]


def test_patch_adds_one_annotation_key_with_escaped_pointer_and_keeps_the_map():
    pod = builders.pod("p", gpus=1, annotations={"a/b~c": "x"},
                       mutate=lambda p: p["metadata"].update(name=None, generateName="train-"))
    del pod["metadata"]["name"]
    outcome, result = admit(pod)
    ops = [op for op in outcome.patch if op["path"].startswith("/metadata")]
    assert ops == [{"op": "add", "path": "/metadata/annotations/gpu-steward.io~1decision", "value": outcome.record}]
    assert result["metadata"]["annotations"]["a/b~c"] == "x"
    assert result["metadata"]["generateName"] == "train-"


GANG_OF_5 = {"gpu-steward.io/gang-name": "j", "gpu-steward.io/gang-size": "5"}
LAUNCHER_NOTE = "no tier, no NVLink affinity: a gang member without GPUs only waits for its gang"


@pytest.mark.parametrize(
    ("labels", "annotations", "spec", "gated", "reason", "warning"),
    [
        pytest.param({}, {}, {}, False, "requests no GPU", None, id="plain-cpu-pod-untouched"),
        pytest.param({"app": "web", "gpu-steward.io/tier": "critical"}, {}, {}, False, "requests no GPU", None,
                     id="tier-label-alone-changes-nothing"),
        pytest.param(GANG_OF_5, {}, {}, True, f"no GPU; {LAUNCHER_NOTE}; gate gpu-steward.io/gang added: "
                     "gang default/j of 5 (gpu-steward)", None, id="launcher-of-our-gang-gated"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "j"}, {"kueue.x-k8s.io/pod-group-total-count": "5"}, {},
                     True, "gate gpu-steward.io/gang added: gang default/j of 5 (kueue)", None,
                     id="launcher-of-a-kueue-pod-group-gated"),
        pytest.param({**GANG_OF_5, "gpu-steward.io/tier": "critical"}, {}, {"priorityClassName": "team-a-high"},
                     True, f"no GPU; {LAUNCHER_NOTE}", None, id="launcher-gets-no-tier-and-keeps-its-class"),
        pytest.param({"gpu-steward.io/gang-name": "j", "gpu-steward.io/gang-size": "1"}, {}, {}, False,
                     "requests no GPU; gang default/j of 1: no whole GPUs: not placed at release", None,
                     id="gang-of-one-untouched"),
        pytest.param({"gpu-steward.io/gang-name": "j", "gpu-steward.io/gang-size": "five"}, {}, {}, False,
                     "requests no GPU; gang default/j not gated",
                     "gpu-steward: gang default/j: gpu-steward.io/gang-size='five' is not a positive integer",
                     id="bad-size-untouched-with-a-warning"),
        pytest.param(GANG_OF_5, {}, {"schedulerName": "volcano"}, False,
                     "requests no GPU; gang default/j: scheduler volcano places the gang", None,
                     id="gang-another-scheduler-holds-untouched"),
        pytest.param(GANG_OF_5, {}, {"schedulingGates": [{"name": "gpu-steward.io/gang"}]}, False,
                     "requests no GPU; gate gpu-steward.io/gang already present", None,
                     id="already-gated-untouched"),
    ],
)
def test_pod_without_gpus_changes_only_when_we_gate_it_for_its_gang(labels, annotations, spec, gated, reason, warning):
    """Without GPUs: no tier, no affinity; a gang member gets our gate and the record, nothing else."""
    pod = builders.pod("launcher", labels=labels, annotations=annotations, mutate=lambda p: p["spec"].update(spec))
    outcome, result = admit(pod, controller=ALIVE)

    expected = copy.deepcopy(pod)
    ours = gated and "gpu-steward.io/gang-name" in labels  # our gang: its own PodGroup, per PriorityClass
    if gated:
        expected["spec"]["schedulingGates"] = [{"name": "gpu-steward.io/gang"}]
        expected["metadata"]["annotations"] = {**annotations, DECISION: outcome.record}
    if ours:
        group = "gpu-steward-j" + (f"-{spec['priorityClassName']}" if spec.get("priorityClassName") else "")
        expected["spec"]["schedulingGroup"] = {"podGroupName": group}
    assert result == expected
    assert (outcome.gated, outcome.tier, outcome.skipped is None) == (gated, None, gated)
    assert outcome.changes == ((("gate", "pod-group", "decision") if ours else ("gate", "decision")) if gated else ())
    assert reason in outcome.record
    assert outcome.warnings == ((warning,) if warning else ())


def test_admitting_a_gated_launcher_again_changes_nothing():
    _, once = admit(builders.pod("launcher", labels=GANG_OF_5))
    outcome, twice = admit(once)
    assert outcome.patch == [] and twice == once
    assert outcome.skipped == "already mutated (decision record present)"


def _pod_groups_served(version: str | None) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=[builders.gpu_node("dgx-1", gpus=8, domains=[range(4), range(4, 8)])], pods=[],
                                priority_classes=builders.tier_classes(), namespaces=[builders.namespace("default")],
                                names=CONFIG.names, taken_at=NOW, pod_group_version=version)


OURS_OF_2 = {"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "2"}
OFF = settings.Settings.model_validate({"descheduler": {"gangs": {"native_binding": False}}})


@pytest.mark.parametrize(
    ("labels", "spec", "served", "config", "expected"),
    [
        pytest.param(OURS_OF_2, {}, "v1alpha2", CONFIG, None, id="v1alpha2-ignores-nominations-none"),
        pytest.param(OURS_OF_2, {}, None, CONFIG, None, id="no-pod-group-api-none"),
        pytest.param(OURS_OF_2, {}, "v1beta1", OFF, None, id="setting-off-none"),
        pytest.param(OURS_OF_2, {"schedulingGroup": {"podGroupName": "users"}}, "v1beta1", CONFIG, None,
                     id="pod-names-a-pod-group-already-none"),
        pytest.param({"gpu-steward.io/gang-name": "G_1", "gpu-steward.io/gang-size": "2"}, {}, "v1beta1", CONFIG,
                     None, id="gang-name-makes-no-pod-group-name-none"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "g"}, {}, "v1beta1", CONFIG, None, id="kueues-gang-none"),
        pytest.param({"gpu-steward.io/gang-name": "g", "gpu-steward.io/gang-size": "1"}, {}, "v1beta1", CONFIG,
                     None, id="gang-of-one-none"),
        pytest.param(OURS_OF_2, {"schedulerName": "volcano"}, "v1beta1", CONFIG, None, id="not-gated-none"),
        pytest.param(OURS_OF_2, {}, "v1beta1", CONFIG, "gpu-steward-g-gpu-steward-normal",
                     id="ours-named-with-its-tiers-class"),
    ],
)
def test_a_gang_member_we_gate_names_its_gangs_own_pod_group(labels, spec, served, config, expected):
    """Kubernetes 1.37 (scheduling.k8s.io/v1beta1) binds a gang PodGroup all-or-nothing on its members'
    nominations (tests/e2e/test_native_gang_binding_facts_e2e.py); release creates the PodGroup before un-gating."""
    pod = builders.pod("w", gpus=2, labels=labels, mutate=lambda p: p["spec"].update(spec))
    if labels.get("kueue.x-k8s.io/pod-group-name"):
        pod["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": "2"}
    outcome, result = admit(pod, cluster=_pod_groups_served(served), config=config, controller=ALIVE)
    assert (result["spec"].get("schedulingGroup") or {}).get("podGroupName") == (
        expected or spec.get("schedulingGroup", {}).get("podGroupName"))
    assert ("pod-group" in outcome.changes) == (expected is not None)
    if expected:
        assert f"PodGroup {expected}: made at release" in outcome.record
        again, _ = admit(result, cluster=_pod_groups_served(served), config=config, controller=ALIVE)
        assert again.patch == []  # idempotent
