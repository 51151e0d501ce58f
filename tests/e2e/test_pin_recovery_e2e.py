"""Pin recovery end to end (descheduler/release/recovery.py): a pod released pinned to a node that then cannot take
it — deleted, cordoned, or taken by a pod that was never gated — ends Running (or an ordinary Pending pod without
our pin) within the bound, with an Event that says what happened, on the real 1.37.2 control plane.

The race itself (the node changes between our pin and the binding) is made deterministic: each test writes the
release exactly as the controller does (`patches.release`, with its time-stamped record) after breaking the node,
and only then starts the real descheduler process, which has to find the stuck pin from the cluster alone.
"""

from __future__ import annotations

import datetime
import json
import secrets
from typing import Any

import pytest

from common import label_values, settings, snapshot
from descheduler.release import patches, recoverer, recovery
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
DEADLINE_SECONDS = 3
RECOVERY = {"descheduler": {"reclaim": {"enabled": False}, "gangs": {"pin_deadline_seconds": DEADLINE_SECONDS}}}


def release_by_hand(cluster: localcluster.LocalCluster, namespace: str, name: str, *, node: str | None,
                    record: str | None = None) -> None:
    """What the release controller writes: the pin (if any), the time-stamped record (`record`: the one a gang's
    release writes on all its members), our gate removed."""
    pod = kube.pods(cluster, namespace)[name]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    written = record or label_values.stamp(now, f"placed on {node}: by the test" if node else "unpinned")
    patch = patches.release(pod, gate=NAMES.gate, node=node, record=(NAMES.release, written))
    cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=json", "-p", json.dumps(patch))


def replica_set(name: str, *, namespace: str, gpus: int) -> dict[str, Any]:
    template = kube.pod("x", namespace=namespace, gpus=gpus, labels={"app": name}, gates=[NAMES.gate])
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": template["spec"]}}}


