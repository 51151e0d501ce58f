"""Admission through the real kube-apiserver: our webhook process, registered with a
MutatingWebhookConfiguration, shapes GPU pods on CREATE — and the API server's own admission
(the Priority plugin, scheduling-gate and affinity validation) accepts what it wrote.

Every pod is created with `kubectl create` and read back as stored: what the API server kept is
what counts, not what the webhook answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings
from gpu_steward import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT = "kueue.x-k8s.io/pod-group-total-count"  # an annotation, as Kueue writes it


def create_and_read(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """Create through the API server (failing the test with its message if refused); return it as stored."""
    done = cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(pod), check=False)
    assert done.returncode == 0, f"the API server refused the pod: {done.stderr}"
    meta = pod["metadata"]
    stored: dict[str, Any] = cluster.kubectl_json("get", "pod", meta["name"], "-n", meta["namespace"])
    return stored


def decision(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(NAMES.decision)


def node_affinity(pod: dict[str, Any]) -> dict[str, Any]:
    return ((pod["spec"].get("affinity") or {}).get("nodeAffinity")) or {}


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    required = node_affinity(pod).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


@pytest.mark.parametrize(
    ("gpus", "labels", "tier"),
    [
        pytest.param(2, {}, settings.Tier.NORMAL, id="default-tier-normal"),
        pytest.param(4, {NAMES.tier: "scavenger"}, settings.Tier.SCAVENGER, id="label-scavenger-never-preempts"),
    ],
)
def test_gpu_pod_comes_back_tiered_with_nvlink_affinity_and_a_decision_record(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    gpus: int,
    labels: dict[str, str],
    tier: settings.Tier,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)  # preferred terms name nodes with room: earlier tests' pods must be gone
    wanted = webhook.settings.tiers.for_tier(tier)

    stored = create_and_read(cluster, kube.pod("gpu", namespace=namespace, gpus=gpus, labels=labels))

    # Tier: all three fields set and consistent with the class the API server holds (the Priority
    # plugin would have refused the pod otherwise; it also fills `priority` in when the class is new to it).
    held = cluster.kubectl_json("get", "priorityclass", wanted.name)
    spec = stored["spec"]
    assert (spec.get("priorityClassName"), spec.get("priority"), spec.get("preemptionPolicy")) == (
        wanted.name,
        held["value"],
        held.get("preemptionPolicy", "PreemptLowerPriority"),
    )
    assert (held["value"], held.get("preemptionPolicy", "PreemptLowerPriority")) == (
        wanted.value,
        wanted.preemption_policy,
    )
    # NVLink affinity: every required term admits only nodes whose domains hold all the pod's GPUs...
    domain_size = kube.requirement(NAMES.nvlink_domain_size, "Gt", str(gpus - 1))
    terms = required_terms(stored)
    assert terms and all(domain_size in t.get("matchExpressions", []) for t in terms), terms
    # ... and the preferred terms name real nodes that pass it, best first, weights in 1..100.
    preferred = kube.preferred_nodes(stored)
    sizes = {n["metadata"]["name"]: int(n["metadata"]["labels"][NAMES.nvlink_domain_size]) for n in gpu_cluster.nodes}
    assert preferred, node_affinity(stored)
    weights = [w for w, _ in preferred]
    assert weights == sorted(weights, reverse=True) and all(1 <= w <= 100 for w in weights), preferred
    assert all(sizes[node] >= gpus for _, nodes in preferred for node in nodes), (preferred, sizes)
    # The decision record says what was done and why.
    record = decision(stored) or ""
    assert f"tier {tier.value}" in record, record
    assert f"class {wanted.name} (priority {wanted.value}, {wanted.preemption_policy})" in record, record
    assert f"{NAMES.nvlink_domain_size} >= {gpus}" in record, record
    assert f"gate {NAMES.gate} not added" in record, record
    assert not spec.get("schedulingGates")


@pytest.fixture
def kube_system_pod(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    """A name for a pod in kube-system, deleted after the test."""
    name = "e2e-excluded-gpu-pod"
    yield name
    control_plane.kubectl("delete", "pod", name, "-n", "kube-system", "--ignore-not-found", "--wait=true", check=False)


@pytest.mark.parametrize(
    ("where", "gpus"),
    [
        pytest.param("test-namespace", 0, id="non-gpu-pod"),
        pytest.param("kube-system", 2, id="gpu-pod-in-excluded-namespace"),
    ],
)
def test_pods_the_webhook_must_not_touch_come_back_as_sent(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    kube_system_pod: str,
    where: str,
    gpus: int,
) -> None:
    assert "kube-system" in webhook.settings.admission.excluded_namespaces
    ns, name = (namespace, "plain") if where == "test-namespace" else ("kube-system", kube_system_pod)
    labels = {NAMES.tier: "critical"}  # a tier means nothing to a pod without GPUs
    if where == "kube-system":  # nothing at all happens in an excluded namespace, not even gang gating
        labels |= {NAMES.gang_name: "g", NAMES.gang_size: "2"}

    stored = create_and_read(gpu_cluster.cluster, kube.pod(name, namespace=ns, gpus=gpus, labels=labels))

    spec = stored["spec"]
    untouched = {
        "decision": decision(stored),
        "priorityClassName": spec.get("priorityClassName"),
        "priority": spec.get("priority"),
        "affinity": spec.get("affinity"),
        "schedulingGates": spec.get("schedulingGates"),
    }
    # Priority 0 is the API server's default for a pod without a class, not ours.
    assert untouched == {
        "decision": None,
        "priorityClassName": None,
        "priority": 0,
        "affinity": None,
        "schedulingGates": None,
    }


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        pytest.param({NAMES.gang_name: "train", NAMES.gang_size: "4"}, {}, id="gpu-steward-labels"),
        pytest.param({KUEUE_GROUP: "train"}, {KUEUE_COUNT: "4"}, id="kueue-pod-group"),
    ],
)
def test_gang_member_is_created_gated(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> None:
    cluster = gpu_cluster.cluster
    pod = kube.pod("worker-0", namespace=namespace, gpus=2, labels=labels, annotations=annotations)

    stored = create_and_read(cluster, pod)

    assert kube.gates(stored) == [NAMES.gate]
    assert f"gate {NAMES.gate} added" in (decision(stored) or ""), decision(stored)
    # No gang release runs in this test: the scheduler holds the pod back.
    held = kube.poll(
        "worker-0 reported SchedulingGated",
        lambda: kube.scheduled_reason(kube.pods(cluster, namespace)["worker-0"]) == "SchedulingGated",
    )
    assert held
    assert not kube.pods(cluster, namespace)["worker-0"]["spec"].get("nodeName")


def test_with_the_webhook_down_pods_are_still_created_unchanged(
    gpu_cluster: conftest.GpuCluster, webhook_stopped: conftest.WebhookServer, namespace: str
) -> None:
    assert not webhook_stopped.process.running()
    labels = {NAMES.tier: "critical", NAMES.gang_name: "train", NAMES.gang_size: "2"}

    stored = create_and_read(gpu_cluster.cluster, kube.pod("unshaped", namespace=namespace, gpus=2, labels=labels))

    # failurePolicy Ignore: the API server admitted the pod as sent (no tier, no affinity, no gate).
    assert (decision(stored), stored["spec"].get("priorityClassName"), stored["spec"].get("affinity"),
            kube.gates(stored)) == (None, None, None, [])
