"""Tiers through the real kube-apiserver, whose Priority plugin runs before our webhook: a `globalDefault`
PriorityClass is no choice of the user's, a `preemptionPolicy: Never` the pod carries is kept, and the
critical tier can be claimed by label only where the operator allows it (a refused claim is a warning).

What the API server stored is what counts. The webhook learns of classes and namespace labels from its
watch: each test first asks the API server for a dry-run until the webhook's answer reflects the change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
DEFAULT_CLASS = "e2e-cluster-default"


def admitted(
    cluster: localcluster.LocalCluster, pod: dict[str, Any], *, record_says: str
) -> tuple[dict[str, Any], str]:
    """Create `pod` once a server-side dry-run shows the webhook's record saying `record_says`; return the pod as
    stored and what kubectl printed on stderr (the webhook's warnings)."""

    def ready() -> bool:
        dry = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod),
                              check=False)
        if dry.returncode != 0:
            return False
        return record_says in (json.loads(dry.stdout)["metadata"].get("annotations") or {}).get(NAMES.decision, "")

    kube.poll(f"the webhook's record says {record_says!r}", ready)
    done = cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(pod), check=False)
    assert done.returncode == 0, f"the API server refused the pod: {done.stderr}"
    meta = pod["metadata"]
    stored: dict[str, Any] = cluster.kubectl_json("get", "pod", meta["name"], "-n", meta["namespace"])
    return stored, done.stderr


def triple(pod: dict[str, Any]) -> tuple[str | None, int | None, str | None]:
    spec = pod["spec"]
    return spec.get("priorityClassName"), spec.get("priority"), spec.get("preemptionPolicy")


@pytest.fixture
def global_default(control_plane: localcluster.LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A `globalDefault` PriorityClass (value 1000, the parametrised preemptionPolicy), deleted afterwards."""
    pc = kube.priority_class(DEFAULT_CLASS, value=1000, preemption_policy=request.param)
    pc["globalDefault"] = True
    control_plane.apply([pc])
    try:
        yield request.param
    finally:
        control_plane.kubectl("delete", "priorityclass", DEFAULT_CLASS, "--ignore-not-found", check=False)


@pytest.mark.parametrize("global_default", ["PreemptLowerPriority"], indirect=True)
def test_a_pod_given_the_global_default_class_still_gets_its_tier(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str, global_default: str
) -> None:
    """Old code: the Priority plugin wrote `e2e-cluster-default` into the pod before our webhook saw it, which
    kept it as the user's choice: no tier, so no reclaim policy, for every GPU pod of such a cluster."""
    normal = webhook.settings.tiers.normal
    stored, _ = admitted(gpu_cluster.cluster, kube.pod("gpu", namespace=namespace, gpus=1),
                         record_says=f"class {DEFAULT_CLASS} is the cluster's globalDefault: no class chosen")
    assert triple(stored) == (normal.name, normal.value, normal.preemption_policy)


@pytest.mark.parametrize("global_default", ["Never"], indirect=True)
def test_a_non_preempting_pod_keeps_its_policy(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str, global_default: str
) -> None:
    """Old code gave it the normal tier's class: PreemptLowerPriority at priority 10000."""
    stored, _ = admitted(gpu_cluster.cluster, kube.pod("gpu", namespace=namespace, gpus=1),
                         record_says="tier normal not applied: the pod's preemptionPolicy Never is kept")
    assert triple(stored) == (DEFAULT_CLASS, 1000, "Never")


def test_the_priority_plugin_refuses_never_on_a_pod_whose_class_preempts(
    control_plane: localcluster.LocalCluster, plain_namespace: str
) -> None:
    """Why a pod reaching our webhook with `preemptionPolicy: Never` got it from its class (or the globalDefault):
    without our webhook, a pod asking for Never under no class is refused by the API server itself."""
    pod = kube.pod("never", namespace=plain_namespace, preemption_policy="Never")
    done = control_plane.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0
    assert "the string value of PreemptionPolicy (Never) must not be provided in pod spec" in done.stderr, done.stderr


def test_critical_by_label_only_where_the_operator_allows_it(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer, namespace: str
) -> None:
    """Old code: any pod could label itself critical and then preempt lower tiers and never be reclaimed."""
    cluster = gpu_cluster.cluster
    critical, normal = webhook.settings.tiers.critical, webhook.settings.tiers.normal
    labels = {NAMES.tier: "critical"}
    refused, warnings = admitted(cluster, kube.pod("self-promoted", namespace=namespace, gpus=1, labels=labels),
                                 record_says="tier normal: default tier")
    assert triple(refused) == (normal.name, normal.value, normal.preemption_policy)
    assert f"label {NAMES.tier}=critical refused: namespace {namespace} may not claim it" in warnings, warnings

    cluster.kubectl("label", "namespace", namespace, f"{conftest.CRITICAL_CLAIM_LABEL}=true")
    allowed, warnings = admitted(cluster, kube.pod("allowed", namespace=namespace, gpus=1, labels=labels),
                                 record_says="(label claim 'e2e')")
    assert triple(allowed) == (critical.name, critical.value, critical.preemption_policy)
    assert "refused" not in warnings
