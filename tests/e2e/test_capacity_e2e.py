"""The one capacity model against the real kube-scheduler, and the release patch against the real API server.

Differential: on kwok nodes of odd shapes (few CPUs, little memory, few pod slots, 2-8 GPUs), a seeded random
stream of pods (GPUs, CPU, memory, with and without GPUs) is created one at a time. Before each, the model is
asked which nodes could take the pod now (`common.capacity`, read from the live cluster as the descheduler reads
it); then kube-scheduler decides. Bound => the node is one the model allowed; Unschedulable => the model allowed
none. Pods accumulate, so later pods meet fuller nodes.

The filters that read the pods already on a node (NodePorts, existing pods' required anti-affinity) get a
differential of their own: nodes in two zones (one a node without GPUs), a seeded stream of "guards" (pods with
required anti-affinity by hostname or zone, some with host ports; the model does not govern them) and of
candidates (GPU pods with labels and host ports, which it governs). For each candidate the model's allowed set
(`capacity.never_pod` and `Room.place_pod`) must contain the node kube-scheduler binds it to, and be empty when
kube-scheduler finds it unschedulable; and the stream must make both filters rule nodes out.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from common import capacity, fit, gpu, hostports, placement, resources, settings, snapshot_build
from gpu_steward_lab import localcluster
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
    snap = snapshot_build.from_list(state, names=NAMES, taken_at=0.0)
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


def _create_and_decide(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> str:
    """Create the pod and wait for kube-scheduler: the node it bound the pod to, or "" (unschedulable: then deleted,
    so the stream goes on)."""
    meta = pod["metadata"]
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False).returncode == 0
    decided = _decision(cluster, meta["namespace"], meta["name"])
    if not decided:
        cluster.kubectl("delete", "pod", meta["name"], "-n", meta["namespace"], "--wait=false")
    return decided


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
            decided = _create_and_decide(cluster, pod)
            requests = pod["spec"]["containers"][0]["resources"]["requests"]
            if decided:
                seen["bound"] += 1
                assert decided in allowed, f"{requests}: scheduler bound to {decided}, model allowed {allowed}"
            else:
                seen["unschedulable"] += 1
                assert not allowed, f"{requests}: scheduler found no node, model allowed {allowed}"
        assert seen["bound"] >= 5 and seen["unschedulable"] >= 3, f"the stream must exercise both answers: {seen}"
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", plain_namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *(s[0] for s in SHAPES), "--wait=false", check=False)


# The release's own calls (nominate, then un-gate) on the real API server: tests/e2e/test_release_nomination_e2e.py.


# --- host ports and existing pods' anti-affinity --------------------------------------------------------

FILTER_POOL = {"e2e.gpu-steward.io/pool": "filters"}
ZONE = "topology.kubernetes.io/zone"
FILTER_NODES = [  # name, GPUs (0: none), zone
    ("flt-a1", 4, "a"), ("flt-a2", 4, "a"), ("flt-b1", 4, "b"), ("flt-b2", 4, "b"), ("flt-cpu-a", 0, "a")]
FILTER_SEED = 20261125
FILTER_PODS = 36
APPS = ("web", "db", "batch")


def _filter_nodes() -> list[dict[str, Any]]:
    out = []
    for name, gpus, zone in FILTER_NODES:
        node = localcluster.gpu_node(name, gpus=gpus or 2, domains=1, product="NVIDIA-H100-80GB-HBM3", names=NAMES,
                                     cpu="8", memory="64Gi", pods=10)
        if not gpus:  # a node without GPUs: only its zone makes it matter
            for part in ("capacity", "allocatable"):
                del node["status"][part][gpu.FULL_GPU]
            labels = node["metadata"]["labels"]
            for key in [k for k in labels if k.startswith(("nvidia.com/", NAMES.prefix))]:
                del labels[key]
            node["metadata"]["annotations"].pop(NAMES.nvlink_topology, None)
        node["metadata"]["labels"].update({**FILTER_POOL, ZONE: zone})
        node["spec"]["taints"] = [TAINT]
        out.append(node)
    return out


def _filter_pod(rng: random.Random, name: str, namespace: str) -> tuple[dict[str, Any], bool]:
    """A guard (required anti-affinity of its own, no GPU) or a candidate (GPUs, host ports); True: a candidate."""
    is_guard = rng.random() < 0.3
    body = kube.pod(name, namespace=namespace, gpus=0 if is_guard else rng.choice([1, 1, 2]),
                    labels={"app": rng.choice(APPS)}, node_selector=FILTER_POOL)
    spec = body["spec"]
    spec["tolerations"] = [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    port = rng.choice([None, 8080, 8080, 8081])
    if port:
        entry: dict[str, Any] = {"containerPort": 80, "hostPort": port}
        if rng.random() < 0.3:
            entry["hostIP"] = rng.choice(["10.0.0.1", "10.0.0.2"])
        spec["containers"][0]["ports"] = [entry]
    if is_guard:
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": rng.choice(["kubernetes.io/hostname", "kubernetes.io/hostname", ZONE]),
            "labelSelector": {"matchLabels": {"app": rng.choice(APPS)}}}]}}
    return body, not is_guard


def _model_allows_pod(cluster: localcluster.LocalCluster, raw: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The nodes the model allows the pod now, and which of the two filters alone ruled out a node that every
    other filter and the free resources allowed ("host port", "anti-affinity")."""
    state = cluster.kubectl_json("get", "nodes,pods,namespaces", "-A")
    snap = snapshot_build.from_list(state, names=NAMES, taken_at=0.0)
    meta = raw["metadata"]
    pod = snapshot_build.build(nodes=[], pods=[raw], names=NAMES,
                               taken_at=None).pods[f"{meta['namespace']}/{meta['name']}"]
    allowed, refused = set(), set()
    for node in snap.nodes.values():
        if not node.name.startswith("flt-"):
            continue
        why = capacity.refuses(pod, node)
        if why and capacity.never(pod.raw["spec"], pod.requests, node) is None and isinstance(
                capacity.Room.of(node).place(pod.requests, pod.request, one_domain=False), placement.Allocation):
            refused.add("anti-affinity" if "anti-affinity" in why else "host port")
        if capacity.never_pod(pod, node) is None and isinstance(
                capacity.Room.of(node).place_pod(pod, one_domain=False), placement.Allocation):
            allowed.add(node.name)
    return allowed, refused


