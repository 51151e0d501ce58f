"""Gangs end to end: our webhook gates every member at creation (members without GPUs too), the real
descheduler process releases a gang only when all of it is present and can be placed at once, and the
real scheduler binds the members where the release pinned them — all of them, or none.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from common import gpu, settings
from descheduler.release import outcomes, planning
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
HOLD_SECONDS = 3  # how long a gang that must wait is watched to stay gated (descheduler resyncs every 1 s)
GANG_ONLY = {"descheduler": {"reclaim": {"enabled": False}}}  # nothing but gang release acts on the cluster


def create_members(
    cluster: localcluster.LocalCluster, namespace: str, gang: str, *, size: int, gpus: int, members: range
) -> None:
    labels = {NAMES.gang_name: gang, NAMES.gang_size: str(size)}
    for i in members:
        pod = kube.pod(f"{gang}-{i}", namespace=namespace, gpus=gpus, labels=labels)
        cluster.kubectl("create", "-f", "-", input=json.dumps(pod))


def gang(cluster: localcluster.LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    members = kube.pods(cluster, namespace).values()
    return sorted((p for p in members if (p["metadata"].get("labels") or {}).get(NAMES.gang_name) == name),
                  key=lambda p: p["metadata"]["name"])


def state(members: list[dict[str, Any]]) -> dict[str, tuple[bool, str | None]]:
    """Member -> (gated by us, node bound to)."""
    return {p["metadata"]["name"]: (NAMES.gate in kube.gates(p), p["spec"].get("nodeName")) for p in members}


def hold_gated(cluster: localcluster.LocalCluster, namespace: str, name: str, *, count: int) -> None:
    """For HOLD_SECONDS, every one of the gang's `count` members stays gated and unbound."""
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        seen = state(gang(cluster, namespace, name))
        assert len(seen) == count and all(g and n is None for g, n in seen.values()), f"released early: {seen}"
        time.sleep(0.25)


def waiting_told(
    cluster: localcluster.LocalCluster, namespace: str, name: str, *, count: int, says: re.Pattern[str]
) -> None:
    """Wait until each of the gang's first `count` members has a GangWaiting Event saying `says`."""
    told: dict[str, list[str]] = {}

    def every_member() -> bool:
        for i in range(count):
            told[f"{name}-{i}"] = [e["message"] for e in kube.events_about(
                cluster, namespace, f"{name}-{i}", reason="GangWaiting")]
        return all(any(says.fullmatch(m) for m in messages) for messages in told.values())

    try:
        kube.poll(f"GangWaiting on every member of {name} saying {says.pattern!r}", every_member)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ntold: {json.dumps(told, indent=1)}") from None


def bound_together(cluster: localcluster.LocalCluster, namespace: str, name: str, *, size: int) -> dict[str, str]:
    """Wait until every member is released and bound; return member -> node."""

    def all_bound() -> dict[str, str] | None:
        seen = state(gang(cluster, namespace, name))
        done = len(seen) == size and all(not g and n for g, n in seen.values())
        return {m: str(n) for m, (_, n) in seen.items()} if done else None

    return kube.poll(f"all {size} members of {name} bound", all_bound)


def domains_spanned(cluster: localcluster.LocalCluster, namespace: str) -> dict[str, int]:
    """Bound pod name -> NVLink domains its GPUs span."""
    view = kube.GpuView.of(cluster, names=NAMES)
    return {p.name: view.domains_spanned(p) for p in view.state.pods.values()
            if p.namespace == namespace and p.node_name}


def planned_node(pod: dict[str, Any]) -> str | None:
    """The node the release nominated the pod to, as its release record says (the API server clears
    `status.nominatedNodeName` on binding)."""
    raw = (pod["metadata"].get("annotations") or {}).get(NAMES.release)
    return outcomes.read(raw).node if raw is not None else None


