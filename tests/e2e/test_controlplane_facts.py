"""The Kubernetes behaviour gpu-steward relies on (DESIGN.md, "Kubernetes facts that bite"), proven
against the real kube-apiserver, kube-scheduler and kube-controller-manager with kwok nodes.

These tests run in namespaces our webhook never sees: they check Kubernetes, not us. Updates whose
acceptance is the question are sent as server-side dry runs, so every row starts from the same pod.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from common import gpu, settings
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

GATE = "e2e.gpu-steward.io/hold"
OTHER_GATE = "e2e.gpu-steward.io/other"
REQUIRED = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
PREFERRED = "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution"
HIGH = "e2e-high"  # PreemptLowerPriority
NEVER = "e2e-never"  # preemptionPolicy Never
CLASS_VALUES = {HIGH: 1000, NEVER: 500}
NAMES = settings.Names()


def create(
    cluster: localcluster.LocalCluster, obj: Mapping[str, Any], *, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    args = ["create", "-o", "json", "-f", "-", *(["--dry-run=server"] if dry_run else [])]
    return cluster.kubectl(*args, input=json.dumps(obj), check=False)


def patch(
    cluster: localcluster.LocalCluster, namespace: str, name: str, ops: list[dict[str, Any]], *, dry_run: bool = True
) -> subprocess.CompletedProcess[str]:
    args = ["patch", "pod", name, "-n", namespace, "--type=json", "-p", json.dumps(ops), "-o", "json"]
    return cluster.kubectl(*args, *(["--dry-run=server"] if dry_run else []), check=False)


def op(kind: str, path: str, value: Any = None) -> list[dict[str, Any]]:
    """A one-operation JSON patch."""
    return [{"op": kind, "path": path} | ({} if value is None else {"value": value})]


def wait_pod(cluster: localcluster.LocalCluster, namespace: str, name: str, condition: str) -> None:
    cluster.kubectl("wait", f"--for={condition}", f"pod/{name}", "-n", namespace, "--timeout=30s", timeout_seconds=40)


def get_pod(cluster: localcluster.LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.kubectl_json("get", "pod", name, "-n", namespace)
    return result


@pytest.fixture(scope="module")
def priority_classes(control_plane: localcluster.LocalCluster) -> Iterator[None]:
    control_plane.apply(
        [
            kube.priority_class(HIGH, value=CLASS_VALUES[HIGH]),
            kube.priority_class(NEVER, value=CLASS_VALUES[NEVER], preemption_policy="Never"),
        ]
    )
    yield
    control_plane.kubectl("delete", "priorityclass", HIGH, NEVER, "--ignore-not-found", check=False)


# --- the Priority admission plugin -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "rejected_with"),
    [
        pytest.param({"priority_class": HIGH}, None, id="class-only-is-completed-by-the-plugin"),
        pytest.param(
            {"priority_class": HIGH, "priority": 1000, "preemption_policy": "PreemptLowerPriority"},
            None,
            id="all-three-consistent",
        ),
        pytest.param(
            {"priority_class": NEVER, "priority": 500, "preemption_policy": "Never"},
            None,
            id="all-three-consistent-never",
        ),
        pytest.param(
            {"priority_class": HIGH, "priority": 7},
            "the integer value of priority (7) must not be provided in pod spec",
            id="wrong-priority",
        ),
        pytest.param(
            {"priority_class": HIGH, "priority": 0, "preemption_policy": "PreemptLowerPriority"},
            "the integer value of priority (0) must not be provided in pod spec",
            id="class-changed-but-priority-left-at-zero",
        ),
        pytest.param(
            {"priority_class": NEVER, "priority": 500, "preemption_policy": "PreemptLowerPriority"},
            "the string value of PreemptionPolicy (PreemptLowerPriority) must not be provided in pod spec",
            id="wrong-preemption-policy",
        ),
    ],
)
def test_priority_plugin_requires_priority_and_policy_to_match_the_class(
    control_plane: localcluster.LocalCluster,
    plain_namespace: str,
    priority_classes: None,
    spec: dict[str, Any],
    rejected_with: str | None,
) -> None:
    done = create(control_plane, kube.pod("p", namespace=plain_namespace, gpus=1, **spec), dry_run=True)

    if rejected_with is not None:
        assert done.returncode != 0
        assert rejected_with in done.stderr
        return
    assert done.returncode == 0, done.stderr
    stored = json.loads(done.stdout)["spec"]
    expected_policy = "Never" if spec["priority_class"] == NEVER else "PreemptLowerPriority"
    assert (stored["priorityClassName"], stored["priority"], stored["preemptionPolicy"]) == (
        spec["priority_class"],
        CLASS_VALUES[spec["priority_class"]],
        expected_policy,
    )


# --- scheduling gates ------------------------------------------------------------------------------


def test_scheduling_gates_are_set_at_create_never_added_later_and_removable(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str
) -> None:
    cluster = gpu_cluster.cluster
    ns = plain_namespace
    assert create(cluster, kube.pod("gated", namespace=ns, gpus=1, gates=[GATE])).returncode == 0
    wait_pod(cluster, ns, "gated", "jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=SchedulingGated")
    # A pending pod that was created without gates (it can never fit) cannot get one either.
    assert create(cluster, kube.pod("ungated", namespace=ns, gpus=64)).returncode == 0

    add_to_gated = patch(cluster, ns, "gated", op("add", "/spec/schedulingGates/-", {"name": OTHER_GATE}))
    add_to_ungated = patch(cluster, ns, "ungated", op("add", "/spec/schedulingGates", [{"name": GATE}]))
    assert add_to_gated.returncode != 0
    assert f"Forbidden: only deletion is allowed, but found new scheduling gate '{OTHER_GATE}'" in add_to_gated.stderr
    assert add_to_ungated.returncode != 0
    assert f"Forbidden: only deletion is allowed, but found new scheduling gate '{GATE}'" in add_to_ungated.stderr

    removed = patch(cluster, ns, "gated", op("remove", "/spec/schedulingGates"), dry_run=False)
    assert removed.returncode == 0, removed.stderr
    wait_pod(cluster, ns, "gated", "condition=PodScheduled")
    assert get_pod(cluster, ns, "gated")["spec"]["nodeName"] in gpu_cluster.node_names


def test_a_pod_created_with_node_name_may_not_carry_scheduling_gates(
    control_plane: localcluster.LocalCluster, plain_namespace: str
) -> None:
    """So admission never gates a pod that names its node (gang members included)."""
    pod = kube.pod("bound", namespace=plain_namespace, gpus=1, gates=[GATE])
    pod["spec"]["nodeName"] = "kwok-8g2d-0"

    gated = create(control_plane, pod, dry_run=True)
    del pod["spec"]["schedulingGates"]
    ungated = create(control_plane, pod, dry_run=True)

    assert gated.returncode != 0
    assert "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared" in gated.stderr
    assert ungated.returncode == 0, ungated.stderr


# --- affinity changes while gated ------------------------------------------------------------------


NARROWED = "only additions are allowed (no mutations or deletions)"
TERMS_FIXED = "no additions/deletions to non-empty NodeSelectorTerms list are allowed"
ONE_NAME = "must be only one value when `operator` is 'In' or 'NotIn' for node field selector"


@pytest.mark.parametrize(
    ("ops", "rejected_with"),
    [
        pytest.param(
            op("add", f"{REQUIRED}/0/matchExpressions/-", kube.requirement(NAMES.nvlink_domains, "Gt", "1")),
            None,
            id="append-expression-to-a-term",
        ),
        pytest.param(
            op(
                "add",
                f"{REQUIRED}/0/matchExpressions/-",
                kube.requirement("kubernetes.io/hostname", "In", "kwok-8g2d-0", "kwok-8g2d-1"),
            ),
            None,
            id="pin-to-a-node-set-by-hostname-label",
        ),
        pytest.param(
            op("add", f"{REQUIRED}/0/matchFields", [kube.requirement("metadata.name", "In", "kwok-8g2d-0")]),
            None,
            id="pin-to-one-node-by-matchFields",
        ),
        pytest.param(
            op(
                "add",
                f"{REQUIRED}/0/matchFields",
                [kube.requirement("metadata.name", "In", "kwok-8g2d-0", "kwok-8g2d-1")],
            ),
            ONE_NAME,
            id="matchFields-takes-one-node-name-only",
        ),
        pytest.param(
            op(
                "add",
                PREFERRED,
                [{"weight": 50, "preference": {"matchExpressions": [kube.requirement("type", "Exists")]}}],
            ),
            None,
            id="preferred-terms-change-freely",
        ),
        pytest.param(op("remove", f"{REQUIRED}/0/matchExpressions/0"), NARROWED, id="remove-an-expression"),
        pytest.param(
            op("replace", f"{REQUIRED}/0/matchExpressions/0/values", ["0"]), NARROWED, id="loosen-an-expression"
        ),
        pytest.param(
            op("add", f"{REQUIRED}/-", {"matchExpressions": [kube.requirement("type", "Exists")]}),
            TERMS_FIXED,
            id="add-a-term",
        ),
        pytest.param(op("remove", f"{REQUIRED}/1"), TERMS_FIXED, id="remove-a-term"),
    ],
)
def test_gated_pod_node_affinity_may_only_be_tightened(
    control_plane: localcluster.LocalCluster,
    plain_namespace: str,
    ops: list[dict[str, Any]],
    rejected_with: str | None,
) -> None:
    terms = [
        {"matchExpressions": [kube.requirement(NAMES.nvlink_domain_size, "Gt", "1")]},
        {"matchExpressions": [kube.requirement("nvidia.com/gpu.count", "Gt", "1")]},
    ]
    pod = kube.pod("gated", namespace=plain_namespace, gpus=2, gates=[GATE], required_terms=terms)
    assert create(control_plane, pod).returncode == 0

    done = patch(control_plane, plain_namespace, "gated", ops)

    if rejected_with is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0
        assert rejected_with in done.stderr


def test_node_affinity_is_immutable_once_ungated(
    control_plane: localcluster.LocalCluster, plain_namespace: str
) -> None:
    terms = [{"matchExpressions": [kube.requirement("nvidia.com/gpu.count", "Gt", "100")]}]  # stays Pending
    pod = kube.pod("p", namespace=plain_namespace, gpus=1, gates=[GATE], required_terms=terms)
    assert create(control_plane, pod).returncode == 0
    ungated = patch(control_plane, plain_namespace, "p", op("remove", "/spec/schedulingGates"), dry_run=False)
    assert ungated.returncode == 0, ungated.stderr

    done = patch(
        control_plane,
        plain_namespace,
        "p",
        op("add", f"{REQUIRED}/0/matchExpressions/-", kube.requirement("type", "Exists")),
    )

    assert done.returncode != 0
    assert "pod updates may not change fields other than" in done.stderr


# --- the scheduler and kwok ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", [pytest.param("kwok-8g2d-3", id="large-node"), pytest.param("kwok-2g1d-1", id="small-node")]
)
def test_scheduler_honours_preferred_terms_with_matchFields(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, target: str
) -> None:
    cluster = gpu_cluster.cluster
    preferred = [(100, {"matchFields": [kube.requirement("metadata.name", "In", target)]})]
    assert create(cluster, kube.pod("p", namespace=plain_namespace, gpus=1, preferred_terms=preferred)).returncode == 0

    wait_pod(cluster, plain_namespace, "p", "condition=PodScheduled")

    assert get_pod(cluster, plain_namespace, "p")["spec"]["nodeName"] == target


def test_kwok_gpu_nodes_are_ready_and_gpu_pods_run_within_capacity(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str
) -> None:
    cluster = gpu_cluster.cluster
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    for want in gpu_cluster.nodes:
        node = nodes[want["metadata"]["name"]]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert (ready, node["status"]["allocatable"][gpu.FULL_GPU]) == (
            "True",
            want["status"]["capacity"][gpu.FULL_GPU],
        )

    assert create(cluster, kube.pod("fits", namespace=plain_namespace, gpus=8)).returncode == 0
    assert create(cluster, kube.pod("too-big", namespace=plain_namespace, gpus=9)).returncode == 0
    wait_pod(cluster, plain_namespace, "fits", "jsonpath={.status.phase}=Running")
    wait_pod(
        cluster,
        plain_namespace,
        "too-big",
        "jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=Unschedulable",
    )

    fits = get_pod(cluster, plain_namespace, "fits")
    assert nodes[fits["spec"]["nodeName"]]["status"]["allocatable"][gpu.FULL_GPU] == "8"
    assert "Insufficient nvidia.com/gpu" in json.dumps(get_pod(cluster, plain_namespace, "too-big")["status"])


# --- the Eviction API ------------------------------------------------------------------------------


async def evict(api: client.ApiClient, namespace: str, name: str) -> tuple[int, str]:
    """POST a policy/v1 Eviction; return the HTTP status and the reason message."""
    body = client.V1Eviction(
        api_version="policy/v1", kind="Eviction", metadata=client.V1ObjectMeta(name=name, namespace=namespace)
    )
    try:
        _, status, _ = await client.CoreV1Api(api).create_namespaced_pod_eviction_with_http_info(
            name, namespace, body, _request_timeout=10
        )
    except client.ApiException as exc:
        return exc.status, json.loads(exc.body or "{}").get("message", "")
    return status, ""


async def test_eviction_answers_201_429_and_404(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, kube_api: client.ApiClient
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    for name in ("free", "guarded"):
        assert create(cluster, kube.pod(name, namespace=ns, gpus=1, labels={"app": name})).returncode == 0
    cluster.apply([kube.pod_disruption_budget("guard", namespace=ns, match_labels={"app": "guarded"}, min_available=1)])
    for name in ("free", "guarded"):
        wait_pod(cluster, ns, name, "condition=Ready")
    # The disruption controller must have counted the pod, or the answer is 429 for another reason.
    cluster.kubectl("wait", "--for=jsonpath={.status.currentHealthy}=1", "pdb/guard", "-n", ns, "--timeout=30s")

    assert await evict(kube_api, ns, "free") == (201, "")
    wait_pod(cluster, ns, "free", "delete")

    status, message = await evict(kube_api, ns, "guarded")
    assert (status, "Cannot evict pod as it would violate the pod's disruption budget.") == (429, message)
    assert get_pod(cluster, ns, "guarded")["metadata"].get("deletionTimestamp") is None

    status, message = await evict(kube_api, ns, "missing")
    assert (status, message) == (404, 'pods "missing" not found')
