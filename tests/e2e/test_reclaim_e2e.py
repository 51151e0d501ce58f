"""Idle-GPU reclaim end to end: the real descheduler process reads DCGM history from a real
Prometheus (backfilled with promtool, labelled like dcgm-exporter output for the pods' real names and
nodes), evicts an idle pod through the real Eviction API for a pending pod of equal priority (which
the scheduler itself may not preempt); it never tries an idle pod its PodDisruptionBudget keeps (the
budget is in its plan), and never evicts for a pod whose own anti-affinity kube-scheduler's "Insufficient
nvidia.com/gpu" hides (reclaim evaluates it: the pod it selects holds the node); the Events it posts are
listed by `kubectl get events`.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common import gpu, settings
from descheduler import unschedulable
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube, prometheus

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]

NAMES = settings.Names()
RECLAIMABLE = "e2e-reclaimable"
PRIORITY = 1000
IDLE_WINDOW_SECONDS = 10
THRESHOLD_PERCENT = 5
IDLE_UTILISATION = 1.0  # percent, on every GPU of both idle pods
HISTORY_SECONDS = 120  # DCGM history before the test starts ...
AHEAD_SECONDS = 300  # ... and written ahead of it, so the idle window is covered whenever the cycle runs
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture
def reclaimable_class(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    """A PriorityClass whose idle pods may go to pending pods of its own priority after a short window."""
    control_plane.apply([kube.priority_class(RECLAIMABLE, value=PRIORITY,
                                             reclaim=(IDLE_WINDOW_SECONDS, THRESHOLD_PERCENT))])
    yield RECLAIMABLE
    control_plane.kubectl("delete", "priorityclass", RECLAIMABLE, "--ignore-not-found", check=False)


def pinned_pod(name: str, *, namespace: str, node: str, labels: dict[str, str] | None = None,
               gpus: int = 2) -> dict[str, Any]:
    """A pod of the reclaimable class (2 GPUs by default) that may only run on `node`."""
    return kube.pod(name, namespace=namespace, gpus=gpus, labels=labels, priority_class=RECLAIMABLE,
                    node_selector={HOSTNAME: node})


def apart_from(pod: dict[str, Any], app: str) -> dict[str, Any]:
    """`pod` with a required anti-affinity to the pods of `app` on the same node."""
    pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}]}}
    return pod


def dcgm_history(cluster: localcluster.LocalCluster, namespace: str) -> list[prometheus.Series]:
    """`DCGM_FI_DEV_GPU_UTIL` per GPU of each running pod of the namespace, labelled as dcgm-exporter does,
    the GPU indices as the device-plugin stand-in assigns them."""
    view = kube.GpuView.of(cluster, names=NAMES)
    samples = [(float(ago), IDLE_UTILISATION) for ago in range(HISTORY_SECONDS + AHEAD_SECONDS)]
    series = []
    for pod in view.state.pods.values():
        if pod.namespace != namespace or not pod.node_name:
            continue
        for index in view.indices(pod):
            labels = {
                "gpu": str(index),
                "UUID": f"GPU-{pod.node_name}-{index}",
                "device": f"nvidia{index}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": pod.node_name,
                "container": "main",
                "namespace": pod.namespace,
                "pod": pod.name,
            }
            series.append(prometheus.Series("DCGM_FI_DEV_GPU_UTIL", labels, samples))
    return series


def phase_is(cluster: localcluster.LocalCluster, namespace: str, name: str, phase: str) -> Callable[[], bool]:
    return lambda: bool(kube.pods(cluster, namespace).get(name, {}).get("status", {}).get("phase") == phase)


def test_idle_pod_is_evicted_for_a_pending_pod_and_neither_a_budget_nor_hidden_anti_affinity_is_evicted_for(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler,
    prometheus_factory: prometheus.StartPrometheus,
    reclaimable_class: str,
    namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    free_node, guarded_node = sorted(
        n["metadata"]["name"] for n in gpu_cluster.nodes if n["status"]["capacity"].get(gpu.FULL_GPU) == "2"
    )[:2]
    shared_node = sorted(
        n["metadata"]["name"] for n in gpu_cluster.nodes if n["status"]["capacity"].get(gpu.FULL_GPU) == "8")[0]
    # Two idle pods, each filling a 2-GPU node; a PodDisruptionBudget guards the second. An 8-GPU node holds an
    # idle pod and a database pod (opted out of reclaim) of 4 GPUs each.
    for pod in (
        pinned_pod("idle-free", namespace=namespace, node=free_node),
        pinned_pod("idle-guarded", namespace=namespace, node=guarded_node, labels={"app": "guarded"}),
        kube.pod_disruption_budget("guard", namespace=namespace, match_labels={"app": "guarded"}, min_available=1),
        pinned_pod("idle-near", namespace=namespace, node=shared_node, gpus=4),
        # Of the same priority as the pending pods, so that kube-scheduler cannot preempt it for them either.
        kube.pod("db", namespace=namespace, gpus=4, labels={"app": "db"}, annotations={NAMES.skip: "true"},
                 priority_class=RECLAIMABLE, node_selector={HOSTNAME: shared_node}),
    ):
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    for name in ("idle-free", "idle-guarded", "idle-near", "db"):
        kube.poll(f"{name} running", phase_is(cluster, namespace, name, "Running"))
    cluster.kubectl("wait", "--for=jsonpath={.status.currentHealthy}=1", "pdb/guard", "-n", namespace, "--timeout=30s")
    dcgm = prometheus_factory(dcgm_history(cluster, namespace), now=time.time() + AHEAD_SECONDS)
    descheduler = descheduler_factory({
        "prometheus": {"url": dcgm.url, "occupancy_refresh_seconds": 1},
        "descheduler": {"reclaim": {"cooldowns": {"node_seconds": 0, "workload_seconds": 0},
                                    "conventions": {"evict_bare_pods": True}}},  # the test's pods are bare
    })
    # A pending pod of the same priority for each node: the scheduler cannot preempt for them. The one for
    # the shared node must not run beside the database: its anti-affinity, not GPUs, keeps it off that node.
    for pod in (pinned_pod("want-free", namespace=namespace, node=free_node),
                pinned_pod("want-guarded", namespace=namespace, node=guarded_node),
                apart_from(pinned_pod("want-apart", namespace=namespace, node=shared_node, gpus=4), "db")):
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    said = {
        "want-guarded": f"PodDisruptionBudget {namespace}/guard allows 0 disruption(s); evicting {namespace}/"
                        "idle-guarded needs 1",
        # Its nodeSelector rules every other node out; which nodes the reason lists first depends on their names.
        "want-apart": "no node can hold it: ",
    }

    def outcome() -> dict[str, dict[str, Any]] | None:
        pods = kube.pods(cluster, namespace)
        log = descheduler.process.log_file.read_text(errors="replace")
        told = all(f"reclaim demand {namespace}/{name} " in log and why in log for name, why in said.items())
        return pods if "idle-free" not in pods and pods["want-free"]["spec"].get("nodeName") and told else None

    try:
        pods = kube.poll("idle-free evicted, want-free bound, the budget and the anti-affinity told",
                         outcome, timeout_seconds=60)
    except AssertionError as exc:
        seen = sorted((e["involvedObject"]["name"], e["reason"]) for e in kube.events(cluster, namespace))
        raise AssertionError(f"{exc}\npods: {sorted(kube.pods(cluster, namespace))}\nevents: {seen}\n"
                             "last said of each demand:\n"
                             f"{last_said(descheduler.process.log_file.read_text(errors='replace'))}") from None

    # The scheduler itself found no room for any of them and could not preempt (equal priority); its Event
    # stays when want-free is bound later. For want-apart it names the GPUs only: the anti-affinity is hidden.
    for name in ("want-free", "want-guarded", "want-apart"):
        failed = functools.partial(kube.events_about, cluster, namespace, name, reason="FailedScheduling")
        told = kube.poll(f"FailedScheduling for {name}", failed)
        assert "Insufficient nvidia.com/gpu" in told[0]["message"], told
    assert pods["want-free"]["spec"]["nodeName"] == free_node
    for kept in ("idle-guarded", "idle-near", "db"):
        assert kept in pods and not pods[kept]["metadata"].get("deletionTimestamp"), kept
    assert not pods["want-guarded"]["spec"].get("nodeName")
    assert not pods["want-apart"]["spec"].get("nodeName")
    reason = (f"peak GPU utilisation {IDLE_UTILISATION:.1f}% < {THRESHOLD_PERCENT}% over {IDLE_WINDOW_SECONDS}s; "
              f"reclaimed for {namespace}/want-free (priority {PRIORITY})")
    listed = {
        (e["type"], e["reason"], e["involvedObject"]["name"], e["message"])
        for e in kube.events(cluster, namespace)
        if e["reason"] in ("IdleGPUReclaimed", "GPUReclaimTriggered", "EvictionBlocked")
    }
    assert ("Normal", "IdleGPUReclaimed", "idle-free", f"Evicted: {reason}") in listed, listed
    assert ("Normal", "GPUReclaimTriggered", "want-free",
            f"Evicted 1 idle GPU pod(s) for this pod (priority {PRIORITY}): {namespace}/idle-free") in listed, listed
    # The guarded pod was never tried (its budget is in the plan): no refused eviction to report.
    assert {(t, r, o) for t, r, o, _ in listed} == {
        ("Normal", "IdleGPUReclaimed", "idle-free"),
        ("Normal", "GPUReclaimTriggered", "want-free"),
    }


def last_said(log: str) -> str:
    """The last log line about each reclaim demand (the descheduler says each one every cycle)."""
    last: dict[str, str] = {}
    for line in log.splitlines():
        if "reclaim demand " in line:
            last[line.split("reclaim demand ", 1)[1].split(" ", 1)[0]] = line
        elif "WARNING" in line or "ERROR" in line:
            last[line] = line
    return "\n".join(last.values())


def unschedulable_message(cluster: localcluster.LocalCluster, namespace: str, name: str) -> str | None:
    for condition in (kube.pods(cluster, namespace).get(name, {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "") or None
    return None


def test_kube_scheduler_messages_read_as_demands_or_not(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str,
) -> None:
    """The scheduler's own Unschedulable messages on 1.37: a pod short of GPUs only is a reclaim demand; one
    short of CPU too is not (freeing GPUs would not let it run)."""
    cluster = gpu_cluster.cluster
    too_many_gpus = kube.pod("gpus-only", namespace=plain_namespace, gpus=64)
    cpu_too = kube.pod("cpu-too", namespace=plain_namespace, gpus=64)
    cpu_too["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100000"
    for pod in (too_many_gpus, cpu_too):
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    gpus_only = kube.poll("gpus-only unschedulable",
                          lambda: unschedulable_message(cluster, plain_namespace, "gpus-only"))
    both = kube.poll("cpu-too unschedulable", lambda: unschedulable_message(cluster, plain_namespace, "cpu-too"))
    read = unschedulable.read(gpus_only, claims_are_gpus=False)
    assert read is not None and read.gpu_short and not read.other, gpus_only
    assert unschedulable.why_not_a_demand(gpus_only, claims_are_gpus=False) is None, gpus_only
    said = unschedulable.why_not_a_demand(both, claims_are_gpus=False)
    assert said is not None and said.startswith("kube-scheduler reports more than a GPU shortage ("), both
    assert "Insufficient cpu" in said, both


@pytest.fixture
def two_nodes(control_plane: localcluster.LocalCluster) -> Iterator[tuple[str, str]]:
    """Two 8-GPU kwok nodes of the test's own (no other test's pods land there), deleted after."""
    nodes = localcluster.gpu_nodes("2x8g2d", names=NAMES, name_prefix=f"apart-{secrets.token_hex(3)}")
    control_plane.add_nodes(nodes)
    names = tuple(str(n["metadata"]["name"]) for n in nodes)
    try:
        yield names[0], names[1]
    finally:
        for name in names:
            control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_replica_apart_from_its_sibling_gets_idle_gpus_on_another_node(
    gpu_cluster: conftest.GpuCluster,
    two_nodes: tuple[str, str],
    webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler,
    prometheus_factory: prometheus.StartPrometheus,
    reclaimable_class: str,
    namespace: str,
) -> None:
    """One replica per node (issue 29, item 8): the pending replica's required anti-affinity keeps it off node x,
    where its sibling runs and evicting 2 idle GPUs would be cheapest; reclaim evicts on y instead (4 idle GPUs),
    and kube-scheduler binds the replica there: the model's reading of the rule is the scheduler's."""
    cluster = gpu_cluster.cluster
    x, y = two_nodes
    kept = {NAMES.skip: "true"}  # busy in the store too, but opted out: never a victim
    for pod in (
        kube.pod("serve-1", namespace=namespace, gpus=4, labels={"app": "serve"}, annotations=kept,
                 priority_class=RECLAIMABLE, node_selector={HOSTNAME: x}),
        pinned_pod("idle-x", namespace=namespace, node=x),
        kube.pod("filler-x", namespace=namespace, gpus=2, annotations=kept, priority_class=RECLAIMABLE,
                 node_selector={HOSTNAME: x}),
        pinned_pod("idle-y", namespace=namespace, node=y, gpus=4),
        kube.pod("filler-y", namespace=namespace, gpus=4, annotations=kept, priority_class=RECLAIMABLE,
                 node_selector={HOSTNAME: y}),
    ):
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    for name in ("serve-1", "idle-x", "filler-x", "idle-y", "filler-y"):
        kube.poll(f"{name} running", phase_is(cluster, namespace, name, "Running"))
    dcgm = prometheus_factory(dcgm_history(cluster, namespace), now=time.time() + AHEAD_SECONDS)
    descheduler = descheduler_factory({
        "prometheus": {"url": dcgm.url, "occupancy_refresh_seconds": 1},
        "descheduler": {"reclaim": {"cooldowns": {"node_seconds": 0, "workload_seconds": 0},
                                    "conventions": {"evict_bare_pods": True}}},  # the test's pods are bare
    })
    replica = kube.pod("serve-2", namespace=namespace, gpus=2, labels={"app": "serve"}, priority_class=RECLAIMABLE,
                       required_terms=[{"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [x, y]}]}])
    replica["spec"]["affinity"]["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "serve"}}, "topologyKey": HOSTNAME}]}
    cluster.kubectl("create", "-f", "-", input=json.dumps(replica))

    def bound() -> dict[str, dict[str, Any]] | None:
        pods = kube.pods(cluster, namespace)
        return pods if pods.get("serve-2", {}).get("spec", {}).get("nodeName") else None

    try:
        pods = kube.poll("serve-2 bound after a reclaim", bound, timeout_seconds=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\npods: {sorted(kube.pods(cluster, namespace))}\nlast said of each demand:\n"
                             f"{last_said(descheduler.process.log_file.read_text(errors='replace'))}") from None
    assert pods["serve-2"]["spec"]["nodeName"] == y
    assert "idle-y" not in pods or pods["idle-y"]["metadata"].get("deletionTimestamp"), sorted(pods)
    assert "idle-x" in pods and not pods["idle-x"]["metadata"].get("deletionTimestamp"), sorted(pods)
    failed = kube.poll("FailedScheduling for serve-2",
                       functools.partial(kube.events_about, cluster, namespace, "serve-2", reason="FailedScheduling"))
    assert "Insufficient nvidia.com/gpu" in failed[0]["message"], failed