def test_host_ports_and_existing_anti_affinity_agree_with_kube_scheduler(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str
) -> None:
    cluster = gpu_cluster.cluster
    cluster.add_nodes(_filter_nodes())
    rng = random.Random(FILTER_SEED)
    seen = {"bound": 0, "unschedulable": 0, "host port": 0, "anti-affinity": 0}
    try:
        for i in range(FILTER_PODS):
            pod, judged = _filter_pod(rng, f"flt-{i:02d}", plain_namespace)
            name = pod["metadata"]["name"]
            assert (capacity.ungoverned(pod["spec"]) is None) == judged, "guards are left to kube-scheduler"
            allowed, refused = _model_allows_pod(cluster, pod) if judged else (set(), set())
            decided = _create_and_decide(cluster, pod)
            if not judged:
                continue
            for decisive in refused:
                seen[decisive] += 1
            what = f"{name} {pod['metadata']['labels']} ports {sorted(hostports.of_pod(pod))}; refused: {refused}"
            if decided:
                seen["bound"] += 1
                assert decided in allowed, f"{what}: scheduler bound to {decided}, model allowed {allowed}"
            else:
                seen["unschedulable"] += 1
                assert not allowed, f"{what}: scheduler found no node, model allowed {allowed}"
        assert min(seen.values()) >= 2, f"the stream must exercise every answer and both filters: {seen}"
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", plain_namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *(n[0] for n in FILTER_NODES), "--wait=false", check=False)

