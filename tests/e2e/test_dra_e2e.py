"""GPUs that are DRA devices, on the real control plane (Kubernetes 1.37.2, kwok nodes, no driver, no kubelet).

A DeviceClass `gpu.nvidia.com` (NVIDIA's selector) serving `nvidia.com/gpu`, and two kwok nodes with no
`nvidia.com/gpu` in their allocatable, each with a ResourceSlice of 8 GPU devices (`index` 0-7; NVLink domains 0-3
and 4-7 from the labeler's labels). The facts the model relies on are read from the API server: kube-scheduler
allocates an extended-resource pod's devices in a claim it makes, a template-claim pod's in the claim made from the
template, both with `reservedFor` the pod; the model built from the live cluster (as `kubectl get -o json` shows it)
counts each node's 8 GPUs and reads each pod's devices from its claim. Then our webhook gates such pods for release
and our descheduler releases them onto a DRA node, where they run (before, they waited out
`descheduler.gangs.max_wait_seconds` and were released unplaced: no node of the model had GPUs).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import dra, settings, snapshot, snapshot_build
from descheduler import leader, unschedulable
from descheduler.reclaim import pending
from gpu_steward_lab import dra_devices, localcluster
from tests import builders
from tests.e2e import conftest
from tests.support import kube, prometheus

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
TAINT = {"key": "e2e.gpu-steward.io/dra", "value": "true", "effect": "NoSchedule"}
DRA_KINDS = "deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates"


@pytest.fixture
def dra_nodes(control_plane: localcluster.LocalCluster) -> Iterator[tuple[str, list[str]]]:
    """(pool label value, node names): two 8-GPU DRA nodes, tainted so only this test's pods go there."""
    pool = f"dra-{secrets.token_hex(3)}"
    nodes = []
    for i in range(2):
        node = dra_devices.without_device_plugin(localcluster.gpu_node(
            f"{pool}-{i}", gpus=8, domains=2, product="NVIDIA-H100-80GB-HBM3", names=NAMES, cpu="64", memory="512Gi"))
        node["metadata"]["labels"]["e2e.gpu-steward.io/pool"] = pool
        node["spec"]["taints"] = [TAINT]
        nodes.append(node)
    names = control_plane.add_nodes(nodes)
    control_plane.apply([builders.device_class(), *(builders.resource_slice(n, 8) for n in names)])
    try:
        yield pool, names
    finally:
        for name in names:
            control_plane.kubectl("delete", "resourceslice", f"{name}-gpu.nvidia.com-1", "--ignore-not-found",
                                  check=False)
            control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
        control_plane.kubectl("delete", "deviceclass", "gpu.nvidia.com", "--ignore-not-found", check=False)


