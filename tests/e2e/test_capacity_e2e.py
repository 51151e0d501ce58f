"""The one capacity model against the real kube-scheduler, and the release patch against the real API server.

Differential: on kwok nodes of odd shapes (few CPUs, little memory, few pod slots, 2-8 GPUs), a seeded random
stream of pods (GPUs, CPU, memory, with and without GPUs) is created one at a time. Before each, the model is
asked which nodes could take the pod now (`common.capacity`, read from the live cluster as the descheduler reads
it); then kube-scheduler decides. Bound => the node is one the model allowed; Unschedulable => the model allowed
none. Pods accumulate, so later pods meet fuller nodes.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from common import capacity, fit, gpu, placement, resources, settings, snapshot
from descheduler.release import patches
from gpu_steward import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
TAINT = {"key": "e2e.gpu-steward.io/capacity", "value": "true", "effect": "NoSchedule"}
POOL = {"e2e.gpu-steward.io/pool": "capacity"}
SHAPES = [  # name, GPUs, NVLink domains, cpu, memory, pod slots
    ("cap-8g", 8, 2, "8", "32Gi", 4),
    ("cap-4g", 4, 1, "16", "8Gi", 10),
    ("cap-2g", 2, 1, "4", "64Gi", 3),
]
SEED = 20261124
PODS = 24


def _nodes() -> list[dict[str, Any]]:
    out = []
    for name, gpus, domains, cpu, memory, pods in SHAPES:
        node = localcluster.gpu_node(name, gpus=gpus, domains=domains, product="NVIDIA-H100-80GB-HBM3", names=NAMES,
                                     cpu=cpu, memory=memory, pods=pods)
        node["metadata"]["labels"].update(POOL)
        node["spec"]["taints"] = [TAINT]
        out.append(node)
    return out


def _random_pod(rng: random.Random, name: str, namespace: str) -> dict[str, Any]:
    requests = {"cpu": f"{rng.choice([0, 500, 1000, 2000, 3000, 6000])}m", "memory": f"{rng.choice([0, 1, 4, 16])}Gi"}
    gpus = rng.choice([0, 0, 1, 1, 2, 4, 8])
    if gpus:
        requests[gpu.FULL_GPU] = str(gpus)
    body = kube.pod(name, namespace=namespace, node_selector=POOL)
    container = body["spec"]["containers"][0]
    container["resources"] = {"requests": requests, **({"limits": {gpu.FULL_GPU: str(gpus)}} if gpus else {})}
    body["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    return body


def _model_allows(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> set[str]:
    state = cluster.kubectl_json("get", "nodes,pods", "-A")
    snap = snapshot.from_list(state, names=NAMES, taken_at=0.0)
    spec, requests, request = pod["spec"], resources.pod_requests(pod), gpu.pod_request(pod)
    allowed = set()
    for node in snap.nodes.values():
        if fit.why_not(spec, node) is None and isinstance(
                capacity.Room.of(node).place(requests, request, one_domain=False), placement.Allocation):
            allowed.add(node.name)
    return allowed


def _outcome(cluster: localcluster.LocalCluster, namespace: str, name: str) -> str | None:
    """The node the pod was bound to, "" when the scheduler found it unschedulable, None while undecided."""
    pod = cluster.kubectl_json("get", "pod", name, "-n", namespace)
    if pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return ""
    return None


def _decision(cluster: localcluster.LocalCluster, namespace: str, name: str) -> str:
    def check() -> tuple[str] | None:
        out = _outcome(cluster, namespace, name)
        return None if out is None else (out,)

    return kube.poll(f"scheduler decision for {name}", check, timeout_seconds=30)[0]


def test_capacity_model_agrees_with_kube_scheduler(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str
) -> None:
    cluster = gpu_cluster.cluster
    cluster.add_nodes(_nodes())
    rng = random.Random(SEED)
    seen = {"bound": 0, "unschedulable": 0}
    try:
        for i in range(PODS):
            pod = _random_pod(rng, f"cap-{i:02d}", plain_namespace)
            allowed = _model_allows(cluster, pod)
            assert cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False).returncode == 0
            decided = _decision(cluster, plain_namespace, pod["metadata"]["name"])
            requests = pod["spec"]["containers"][0]["resources"]["requests"]
            if decided:
                seen["bound"] += 1
                assert decided in allowed, f"{requests}: scheduler bound to {decided}, model allowed {allowed}"
            else:
                seen["unschedulable"] += 1
                assert not allowed, f"{requests}: scheduler found no node, model allowed {allowed}"
                cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", plain_namespace, "--wait=false")
        assert seen["bound"] >= 5 and seen["unschedulable"] >= 3, f"the stream must exercise both answers: {seen}"
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", plain_namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *(s[0] for s in SHAPES), "--wait=false", check=False)


@pytest.mark.parametrize(
    "required_terms",
    [
        pytest.param(None, id="no-affinity-of-its-own"),
        pytest.param([{"matchExpressions": [kube.requirement(NAMES.nvlink_domain_size, "Gt", "1")]}],
                     id="with-a-required-term"),
    ],
)
def test_one_patch_pins_and_ungates_and_the_pod_binds_there(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, required_terms: list[dict[str, Any]] | None
) -> None:
    """patches.release: our pin and the removal of our gate in one JSON patch, as the release controller sends
    it (guarded by the resourceVersion test), is accepted while the pod is gated, and the pod binds there."""
    cluster = gpu_cluster.cluster
    target = "kwok-8g2d-2"
    pod = kube.pod("solo", namespace=plain_namespace, gpus=2, gates=[NAMES.gate], required_terms=required_terms)
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False).returncode == 0
    stale = cluster.kubectl_json("get", "pod", "solo", "-n", plain_namespace)
    # Another writer changes the pod (its resourceVersion moves on): a release planned on the stale read, as a
    # second replica with an older view would send it, is refused whole by its resourceVersion test.
    cluster.kubectl("annotate", "pod", "solo", "-n", plain_namespace, "example.com/touched=yes")
    refused = cluster.kubectl("patch", "pod", "solo", "-n", plain_namespace, "--type=json", "-p",
                              json.dumps(patches.release(stale, gate=NAMES.gate, node="kwok-8g2d-3")), check=False)
    assert refused.returncode != 0, refused.stdout
    still = cluster.kubectl_json("get", "pod", "solo", "-n", plain_namespace)
    assert kube.gates(still) == [NAMES.gate] and snapshot.pinned_node(still) is None, "nothing of it applied"

    ops = patches.release(still, gate=NAMES.gate, node=target)
    assert ops[0]["op"] == "test" and any(o["op"] == "remove" for o in ops)
    done = cluster.kubectl("patch", "pod", "solo", "-n", plain_namespace, "--type=json", "-p", json.dumps(ops),
                           check=False)
    assert done.returncode == 0, done.stderr
    bound = kube.poll("bound", lambda: cluster.kubectl_json("get", "pod", "solo", "-n", plain_namespace)["spec"]
                      .get("nodeName"))
    assert bound == target
    assert snapshot.pinned_node(cluster.kubectl_json("get", "pod", "solo", "-n", plain_namespace)) == target
