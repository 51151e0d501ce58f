"""Beside Kubernetes' native gang scheduling (1.37 beta: `scheduling.k8s.io/v1beta1` PodGroup, feature gate
`GenericWorkload`, both on in the session's control plane): a pod in a PodGroup with a `gang` policy gets no
gate of ours and kube-scheduler holds and schedules the gang itself; a pod in a PodGroup with a `basic`
policy is handled as any other (here: one of our gangs, gated by us and released by the real descheduler).

Old code took every `spec.schedulingGroup.podGroupName` for a native gang, whatever its PodGroup's policy.
The webhook learns PodGroups from its watch: each test first dry-runs a pod until its record shows that.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from common import settings
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
HOLD_SECONDS = 3
GANG_ONLY = {"descheduler": {"reclaim": {"enabled": False}}}


def pod_group(name: str, namespace: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"schedulingPolicy": policy}}


def member(name: str, namespace: str, group: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = kube.pod(name, namespace=namespace, gpus=2, labels=labels)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def wait_record(cluster: localcluster.LocalCluster, pod: dict[str, Any], says: str) -> None:
    """Until a server-side dry-run of `pod` comes back with a decision record saying `says`."""

    def ready() -> bool:
        dry = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod),
                              check=False)
        if dry.returncode != 0:
            return False
        return says in (json.loads(dry.stdout)["metadata"].get("annotations") or {}).get(NAMES.decision, "")

    kube.poll(f"the webhook's record says {says!r}", ready)


def create(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))


def why_pending(cluster: localcluster.LocalCluster, namespace: str) -> str:
    """Each pod's gates, node and conditions, and the namespace's events: what a failed wait shows."""
    pods = {n: (kube.gates(p), p["spec"].get("nodeName"), (p.get("status") or {}).get("conditions"))
            for n, p in kube.pods(cluster, namespace).items()}
    events = [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in kube.events(cluster, namespace)]
    return json.dumps({"pods": pods, "events": events}, indent=1)


def poll_explained(cluster: localcluster.LocalCluster, namespace: str, what: str, check: Any) -> None:
    try:
        kube.poll(what, check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why_pending(cluster, namespace)}") from None


def test_the_api_serves_pod_groups(control_plane: localcluster.LocalCluster) -> None:
    served = control_plane.kubectl("api-resources", "--api-group=scheduling.k8s.io", "-o", "name").stdout.split()
    assert "podgroups.scheduling.k8s.io" in served, served
    versions = control_plane.kubectl("api-versions").stdout.split()
    assert "scheduling.k8s.io/v1beta1" in versions, versions


def test_a_native_gang_gets_no_gate_of_ours_and_is_scheduled_by_kube_scheduler(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    cluster.apply([pod_group("native", namespace, {"gang": {"minCount": 2}})])
    wait_record(cluster, member("probe", namespace, "native"), "PodGroup native has a gang policy (minCount 2)")

    create(cluster, member("native-0", namespace, "native"))
    # One of two: kube-scheduler's gang plugin holds it (not our gate: there is none).
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        first = kube.pods(cluster, namespace)["native-0"]
        assert not kube.gates(first) and not first["spec"].get("nodeName"), first["spec"]
        time.sleep(0.25)
    create(cluster, member("native-1", namespace, "native"))

    def both_bound() -> dict[str, str] | None:
        pods = kube.pods(cluster, namespace)
        nodes = {n: pods[n]["spec"].get("nodeName") for n in ("native-0", "native-1") if n in pods}
        return {k: str(v) for k, v in nodes.items()} if len(nodes) == 2 and all(nodes.values()) else None

    poll_explained(cluster, namespace, "both members of the native gang bound", both_bound)
    for pod in kube.pods(cluster, namespace).values():
        assert NAMES.gate not in kube.gates(pod)
        record = pod["metadata"]["annotations"][NAMES.decision]
        assert f"gate {NAMES.gate} not added: gang {namespace}/native: PodGroup native has a gang policy" in record


def test_kube_scheduler_refuses_a_pod_group_whose_pods_have_another_priority(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str
) -> None:
    """Why the webhook gives no tier to a pod of a PodGroup: kube-scheduler 1.37 will not schedule it when its
    priority differs from the PodGroup's (here the pod names the normal tier's class itself; the PodGroup none)."""
    cluster = gpu_cluster.cluster
    cluster.apply([pod_group("mixed", namespace, {"basic": {}})])
    pod = member("mixed-0", namespace, "mixed")
    pod["spec"]["priorityClassName"] = webhook.settings.tiers.normal.name
    create(cluster, pod)

    def refused() -> bool:
        return any("should have the same priority as the pod group's priority" in e["message"]
                   for e in kube.events_about(cluster, namespace, "mixed-0", reason="FailedScheduling"))

    poll_explained(cluster, namespace, "FailedScheduling for a priority unlike the PodGroup's", refused)
    assert not kube.pods(cluster, namespace)["mixed-0"]["spec"].get("nodeName")


def test_a_pod_group_without_gang_policy_is_handled_as_today(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler,
    namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    descheduler_factory(GANG_ONLY)
    cluster.apply([pod_group("loose", namespace, {"basic": {}})])
    labels = {NAMES.gang_name: "ours", NAMES.gang_size: "2"}
    wait_record(cluster, member("probe", namespace, "loose", labels=labels), f"gate {NAMES.gate} added")

    create(cluster, member("ours-0", namespace, "loose", labels=labels))
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:  # our gang of 2 is incomplete: our gate holds it
        first = kube.pods(cluster, namespace)["ours-0"]
        assert NAMES.gate in kube.gates(first) and not first["spec"].get("nodeName"), first["spec"]
        time.sleep(0.25)
    create(cluster, member("ours-1", namespace, "loose", labels=labels))

    def released_and_bound() -> bool:
        pods = kube.pods(cluster, namespace)
        return all(n in pods and not kube.gates(pods[n]) and pods[n]["spec"].get("nodeName")
                   for n in ("ours-0", "ours-1"))

    poll_explained(cluster, namespace, "our gang released by the descheduler and bound", released_and_bound)
    assert len(kube.events(cluster, namespace, reason="GangReleased")) == 2