def test_gang_stays_gated_until_complete_then_is_released_and_bound_together(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler,
    namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    descheduler_factory(GANG_ONLY)

    gang_name = f"{namespace}/train"
    # An MPI job: 4 GPU workers and a launcher without GPUs, all counted in the gang size.
    launcher = "train-launcher"

    create_members(cluster, namespace, "train", size=5, gpus=2, members=range(4))
    # Each member is told how many were present when the controller first saw it waiting (told once), once the
    # gang has stayed incomplete for descheduler.gangs.incomplete_event_grace_seconds.
    to_do = re.escape(f"; what to do: {planning.TO_DO[planning.Waiting.INCOMPLETE]}")
    incomplete = re.compile(f"gang {re.escape(gang_name)}: [1234] of 5 members present{to_do}")
    waiting_told(cluster, namespace, "train", count=4, says=incomplete)
    hold_gated(cluster, namespace, "train", count=4)  # every GPU worker is there; the launcher is not
    labels = {NAMES.gang_name: "train", NAMES.gang_size: "5"}
    cluster.kubectl("create", "-f", "-", input=json.dumps(kube.pod(launcher, namespace=namespace, labels=labels)))
    nodes = bound_together(cluster, namespace, "train", size=5)

    members = {p["metadata"]["name"]: p for p in gang(cluster, namespace, "train")}
    workers = {m: n for m, n in nodes.items() if m != launcher}
    # Each worker was nominated to the node the release planned for it, and the scheduler bound it there; the
    # launcher was gated by the webhook like them but got no tier, no affinity and no nomination. Nobody got a pin.
    assert {m: planned_node(p) for m, p in members.items() if m != launcher} == workers
    assert planned_node(members[launcher]) is None
    assert "affinity" not in members[launcher]["spec"]
    assert not [m for m, p in members.items() if kube.required_node_terms(p)], "no pin"
    record = members[launcher]["metadata"]["annotations"][NAMES.decision]
    assert record.startswith("no GPU; no tier, no NVLink affinity") and f"gang {gang_name} of 5" in record, record
    released = {
        m: [e["message"] for e in kube.events_about(cluster, namespace, m, reason="GangReleased")] for m in members
    }
    used = sorted(set(workers.values()))
    expected = f"gang {gang_name}: 4 members on {len(used)} node(s) ({', '.join(used)}): "
    unnominated = (f"each member within one NVLink domain; un-gated with them, not nominated (no GPU): "
                   f"{namespace}/{launcher}")
    assert all(len(m) == 1 and m[0].startswith(expected) for m in released.values()), (released, nodes)
    assert all(m[0].endswith(unnominated) for m in released.values()), released
    assert domains_spanned(cluster, namespace) == {**dict.fromkeys(workers, 1), launcher: 0}
    # Bound all-or-nothing by kube-scheduler (descheduler.gangs.native_binding): the workers in their tier's own
    # PodGroup; the launcher, of another priority (no tier), in a PodGroup of its own (kube-scheduler would refuse it
    # in theirs).
    worker_class = members["train-0"]["spec"]["priorityClassName"]
    assert {m: p["spec"].get("schedulingGroup") for m, p in members.items()} == {
        **{m: {"podGroupName": f"gpu-steward-train-{worker_class}"} for m in workers},
        launcher: {"podGroupName": "gpu-steward-train"}}


def test_gang_that_cannot_fit_stays_fully_gated_until_it_can_then_all_of_it_binds(
    gpu_cluster: conftest.GpuCluster,
    webhook: conftest.WebhookServer,
    descheduler_factory: conftest.StartDescheduler,
    namespace: str,
) -> None:
    cluster = gpu_cluster.cluster
    kube.wait_gpus_free(cluster)
    descheduler_factory(GANG_ONLY)
    # 8 members of 4 GPUs need every NVLink domain of the four 8-GPU nodes; one of them is taken.
    cluster.kubectl("create", "-f", "-", input=json.dumps(kube.pod("blocker", namespace=namespace, gpus=8)))
    kube.poll("blocker bound", lambda: kube.pods(cluster, namespace)["blocker"]["spec"].get("nodeName"))

    create_members(cluster, namespace, "big", size=8, gpus=4, members=range(8))
    # Its nodes: the GPU nodes its members could ever run on (the capacity model: a 2-GPU node never holds a
    # 4-GPU member), so the four 8-GPU nodes, one of them taken by the blocker.
    capacity = f"gang {namespace}/big: complete; waiting for 8 more free GPUs (32 needed, 24 free on its nodes)"
    capacity = planning.to_do(capacity, planning.TO_DO[planning.Waiting.CAPACITY])
    waiting_told(cluster, namespace, "big", count=8, says=re.compile(re.escape(capacity)))
    hold_gated(cluster, namespace, "big", count=8)
    cluster.kubectl("delete", "pod", "blocker", "-n", namespace, "--wait=true")
    nodes = bound_together(cluster, namespace, "big", size=8)

    eight_gpu_nodes = sorted(n["metadata"]["name"] for n in gpu_cluster.nodes
                             if n["status"]["capacity"].get(gpu.FULL_GPU) == "8")
    assert sorted(set(nodes.values())) == eight_gpu_nodes
    assert domains_spanned(cluster, namespace) == dict.fromkeys(nodes, 1)
    listed = [e["involvedObject"]["name"] for e in kube.events(cluster, namespace, reason="GangReleased")]
    assert sorted(listed) == sorted(nodes)


def test_pods_gated_while_no_controller_runs_are_placed_when_one_starts(
    gpu_cluster: conftest.GpuCluster,
    plain_namespace: str,
    descheduler_factory: conftest.StartDescheduler,
) -> None:
    """Nothing the release needs lives in a process: a single pod and a gang gated while no descheduler runs
    (a crash, a restart) wait, and are placed and bound as soon as one leads."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    solo = kube.pod("solo", namespace=ns, gpus=2, gates=[NAMES.gate])
    cluster.kubectl("create", "-f", "-", input=json.dumps(solo))
    labels = {NAMES.gang_name: "pair", NAMES.gang_size: "2"}
    for i in range(2):
        cluster.kubectl("create", "-f", "-", input=json.dumps(
            kube.pod(f"pair-{i}", namespace=ns, gpus=4, labels=labels, gates=[NAMES.gate])))
    hold_gated(cluster, ns, "pair", count=2)
    assert NAMES.gate in kube.gates(kube.pods(cluster, ns)["solo"])

    descheduler_factory(GANG_ONLY)

    bound_together(cluster, ns, "pair", size=2)
    placed = kube.poll("solo bound", lambda: (p := kube.pods(cluster, ns)["solo"])["spec"].get("nodeName") and p)
    assert planned_node(placed) == placed["spec"]["nodeName"], "bound where the release nominated it"
    assert not kube.required_node_terms(placed), "no pin"
    assert outcomes.read(placed["metadata"]["annotations"][NAMES.release]).why.startswith(
        f"placed on {placed['spec']['nodeName']}: ")
