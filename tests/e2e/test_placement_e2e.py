"""NVLink-aware placement with the real kube-scheduler: the same sequence of single GPU pods, once
without our webhook (plain Kubernetes) and once through it, on the session's kwok GPU nodes.

Which GPU indices a pod holds inside its node comes from `devicesim.Assignments` (the device-plugin
stand-in: smallest free NVLink domain that fits, else the fewest domains) applied to the cluster as
stored, the same way for both arms — so the arms differ only in the scheduler's node choice.

Before each pod of our arm the test waits until the webhook decides that pod exactly as the pure
admission core decides it on the cluster as the API server has it now: the webhook reads the cluster
through a watch, and the previous pod's binding must have reached it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from admission import mutation
from common import snapshot_build
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

SEQUENCE = (1, 1, 1, 1, 2, 2, 4, 4, 4, 8, 8)  # GPUs per pod, in creation order: all 36 of the cluster's GPUs


@dataclasses.dataclass(frozen=True)
class Landing:
    pod: str
    gpus: int
    node: str | None
    domains: int  # NVLink domains its GPUs span (0: not bound)
    fewest: int  # the fewest domains any node of the cluster could give it

    @property
    def excess(self) -> int:
        return self.domains - self.fewest if self.node else 0

    def __str__(self) -> str:
        where = f"{self.node} ({self.domains} domain{'s' if self.domains != 1 else ''})" if self.node else "Pending"
        return f"{self.pod}: {where}"


def measure(arm: conftest.GpuCluster, namespace: str, webhook: conftest.WebhookServer) -> list[Landing]:
    view = kube.GpuView.of(arm.cluster, names=webhook.settings.names)
    largest = max(node.topology.domain_size for node in view.state.nodes.values())
    return [
        Landing(pod.name, pod.request.full, pod.node_name, view.domains_spanned(pod),
                math.ceil(pod.request.full / largest))
        for pod in sorted(view.state.pods.values(), key=lambda p: p.name)
        if pod.namespace == namespace
    ]


def place_in_sequence(
    cluster: localcluster.LocalCluster, namespace: str, *, before_create: Callable[[dict[str, Any]], None]
) -> None:
    """Create the pods one by one, each once the previous one is bound or found unschedulable."""
    for index, gpus in enumerate(SEQUENCE):
        pod = kube.pod(f"p{index:02d}-{gpus}gpu", namespace=namespace, gpus=gpus)
        before_create(pod)
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
        name = pod["metadata"]["name"]

        def settled(name: str = name) -> bool:
            return kube.scheduled_reason(kube.pods(cluster, namespace)[name]) in ("True", "Unschedulable")

        kube.poll(f"{name} bound or unschedulable", settled)


def webhook_caught_up(cluster: localcluster.LocalCluster, webhook: conftest.WebhookServer, namespace: str) -> Callable[
    [dict[str, Any]], None
]:
    """Wait until the webhook decides `pod` (a server-side dry run) as the admission core does on the
    cluster as stored now."""

    def wait(pod: dict[str, Any]) -> None:
        def same() -> tuple[str, str] | None:
            now = time.time()
            state = snapshot_build.from_list(kube.cluster_state(cluster), names=webhook.settings.names, taken_at=now)
            expected = mutation.decide(
                operation="CREATE", namespace=namespace, pod=pod, cluster=state, config=webhook.settings, now=now
            ).record
            probe = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod))
            got = (json.loads(probe.stdout)["metadata"].get("annotations") or {}).get(webhook.settings.names.decision)
            last[:] = [expected, str(got)]
            return (expected, got) if got == expected else None

        last: list[str] = []
        try:
            kube.poll(f"the webhook decides {pod['metadata']['name']} on the current cluster", same)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nexpected: {last[0]}\nwebhook:  {last[1]}") from None

    return wait


@pytest.fixture
def baseline(gpu_cluster: conftest.GpuCluster, plain_namespace: str, webhook: conftest.WebhookServer) -> list[Landing]:
    """The sequence with plain Kubernetes (a namespace the webhook never sees), measured, then removed."""
    kube.wait_gpus_free(gpu_cluster.cluster)
    place_in_sequence(gpu_cluster.cluster, plain_namespace, before_create=lambda pod: None)
    landed = measure(gpu_cluster, plain_namespace, webhook)
    gpu_cluster.cluster.kubectl("delete", "pods", "--all", "-n", plain_namespace, "--wait=true")
    return landed


def test_webhook_steers_each_pod_into_nvlink_domains_that_fit_it(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str, baseline: list[Landing]
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)

    place_in_sequence(cluster, namespace, before_create=webhook_caught_up(cluster, webhook, namespace))

    ours = measure(gpu_cluster, namespace, webhook)
    report = (
        "\nwith gpu-steward:\n  " + "\n  ".join(map(str, ours))
        + "\nplain Kubernetes:\n  " + "\n  ".join(map(str, baseline))
    )
    assert [(p.pod, p.gpus) for p in ours] == [(p.pod, p.gpus) for p in baseline], report
    # Why each landed where it did: no descheduler runs (no Lease), so the webhook gated nothing, required
    # nothing, and preferred that node.
    stored = kube.pods(cluster, namespace)
    for landed in ours:
        pod = stored[landed.pod]
        record = (pod["metadata"].get("annotations") or {}).get(webhook.settings.names.decision, "")
        # 1-GPU pods are not governed (admission.release_min_gpus is 2); larger ones would be, but no Lease
        why = "under admission.release_min_gpus" if landed.gpus == 1 else "not placed at release: controller down"
        assert why in record, (landed, record)
        assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["spec"]["affinity"]["nodeAffinity"]
        preferred = {node for _, nodes in kube.preferred_nodes(pod) for node in nodes}
        assert landed.node in preferred, (landed, record)
    # Every pod bound, each within the fewest NVLink domains possible (one, up to the domain size).
    assert [p for p in ours if p.node is None or p.excess] == [], report
    # No worse than plain Kubernetes: as many pods placed, no more domains spanned beyond the fewest.
    placed = (sum(p.node is not None for p in ours), sum(p.node is not None for p in baseline))
    assert placed[0] >= placed[1], report
    excess = (sum(p.excess for p in ours), sum(p.excess for p in baseline))
    assert excess[0] <= excess[1], report