def running(cluster: localcluster.LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = kube.pods(cluster, namespace).get(name)
        return pod if pod and pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running" else None

    try:
        return kube.poll(f"{name} running", bound, timeout_seconds=DEADLINE_SECONDS + 30)
    except AssertionError as exc:
        pod = kube.pods(cluster, namespace).get(name) or {}
        seen = {"gates": kube.gates(pod), "affinity": pod.get("spec", {}).get("affinity"),
                "annotations": pod.get("metadata", {}).get("annotations"), "status": pod.get("status")}
        raise AssertionError(f"{exc}\n{json.dumps(seen, indent=1)}") from None


def stuck_owned_pod(cluster: localcluster.LocalCluster, ns: str, spare_node: str, owner: dict[str, Any]) -> str:
    """The one pod `owner` (a ReplicaSet, a Job) creates, released by hand pinned to `spare_node`, which is gone."""
    cluster.kubectl("create", "-f", "-", input=json.dumps(owner))
    [first] = kube.poll(f"the {owner['kind']}'s pod", lambda: list(kube.pods(cluster, ns)))
    cluster.kubectl("delete", "node", spare_node, "--wait=true")
    release_by_hand(cluster, ns, first, node=spare_node)
    return first


def replaced(cluster: localcluster.LocalCluster, ns: str, first: str) -> str:
    """The name of the pod that replaced `first`, once `first` is gone."""

    def other() -> str | None:
        pods = kube.pods(cluster, ns)
        names = [n for n in pods if n != first]
        return names[0] if names and first not in pods else None

    return kube.poll(f"{first} replaced by its owner", other, timeout_seconds=30)


def journals(cluster: localcluster.LocalCluster) -> list[str]:
    """Pin recovery's journals of bare pods being re-created (`recoverer.journal`)."""
    listed = cluster.kubectl_json("get", "configmaps", "-n", conftest.DESCHEDULER_NAMESPACE, "-l",
                                  f"{NAMES.prefix}recreate=true")["items"]
    return [str(j["metadata"]["name"]) for j in listed]


def told(cluster: localcluster.LocalCluster, namespace: str, *, kind: str, name: str) -> list[str]:
    return [e["message"] for e in kube.events(cluster, namespace, reason=recovery.RECOVERED)
            if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name]


def test_replicaset_pod_pinned_to_a_deleted_node_is_replaced_and_runs(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    # Its node goes away (an autoscaler's scale-down, say) between our pin and the binding.
    first = stuck_owned_pod(cluster, ns, spare_node, replica_set("web", namespace=ns, gpus=4))

    descheduler_factory(RECOVERY)

    second = replaced(cluster, ns, first)
    placed = running(cluster, ns, second)
    assert snapshot.pinned_node(placed) == placed["spec"]["nodeName"] != spare_node, "placed afresh by our release"
    [said] = told(cluster, ns, kind="Pod", name=first)
    assert said == (f"pinned to {spare_node}, not bound: its node {spare_node} is gone; recovered: {ns}/{first}: "
                    "its ReplicaSet web re-creates it")
    assert told(cluster, ns, kind="ReplicaSet", name="web") == [said], "the owner is told too"


def test_bare_pod_pinned_to_a_cordoned_node_is_created_again_without_the_pin(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    labels, annotations = {"team": "vision"}, {"owner.example.com/ticket": "GPU-42"}
    solo = kube.pod("solo", namespace=ns, gpus=4, labels=labels, annotations=annotations, gates=[NAMES.gate])
    cluster.kubectl("create", "-f", "-", input=json.dumps(solo))
    before = kube.pods(cluster, ns)["solo"]
    cluster.kubectl("cordon", spare_node)  # a drain begins
    release_by_hand(cluster, ns, "solo", node=spare_node)

    descheduler_factory(RECOVERY)

    again = kube.poll("solo created again", lambda: (p := kube.pods(cluster, ns).get("solo")) and
                      p["metadata"]["uid"] != before["metadata"]["uid"] and p)
    placed = running(cluster, ns, "solo")
    assert placed["metadata"]["uid"] == again["metadata"]["uid"]
    assert placed["spec"]["nodeName"] != spare_node and "affinity" not in placed["spec"], "our pin is gone"
    # Nothing its creator wrote is lost: labels, annotations, the container as written.
    assert placed["metadata"]["labels"] == labels
    assert placed["metadata"]["annotations"] == annotations, "our record went with our pin"
    assert placed["spec"]["containers"][0]["resources"] == before["spec"]["containers"][0]["resources"]
    [said] = told(cluster, ns, kind="Pod", name="solo")
    assert said.endswith(f"its node {spare_node} is cordoned or not ready; recovered: {ns}/solo: a bare pod: "
                         "created again as it was, without our pin"), said
    assert journals(cluster) == [], "the journal is settled"


def test_gang_split_by_a_node_taken_by_a_never_gated_pod_ends_running_together(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    """One member bound, the other pinned to a node a pod that was never gated took first: the scheduler says
    Unschedulable; past the deadline the stuck member is re-created without its pin and the gang runs whole."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    taker = kube.pod("taker", namespace=ns, gpus=8, node_selector={"kubernetes.io/hostname": spare_node})
    cluster.kubectl("create", "-f", "-", input=json.dumps(taker))
    running(cluster, ns, "taker")
    labels = {NAMES.gang_name: "pair", NAMES.gang_size: "2"}
    for i in range(2):
        member = kube.pod(f"pair-{i}", namespace=ns, gpus=4, labels=labels, gates=[NAMES.gate])
        cluster.kubectl("create", "-f", "-", input=json.dumps(member))
    release_by_hand(cluster, ns, "pair-1", node=None)
    running(cluster, ns, "pair-1")
    release_by_hand(cluster, ns, "pair-0", node=spare_node)
    kube.poll("pair-0 reported Unschedulable", lambda: kube.scheduled_reason(kube.pods(cluster, ns)["pair-0"])
              == "Unschedulable")

    descheduler_factory(RECOVERY)

    placed = running(cluster, ns, "pair-0")
    assert placed["spec"]["nodeName"] != spare_node and "affinity" not in placed["spec"]
    [said] = told(cluster, ns, kind="Pod", name="pair-0")
    assert said.startswith(f"gang {ns}/pair: {ns}/pair-0 pinned to {spare_node}, not bound: kube-scheduler reports "
                           "it Unschedulable"), said
    assert kube.pods(cluster, ns)["pair-1"]["status"]["phase"] == "Running", "the running member was left alone"


def test_gang_part_bound_from_one_release_is_recovered_whole_once_its_budget_allows(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    """A ReplicaSet's gang of 2 released together: one member bound, the other pinned to a node cordoned since. The
    bound member is of the same release (the gang never ran whole), so it is recovered with the stuck one — but a
    PodDisruptionBudget allows no disruption: the dry run is refused, the unit reported and nothing touched. Once the
    budget is gone, both are evicted, their ReplicaSet re-creates them gated, and the gang is released whole."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    owner = replica_set("pair", namespace=ns, gpus=4)
    owner["spec"]["replicas"] = 2
    owner["spec"]["template"]["metadata"]["labels"] |= {NAMES.gang_name: "pair", NAMES.gang_size: "2"}
    cluster.kubectl("create", "-f", "-", input=json.dumps(owner))
    first = kube.poll("the ReplicaSet's 2 pods",
                      lambda: names if len(names := sorted(kube.pods(cluster, ns))) == 2 else None)
    stuck, bound = first
    cluster.kubectl("cordon", spare_node)  # a drain begins between the gang's release and the binding
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = label_values.stamp(now, f"gang {ns}/pair of 2 placed: by the test")
    release_by_hand(cluster, ns, bound, node=None, record=record)
    before = running(cluster, ns, bound)["metadata"]["uid"]
    budget = kube.pod_disruption_budget("pair", namespace=ns, match_labels={"app": "pair"}, min_available=1)
    cluster.kubectl("create", "-f", "-", input=json.dumps(budget))
    release_by_hand(cluster, ns, stuck, node=spare_node, record=record)

    descheduler_factory(RECOVERY)

    def reported() -> str | None:
        said = [e["message"] for e in kube.events(cluster, ns, reason=recovery.STUCK)
                if e["involvedObject"]["name"] == stuck]
        return said[0] if said else None

    said = kube.poll("PinStuck: the eviction refused", reported, timeout_seconds=30)
    assert f"not recovered, retried on each pass: {ns}/{bound}: eviction refused" in said, said
    assert said.endswith("nothing was done"), said
    pods = kube.pods(cluster, ns)
    assert pods[bound]["metadata"]["uid"] == before and pods[bound]["status"]["phase"] == "Running", "left running"
    assert snapshot.pinned_node(pods[stuck]) == spare_node, "the stuck member untouched too: the unit is whole"

    cluster.kubectl("delete", "pdb", "pair", "-n", ns)

    def whole() -> list[str] | None:
        pods = kube.pods(cluster, ns)
        fresh = sorted(n for n, p in pods.items() if n not in first and p["spec"].get("nodeName")
                       and p["status"].get("phase") == "Running")
        return fresh if len(fresh) == 2 and not set(first) & set(pods) else None

    fresh = kube.poll("the gang re-created and running whole", whole, timeout_seconds=DEADLINE_SECONDS + 60)
    assert all(kube.pods(cluster, ns)[n]["spec"]["nodeName"] != spare_node for n in fresh)
    [recovered] = told(cluster, ns, kind="Pod", name=bound)
    assert "recovered with the 1 member(s) bound from the same release (the gang never ran whole)" in recovered


def job(name: str, *, namespace: str, backoff_limit: int, ignore_disruption: bool) -> dict[str, Any]:
    spec = kube.pod("x", namespace=namespace, gpus=4, gates=[NAMES.gate])["spec"] | {"restartPolicy": "Never"}
    body: dict[str, Any] = {"backoffLimit": backoff_limit, "template": {"spec": spec}}
    if ignore_disruption:
        body["podFailurePolicy"] = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace}, "spec": body}


def test_job_whose_policy_ignores_disruption_is_recovered_by_eviction_without_failing(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    """backoffLimit 0, but a podFailurePolicy that ignores DisruptionTarget: the Eviction API marks the pod so, and
    the Job controller re-creates it without counting a failure (checked here on the real controller)."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    first = stuck_owned_pod(cluster, ns, spare_node,
                            job("train", namespace=ns, backoff_limit=0, ignore_disruption=True))

    descheduler_factory(RECOVERY)

    second = replaced(cluster, ns, first)
    # kwok runs a Job's pod to completion at once: the Job completes, with no failure counted.
    status = kube.poll("the Job complete", lambda: (s := cluster.kubectl_json("get", "job", "train", "-n", ns)[
        "status"]).get("succeeded") and s, timeout_seconds=30)
    assert not status.get("failed") and not [c for c in status.get("conditions") or () if c["type"] == "Failed"]
    assert kube.pods(cluster, ns)[second]["spec"].get("nodeName"), "placed and bound"
    [said] = told(cluster, ns, kind="Job", name="train")
    assert said.endswith("its Job train re-creates it (its podFailurePolicy ignores DisruptionTarget)"), said


def test_job_without_retries_to_spare_is_reported_not_deleted(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str,
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    first = stuck_owned_pod(cluster, ns, spare_node,
                            job("once", namespace=ns, backoff_limit=0, ignore_disruption=False))

    descheduler_factory(RECOVERY)

    def reported() -> list[dict[str, Any]] | None:
        found = [e for e in kube.events(cluster, ns, reason=recovery.STUCK)
                 if e["involvedObject"]["name"] in (first, "once")]
        return found if len(found) == 2 else None

    events = kube.poll("PinStuck on the pod and its Job", reported, timeout_seconds=30)
    assert all("its Job once has 0 retries left: deleting 1 pod(s) would fail it" in e["message"]
               and e["message"].endswith("(without the node affinity on metadata.name)") for e in events)
    assert first in kube.pods(cluster, ns), "left as it is: deleting it would fail the Job"
    status = cluster.kubectl_json("get", "job", "once", "-n", ns)["status"]
    assert not status.get("failed")


def test_a_journal_left_by_a_crash_is_replayed_by_the_next_leader(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
) -> None:
    """The descheduler died after deleting a stuck bare pod and before creating it again: its journal is all that
    is left, and the next leader creates the pod from it (nothing of the recovery lives only in memory)."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    written = kube.pod("lost", namespace=ns, gpus=2, labels={"team": "vision"})
    uid = f"crashed-{secrets.token_hex(4)}"
    cluster.kubectl("create", "-n", conftest.DESCHEDULER_NAMESPACE, "-f", "-",
                    input=json.dumps(recoverer.journal(written, key=f"{ns}/lost", uid=uid, names=NAMES)))

    descheduler_factory(RECOVERY)

    placed = running(cluster, ns, "lost")
    assert placed["metadata"]["labels"] == {"team": "vision"}
    kube.poll("the journal settled", lambda: not journals(cluster))
