"""Our gangs bound all-or-nothing by kube-scheduler (issue 28; `descheduler.gangs.native_binding`, on by default),
on the session's 1.37.2 control plane (`scheduling.k8s.io/v1beta1` served, `GenericWorkload` on): the webhook names
the gang's own PodGroup in each member's `spec.schedulingGroup`, and every path that lifts our gate creates it
first, else the members would wait in kube-scheduler's queue for ever
(tests/e2e/test_native_gang_binding_facts_e2e.py). One row per path:

- release (the descheduler, a complete gang that fits): the PodGroup has a gang policy of minCount = the members,
  their PriorityClass, the members as owners (the garbage collector deletes it with them), and the members bind;
- release at the gang's bound (`gang_max_wait_seconds`, a gang that fits nowhere): released unplaced, the
  PodGroup is made, none binds while there is no room and both once there is;
- `gpu-steward release-gates` (uninstall) on an incomplete gang: the PodGroup is made with minCount = the members
  there are (not the gang's size: they would wait for members never created), and they bind;
- the webhook's gate lifter (the descheduler gone for good): the same.

And one fact of Kubernetes the design relies on instead of machinery of its own: a PodGroup its pods still name
is not deleted while they exist (kube-controller-manager's `scheduling.k8s.io/podgroup-protection` finalizer), so a
user or a cleanup tool deleting a released gang's PodGroup cannot leave its members held in kube-scheduler's queue
for ever (a pod naming a PodGroup that does not exist is: tests/e2e/test_native_gang_binding_facts_e2e.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
from typing import Any

import pytest

from common import gangs, settings
from gpu_steward_lab import localcluster
from tests.e2e import conftest, test_gate_lifter_e2e
from tests.e2e import test_release_gates_e2e as release_gates_e2e
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
GANG_ONLY = {"descheduler": {"reclaim": {"enabled": False}}}


def member(name: str, namespace: str, gang: str, size: int, *, gpus: int = 2, gated_by_us: bool = False,
           pool: str | None = None) -> dict[str, Any]:
    """A member of our gang; `gated_by_us`: as our webhook would admit it (gate and own PodGroup) in a namespace
    it does not see."""
    pod = kube.pod(name, namespace=namespace, gpus=gpus, labels={NAMES.gang_name: gang, NAMES.gang_size: str(size)},
                   gates=[NAMES.gate] if gated_by_us else (), node_selector={"e2e-pool": pool} if pool else None)
    if gated_by_us:
        pod["spec"]["schedulingGroup"] = {"podGroupName": gangs.own_pod_group(gang, None)}
    return pod


def create(cluster: localcluster.LocalCluster, *pods: dict[str, Any]) -> None:
    for pod in pods:
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))


def pod_group(cluster: localcluster.LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    got = cluster.kubectl("get", "podgroups.v1beta1.scheduling.k8s.io", name, "-n", namespace, "-o", "json",
                          check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


def wait_bound(cluster: localcluster.LocalCluster, namespace: str, names: list[str]) -> dict[str, dict[str, Any]]:
    def bound() -> dict[str, dict[str, Any]] | None:
        pods = kube.pods(cluster, namespace)
        return pods if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names) else None

    try:
        return kube.poll(f"{names} bound", bound, timeout_seconds=60)
    except AssertionError as exc:
        events = [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in kube.events(cluster, namespace)]
        raise AssertionError(f"{exc}\n{json.dumps(events, indent=1)}") from None


def released_unplaced(cluster: localcluster.LocalCluster, namespace: str, names: list[str],
                      ) -> dict[str, dict[str, Any]]:
    """The pods once our gate is off all of `names` (released at the gang's bound: nowhere to nominate them)."""
    def released() -> dict[str, dict[str, Any]] | None:
        pods = kube.pods(cluster, namespace)
        return pods if all(n in pods and NAMES.gate not in kube.gates(pods[n]) for n in names) else None

    pods = kube.poll("released unplaced at its bound", released, timeout_seconds=60)
    assert not any(pods[n]["spec"].get("nodeName") for n in names)
    return pods


def assert_own_pod_group(cluster: localcluster.LocalCluster, namespace: str, pods: dict[str, dict[str, Any]],
                         names: list[str]) -> str:
    group = pods[names[0]]["spec"]["schedulingGroup"]["podGroupName"]
    assert all(pods[n]["spec"]["schedulingGroup"] == {"podGroupName": group} for n in names)
    made = pod_group(cluster, namespace, group)
    assert made is not None, f"PodGroup {group} not made"
    assert made["spec"]["schedulingPolicy"] == {"gang": {"minCount": len(names)}}
    assert sorted(o["name"] for o in made["metadata"]["ownerReferences"]) == sorted(names)
    assert made["spec"].get("priorityClassName") == pods[names[0]]["spec"].get("priorityClassName")
    return str(group)


def test_release_makes_the_gangs_pod_group_and_the_gang_binds(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler, namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    descheduler_factory(GANG_ONLY)
    names = ["w0", "w1"]
    create(cluster, *(member(n, namespace, "train", 2) for n in names))
    pods = wait_bound(cluster, namespace, names)
    group = assert_own_pod_group(cluster, namespace, pods, names)
    assert group == gangs.own_pod_group("train", pods["w0"]["spec"].get("priorityClassName"))
    assert f"PodGroup {group}: made at release" in pods["w0"]["metadata"]["annotations"][NAMES.decision]

    cluster.kubectl("delete", "pod", *names, "-n", namespace, "--grace-period=0")
    kube.poll(f"PodGroup {group} deleted by the garbage collector with its members",
              lambda: pod_group(cluster, namespace, group) is None, timeout_seconds=60)


def test_a_gang_released_unplaced_at_its_bound_binds_whole_once_there_is_room(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler, namespace: str, spare_node: str,
) -> None:
    cluster = gpu_cluster.cluster
    descheduler_factory({"descheduler": {"reclaim": {"enabled": False}, "gangs": {"gang_max_wait_seconds": 3}}})
    pool = f"e2e-pool-{secrets.token_hex(3)}"
    names = ["u0", "u1"]
    create(cluster, *(member(n, namespace, "unplaced", 2, pool=pool) for n in names))
    assert_own_pod_group(cluster, namespace, released_unplaced(cluster, namespace, names), names)
    cluster.kubectl("label", "node", spare_node, f"e2e-pool={pool}")
    assert {p["spec"]["nodeName"] for p in wait_bound(cluster, namespace, names).values()} == {spare_node}


def test_a_pod_group_deleted_while_its_gang_waits_is_kept_by_kubernetes_and_the_gang_binds(
    gpu_cluster: conftest.GpuCluster, webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler, namespace: str, spare_node: str,
) -> None:
    """Control: the deletion is accepted (deletionTimestamp set); what keeps the PodGroup is the protection
    finalizer, and the members bind on it, all or nothing, once there is room."""
    cluster = gpu_cluster.cluster
    descheduler_factory({"descheduler": {"reclaim": {"enabled": False}, "gangs": {"gang_max_wait_seconds": 3}}})
    pool = f"e2e-pool-{secrets.token_hex(3)}"
    names = ["d0", "d1"]
    create(cluster, *(member(n, namespace, "dropped", 2, pool=pool) for n in names))
    group = assert_own_pod_group(cluster, namespace, released_unplaced(cluster, namespace, names), names)
    cluster.kubectl("delete", "podgroups.v1beta1.scheduling.k8s.io", group, "-n", namespace, "--wait=false")
    kept = pod_group(cluster, namespace, group)
    assert kept is not None and kept["metadata"].get("deletionTimestamp"), kept
    assert kept["metadata"].get("finalizers") == ["scheduling.k8s.io/podgroup-protection"]
    cluster.kubectl("label", "node", spare_node, f"e2e-pool={pool}")
    assert {p["spec"]["nodeName"] for p in wait_bound(cluster, namespace, names).values()} == {spare_node}
    cluster.kubectl("delete", "pod", *names, "-n", namespace, "--grace-period=0")
    kube.poll(f"PodGroup {group} gone with its pods", lambda: pod_group(cluster, namespace, group) is None,
              timeout_seconds=60)


def test_release_gates_makes_an_incomplete_gangs_pod_group_for_the_members_there_are(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    names = ["r0", "r1"]  # of 3: the third was never created
    create(cluster, *(member(n, plain_namespace, "uninstall", 3, gated_by_us=True) for n in names))
    done = release_gates_e2e.release_gates(cluster, "-n", plain_namespace, "--output", "json")
    assert done.returncode == 0, done.stderr
    pods = wait_bound(cluster, plain_namespace, names)
    assert_own_pod_group(cluster, plain_namespace, pods, names)


def test_the_gate_lifter_makes_the_gangs_pod_group_before_lifting(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    descheduler = descheduler_factory(GANG_ONLY)
    os.kill(descheduler.process.pid or 0, signal.SIGKILL)  # for good: the Lease is never released nor renewed
    lifter = test_gate_lifter_e2e.start_lifter(cluster, tmp_path, descheduler.settings.descheduler.leader_election,
                                               gang_max_wait_seconds=3)
    try:
        names = ["l0", "l1"]  # of 3
        create(cluster, *(member(n, plain_namespace, "orphaned", 3, gated_by_us=True) for n in names))
        pods = wait_bound(cluster, plain_namespace, names)
        assert_own_pod_group(cluster, plain_namespace, pods, names)
    finally:
        lifter.stop()
