"""Admission through the real kube-apiserver: our webhook process, registered with a
MutatingWebhookConfiguration, shapes GPU pods on CREATE — and the API server's own admission
(the Priority plugin, scheduling-gate and affinity validation) accepts what it wrote.

Every pod is created with `kubectl create` and read back as stored: what the API server kept is
what counts, not what the webhook answered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import settings
from descheduler import leader
from gpu_steward_lab import localcluster
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
def test_gpu_pod_comes_back_tiered_with_preferred_terms_and_a_decision_record(
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
    # No descheduler runs here (no Lease): never a gate, never a required term, only preferred terms naming
    # real nodes with room, best first, weights in 1..100.
    assert required_terms(stored) == [] and not spec.get("schedulingGates")
    preferred = kube.preferred_nodes(stored)
    assert preferred, node_affinity(stored)
    weights = [w for w, _ in preferred]
    assert weights == sorted(weights, reverse=True) and all(1 <= w <= 100 for w in weights), preferred
    capacity = {n["metadata"]["name"]: int(n["status"]["capacity"]["nvidia.com/gpu"]) for n in gpu_cluster.nodes}
    assert all(capacity[node] >= gpus for _, nodes in preferred for node in nodes), (preferred, capacity)
    # The decision record says what was done and why.
    record = decision(stored) or ""
    assert f"tier {tier.value}" in record, record
    assert f"class {wanted.name} (priority {wanted.value}, {wanted.preemption_policy})" in record, record
    assert f"gate {NAMES.gate} not added: not placed at release: controller down" in record, record


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


# --- placement at release: gated only while the controller's Lease is seen renewed ---------------------

WriteLease = Callable[[str], None]


def gated_for_release(cluster: localcluster.LocalCluster, namespace: str) -> bool:
    """Whether a plain 2-GPU pod (governed: admission.release_min_gpus is 2) would be created with our gate now
    (a server-side dry run)."""
    probe = kube.pod("release-probe", namespace=namespace, gpus=2)
    done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe))
    return NAMES.gate in kube.gates(json.loads(done.stdout))


@pytest.fixture
def controller_lease(
    control_plane: localcluster.LocalCluster, webhook: conftest.WebhookServer, namespace: str
) -> Iterator[WriteLease]:
    """`write(holder)`: the descheduler's leader Lease as `descheduler.leader.Elector` writes it, renewed now
    (holder "": released). Deleted after the test, once the webhook no longer gates."""
    election = webhook.settings.descheduler.leader_election
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": election.lease_namespace}}])

    def write(holder: str) -> None:
        control_plane.apply([{
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": election.lease_name, "namespace": election.lease_namespace},
            "spec": {"holderIdentity": holder, "renewTime": leader.micro_time(time.time()),
                     "leaseDurationSeconds": int(election.lease_duration_seconds)},
        }])

    yield write
    control_plane.kubectl("delete", "lease", election.lease_name, "-n", election.lease_namespace,
                          "--ignore-not-found", check=False)
    kube.poll("the webhook sees the Lease gone", lambda: not gated_for_release(control_plane, namespace))


def controller_seen_alive(cluster: localcluster.LocalCluster, namespace: str, write: WriteLease) -> None:
    """Renew until the webhook gates: the first sight of a Lease proves nothing, a renewal it sees does."""
    def renewed() -> bool:
        write("e2e-descheduler")
        return gated_for_release(cluster, namespace)

    kube.poll("the webhook sees the descheduler's Lease renewed", renewed)


def test_gpu_pod_is_gated_for_release_only_while_the_controller_lease_is_renewed(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    controller_lease: WriteLease,
) -> None:
    cluster = gpu_cluster.cluster
    lease = f"{webhook.settings.descheduler.leader_election.lease_namespace}/" \
            f"{webhook.settings.descheduler.leader_election.lease_name}"
    controller_seen_alive(cluster, namespace, controller_lease)

    stored = create_and_read(cluster, kube.pod("placed-at-release", namespace=namespace, gpus=2))

    assert kube.gates(stored) == [NAMES.gate]
    assert node_affinity(stored) == {}  # the release controller pins it: no terms at admission
    record = decision(stored) or ""
    assert "placement strict: at release, no preferred terms" in record, record
    assert f"gate {NAMES.gate} added: placed at release (Lease {lease} renewed" in record, record
    held = kube.poll(  # no release controller runs in this test: the scheduler holds the pod back
        "placed-at-release reported SchedulingGated",
        lambda: kube.scheduled_reason(kube.pods(cluster, namespace)["placed-at-release"]) == "SchedulingGated",
    )
    assert held

    controller_lease("")  # the descheduler released its Lease (it does so on shutdown)
    kube.poll("the webhook sees the Lease released", lambda: not gated_for_release(cluster, namespace))

    stored = create_and_read(cluster, kube.pod("preferred-only", namespace=namespace, gpus=2))

    assert kube.gates(stored) == [] and required_terms(stored) == []
    assert kube.preferred_nodes(stored), node_affinity(stored)
    record = decision(stored) or ""
    assert (f"gate {NAMES.gate} not added: not placed at release: controller down (Lease {lease} not seen held "
            "and renewed)") in record, record


def test_a_controller_that_stops_renewing_its_lease_stops_the_gating(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    controller_lease: WriteLease,
) -> None:
    """A descheduler killed outright never releases its Lease: the webhook stops gating once it has not seen
    a renewal for admission.controller_stale_seconds (30 s by default), whatever the Lease's own times say."""
    cluster = gpu_cluster.cluster
    controller_seen_alive(cluster, namespace, controller_lease)
    stale = webhook.settings.admission.controller_stale_seconds

    kube.poll("the webhook stops gating without renewals", lambda: not gated_for_release(cluster, namespace),
              timeout_seconds=stale + 30, interval_seconds=1)

    stored = create_and_read(cluster, kube.pod("after-the-controller", namespace=namespace, gpus=2))
    assert kube.gates(stored) == []
    record = decision(stored) or ""
    assert "not placed at release: controller down" in record and f"ago (over {stale:g}s))" in record, record


@pytest.mark.parametrize(
    "labels",
    [
        # with the controller alive, where the same pod without nodeName would be gated for release
        pytest.param({}, id="single-pod-controller-alive"),
        pytest.param({NAMES.gang_name: "train", NAMES.gang_size: "2"}, id="gang-member"),
    ],
)
def test_pod_created_with_node_name_is_accepted_without_gate_or_affinity(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    namespace: str,
    controller_lease: WriteLease,
    labels: dict[str, str],
) -> None:
    """The API server refuses a pod with spec.nodeName and scheduling gates (test_controlplane_facts): a gate
    from us would fail the create itself, which failurePolicy Ignore does not cover."""
    cluster = gpu_cluster.cluster
    if not labels:
        controller_seen_alive(cluster, namespace, controller_lease)
    node = gpu_cluster.node_names[0]
    pod = kube.pod("bound", namespace=namespace, gpus=2, labels=labels)
    pod["spec"]["nodeName"] = node

    stored = create_and_read(cluster, pod)

    assert (stored["spec"]["nodeName"], kube.gates(stored), node_affinity(stored)) == (node, [], {})
    record = decision(stored) or ""
    assert f"placement: none, the pod names its node ({node})" in record, record
    assert f"gate {NAMES.gate} not added: spec.nodeName {node}: bound at creation, never gated" in record, record