def _pod(name: str, *, namespace: str, pool: str, gpus: int = 0, template: str | None = None,
         gates: tuple[str, ...] = ()) -> dict[str, Any]:
    body = kube.pod(name, namespace=namespace, gpus=gpus, node_selector={"e2e.gpu-steward.io/pool": pool},
                    gates=gates)
    body["spec"]["tolerations"] = [{**TAINT, "operator": "Equal"}]
    if template:
        body["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return body


def _state(cluster: localcluster.LocalCluster) -> snapshot.Snapshot:
    """The model as the descheduler builds it, from the live cluster's objects (DRA ones included)."""
    state = kube.cluster_state(cluster)
    state["items"] += cluster.kubectl_json("get", DRA_KINDS, "-A")["items"]
    return snapshot_build.from_list(state, names=NAMES, taken_at=time.time())


def _allocation(cluster: localcluster.LocalCluster, namespace: str, claim: str) -> tuple[list[int], list[str]]:
    """The GPU indices (device gpu-<i>) allocated to the claim, and the names of the pods it is reserved for."""
    got = cluster.kubectl_json("get", "resourceclaim", claim, "-n", namespace)
    results = ((got.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return (sorted(int(r["device"].removeprefix("gpu-")) for r in results),
            [r["name"] for r in (got.get("status") or {}).get("reservedFor") or []])


def _claim_of(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    made = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses") or () if s.get("resourceClaimName")]
    return str(extended or (made[0] if made else ""))


def _running(cluster: localcluster.LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    return kube.poll(f"{name} running with its claim allocated", lambda: (
        pod if (pod := kube.pods(cluster, namespace).get(name)) and (pod.get("status") or {}).get("phase") == "Running"
        and _claim_of(pod) else None), timeout_seconds=60)


def test_the_model_reads_dra_gpus_and_each_pods_devices_from_its_claim(
        control_plane: localcluster.LocalCluster, dra_nodes: tuple[str, list[str]], plain_namespace: str) -> None:
    pool, nodes = dra_nodes
    control_plane.apply([builders.claim_template("two", namespace=plain_namespace, spec=builders.claim_spec(2))])
    control_plane.apply([_pod("ext-4", namespace=plain_namespace, pool=pool, gpus=4)])
    ext = _running(control_plane, plain_namespace, "ext-4")
    control_plane.apply([_pod("tpl-2", namespace=plain_namespace, pool=pool, template="two")])
    tpl = _running(control_plane, plain_namespace, "tpl-2")

    ext_devices, ext_users = _allocation(control_plane, plain_namespace, _claim_of(ext))
    tpl_devices, tpl_users = _allocation(control_plane, plain_namespace, _claim_of(tpl))
    assert (len(ext_devices), ext_users, len(tpl_devices), tpl_users) == (4, ["ext-4"], 2, ["tpl-2"])

    state = _state(control_plane)
    assert {n: state.nodes[n].gpu_count for n in nodes} == {n: 8 for n in nodes}, state.problems
    got = {name: (state.pods[f"{plain_namespace}/{name}"].gpu_indices,
                  state.pods[f"{plain_namespace}/{name}"].indices_observed,
                  state.pods[f"{plain_namespace}/{name}"].request.full) for name in ("ext-4", "tpl-2")}
    assert got == {"ext-4": (tuple(ext_devices), True, 4), "tpl-2": (tuple(tpl_devices), True, 2)}
    used = sum(8 - state.nodes[n].free_gpus for n in nodes)
    assert used == 6
    assert not [p for p in state.problems if "dra" in p.lower() or "pool" in p], state.problems
    assert isinstance(state.dra, dra.Inventory) and state.dra.served


@pytest.fixture
def renew(control_plane: localcluster.LocalCluster, webhook: conftest.WebhookServer) -> Iterator[Callable[[], None]]:
    """Renews the leader Lease the webhook watches (the descheduler under test leads on a Lease of its own name):
    while the webhook sees renewals it gates governed pods for release. Deleted after."""
    election = webhook.settings.descheduler.leader_election
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": election.lease_namespace}}])

    def write() -> None:
        control_plane.apply([{
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": election.lease_name, "namespace": election.lease_namespace},
            "spec": {"holderIdentity": "e2e-dra", "renewTime": leader.micro_time(time.time()),
                     "leaseDurationSeconds": int(election.lease_duration_seconds)},
        }])

    yield write
    control_plane.kubectl("delete", "lease", election.lease_name, "-n", election.lease_namespace,
                          "--ignore-not-found", check=False)


def test_dra_gpu_pods_are_gated_released_onto_a_dra_node_and_run(
        control_plane: localcluster.LocalCluster, dra_nodes: tuple[str, list[str]], namespace: str,
        renew: Callable[[], None], descheduler_factory: conftest.StartDescheduler) -> None:
    pool, nodes = dra_nodes
    descheduler_factory({})
    control_plane.apply([builders.claim_template("four", namespace=namespace, spec=builders.claim_spec(4))])

    def decided(name: str, **kw: Any) -> str:
        probe = control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                      input=json.dumps(_pod(name, namespace=namespace, pool=pool, **kw)))
        return str((json.loads(probe.stdout)["metadata"].get("annotations") or {}).get(NAMES.decision, ""))

    for name, kw in (("ext-4", {"gpus": 4}), ("tpl-4", {"template": "four"})):
        # The webhook reads the template (and sees the controller alive) through its feeder: wait until it gates.
        record = kube.poll(f"the webhook gates {name} for release", lambda kw=kw, name=name: (
            r if (renew(), f"gate {NAMES.gate} added: placed at release" in (r := decided(name, **kw)))[1] else None),
            timeout_seconds=60, interval_seconds=1)
        assert "4 GPU" in record, record
        control_plane.apply([_pod(name, namespace=namespace, pool=pool, **kw)])
        pod = _running(control_plane, namespace, name)
        assert pod["spec"]["nodeName"] in nodes and not kube.gates(pod)
        devices, users = _allocation(control_plane, namespace, _claim_of(pod))
        assert (len(devices), users) == (4, [name])


def _unschedulable_message(cluster: localcluster.LocalCluster, namespace: str, name: str) -> str:
    def message() -> str | None:
        pod = kube.pods(cluster, namespace).get(name) or {}
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message") or "")
        return None
    return str(kube.poll(f"{name} Unschedulable", message, timeout_seconds=60))


def test_a_pod_short_of_dra_gpus_is_a_reclaim_demand_and_one_short_of_its_own_claim_is_not(
        control_plane: localcluster.LocalCluster, dra_nodes: tuple[str, list[str]], plain_namespace: str) -> None:
    """On full DRA nodes kube-scheduler says only `cannot allocate all claims`: for a pod asking `nvidia.com/gpu`
    alone that is a GPU shortage (a reclaim demand); for a pod with a claim of its own (control) it is not."""
    pool, _ = dra_nodes
    control_plane.apply([builders.claim_template("one", namespace=plain_namespace, spec=builders.claim_spec(1))])
    for i in range(2):
        control_plane.apply([_pod(f"full-{i}", namespace=plain_namespace, pool=pool, gpus=8)])
        _running(control_plane, plain_namespace, f"full-{i}")
    control_plane.apply([_pod("wants-4", namespace=plain_namespace, pool=pool, gpus=4),
                         _pod("wants-claim", namespace=plain_namespace, pool=pool, template="one")])
    messages = {n: _unschedulable_message(control_plane, plain_namespace, n) for n in ("wants-4", "wants-claim")}
    assert all(f"2 {unschedulable.DRA_SHORT}" in m for m in messages.values()), messages

    demands = {d.key: d for d in pending.demands_from_snapshot(_state(control_plane), names=NAMES)}
    wants, claimed = demands[f"{plain_namespace}/wants-4"], demands[f"{plain_namespace}/wants-claim"]
    assert (wants.ignored, wants.members[0].request.full) == (None, 4), messages["wants-4"]
    assert claimed.ignored and "resourceClaims" in claimed.ignored, claimed.ignored


DRA_RECLAIMABLE = "e2e-dra-reclaimable"
IDLE_WINDOW_SECONDS, THRESHOLD_PERCENT, AHEAD_SECONDS = 10, 5, 300


def _dra_series(cluster: localcluster.LocalCluster, namespace: str, busy: dict[str, float],
                ) -> list[prometheus.Series]:
    """`DCGM_FI_DEV_GPU_UTIL` per DRA device of each running pod, labelled as dcgm-exporter 4.8.4 labels a
    DRA-allocated GPU (its pod, and the claim and device); 1 % unless `busy` gives a pod's first device a value."""
    series = []
    for name, pod in kube.pods(cluster, namespace).items():
        node, claim = pod["spec"].get("nodeName"), _claim_of(pod)
        if not node or not claim:
            continue
        for i, index in enumerate(_allocation(cluster, namespace, claim)[0]):
            value = busy.get(name, 1.0) if i == 0 else 1.0
            labels = {"gpu": str(index), "UUID": f"GPU-{node}-{index}", "device": f"nvidia{index}",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node, "container": "main",
                      "namespace": namespace, "pod": name, "dra_claim_name": claim, "dra_claim_namespace": namespace,
                      "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": node, "dra_device_name": f"gpu-{index}"}
            series.append(prometheus.Series("DCGM_FI_DEV_GPU_UTIL", labels,
                                            [(float(ago), value) for ago in range(420)]))
    return series


def test_an_idle_dra_pod_is_reclaimed_for_a_dra_demand_and_one_busy_on_one_gpu_is_not(
        control_plane: localcluster.LocalCluster, dra_nodes: tuple[str, list[str]], plain_namespace: str,
        descheduler_factory: conftest.StartDescheduler, prometheus_factory: prometheus.StartPrometheus) -> None:
    pool, nodes = dra_nodes
    control_plane.apply([kube.priority_class(DRA_RECLAIMABLE, value=1000,
                                             reclaim=(IDLE_WINDOW_SECONDS, THRESHOLD_PERCENT))])

    def reclaimable(name: str, node: str | None = None) -> dict[str, Any]:
        body = _pod(name, namespace=plain_namespace, pool=pool, gpus=8)
        body["spec"]["priorityClassName"] = DRA_RECLAIMABLE
        if node:
            body["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
        return body

    try:
        control_plane.apply([reclaimable("idle", nodes[0]), reclaimable("busy", nodes[1])])
        for name in ("idle", "busy"):
            _running(control_plane, plain_namespace, name)
        dcgm = prometheus_factory(_dra_series(control_plane, plain_namespace, {"busy": 90.0}),
                                  now=time.time() + AHEAD_SECONDS)
        descheduler = descheduler_factory({
            "prometheus": {"url": dcgm.url, "occupancy_refresh_seconds": 1},
            "descheduler": {"reclaim": {"cooldowns": {"node_seconds": 0, "workload_seconds": 0},
                                        "conventions": {"evict_bare_pods": True}}},
        })
        # Of the same priority: kube-scheduler cannot preempt for it; it reads `cannot allocate all claims`.
        control_plane.apply([reclaimable("want")])
        want = kube.poll("want bound where the idle DRA pod was", lambda: (
            p if (p := kube.pods(control_plane, plain_namespace).get("want")) and p["spec"].get("nodeName")
            else None), timeout_seconds=90)
        # A second demand only the busy pod's GPUs could serve (were one of its 8 GPUs not at 90 %): three cycles
        # decide it, none evicting for it.
        control_plane.apply([reclaimable("want-2")])
        told = f"reclaim demand {plain_namespace}/want-2 "
        said = kube.poll("three cycles on want-2", lambda: (
            lines if len(lines := [x for x in descheduler.process.log_file.read_text(errors="replace").splitlines()
                                   if told in x]) >= 3 else None), timeout_seconds=60)
        pods = kube.pods(control_plane, plain_namespace)
        log = descheduler.process.log_file.read_text(errors="replace")
        assert want["spec"]["nodeName"] == nodes[0], log[-3000:]
        # "no node can hold it" and each node's reason (the session's other nodes first), or, with no other node,
        # "no node with reclaimable idle GPUs fits it": never an eviction.
        assert all(": no node " in x and "evicted" not in x for x in said), said
        assert not pods["want-2"]["spec"].get("nodeName")
        assert "idle" not in pods or pods["idle"]["metadata"].get("deletionTimestamp"), sorted(pods)
        assert "busy" in pods and not pods["busy"]["metadata"].get("deletionTimestamp")
        reasons = {(e["reason"], e["involvedObject"]["name"]) for e in kube.events(control_plane, plain_namespace)}
        assert ("IdleGPUReclaimed", "idle") in reasons and ("IdleGPUReclaimed", "busy") not in reasons, reasons
    finally:
        control_plane.kubectl("delete", "priorityclass", DRA_RECLAIMABLE, "--ignore-not-found", check=False)
