"""Release by nomination on the real 1.37.2 control plane: the release's own calls (`patches.nominate`, then
`patches.release`) are accepted on a gated pod and it binds on its nominated node; a node that fills before the
un-gating makes the pod bind elsewhere, which the descheduler's observation pass reports `PlacedElsewhere`; nothing is
ever deleted. The facts themselves (with their controls, on 1.37.2 and 1.36.3) are
tests/e2e/test_nomination_facts_e2e.py."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings, snapshot
from descheduler.release import outcomes, patches
from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
GANG_ONLY = {"descheduler": {"reclaim": {"enabled": False}}}


def _status_patch(cluster: localcluster.LocalCluster, namespace: str, name: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
                           json.dumps(body), check=False)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.mark.parametrize(
    "required_terms",
    [
        pytest.param(None, id="no-affinity-of-its-own"),
        pytest.param([{"matchExpressions": [kube.requirement(NAMES.nvlink_domain_size, "Gt", "1")]}],
                     id="with-a-required-term"),
    ],
)
def test_release_nominates_then_ungates_and_the_pod_binds_on_its_nominated_node(
    gpu_cluster: conftest.GpuCluster, plain_namespace: str, spare_node: str,
    required_terms: list[dict[str, Any]] | None,
) -> None:
    """The nomination carries the resourceVersion the plan read: a stale one is refused (409) and changes nothing; a
    fresh one is kept while the pod is gated; the un-gating patch adds no node term; the pod binds on the nominated
    node although it prefers another (weight 100), and the API server clears the nomination on binding."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    other = "kwok-8g2d-0"
    pod = kube.pod("solo", namespace=ns, gpus=2, gates=[NAMES.gate], required_terms=required_terms,
                   preferred_terms=[(100, {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": [other]}]})])
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False).returncode == 0
    stale = cluster.kubectl_json("get", "pod", "solo", "-n", ns)
    cluster.kubectl("annotate", "pod", "solo", "-n", ns, "example.com/touched=yes")
    body = patches.nominate(stale, node=spare_node)
    assert body is not None
    refused = _status_patch(cluster, ns, "solo", body)
    assert refused.returncode != 0 and "modified" in refused.stderr, refused.stderr
    fresh = cluster.kubectl_json("get", "pod", "solo", "-n", ns)
    assert patches.nominated(fresh) is None, "nothing of the stale nomination applied"

    body = patches.nominate(fresh, node=spare_node)
    assert body is not None
    done = _status_patch(cluster, ns, "solo", body)
    assert done.returncode == 0, done.stderr
    time.sleep(2)  # a scheduler pass or two: the gated pod keeps its nomination
    gated = cluster.kubectl_json("get", "pod", "solo", "-n", ns)
    assert (kube.gates(gated), patches.nominated(gated)) == ([NAMES.gate], spare_node)
    assert patches.nominate(gated, node="elsewhere") is None, "never overwritten"

    record = (NAMES.release, outcomes.record(at=_now(), node=spare_node, one_domain=True, why="by the test"))
    ops = patches.release(gated, gate=NAMES.gate, record=record)
    done = cluster.kubectl("patch", "pod", "solo", "-n", ns, "--type=json", "-p", json.dumps(ops), check=False)
    assert done.returncode == 0, done.stderr
    bound = kube.poll("bound", lambda: (p := cluster.kubectl_json("get", "pod", "solo", "-n", ns))["spec"]
                      .get("nodeName") and p)
    assert bound["spec"]["nodeName"] == spare_node, "bound on its nominated node, not the one it prefers"
    assert snapshot.pinned_node(bound) is None, "no pin"
    assert (bound["spec"].get("affinity") or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") == (
        {"nodeSelectorTerms": required_terms} if required_terms else None), "the pod's own terms, as written"
    cleared = kube.poll("nomination cleared", lambda: patches.nominated(
        cluster.kubectl_json("get", "pod", "solo", "-n", ns)) is None)
    assert cleared


@pytest.fixture
def high_class(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    name = f"e2e-high-{secrets.token_hex(3)}"
    control_plane.apply([kube.priority_class(name, value=100_000)])
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "priorityclass", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_node_filled_before_the_ungating_binds_the_pod_elsewhere_and_is_reported_placed_elsewhere(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str, high_class: str,
) -> None:
    """Released as the controller releases (nominated to the spare node, then un-gated), after a higher-priority pod
    (which ignores the nomination) took the whole node: the pod binds on another node; the descheduler reports it
    `PlacedElsewhere` (once), and no pod is deleted or re-created."""
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    pod = kube.pod("late", namespace=ns, gpus=8, gates=[NAMES.gate])
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    gated = cluster.kubectl_json("get", "pod", "late", "-n", ns)
    body = patches.nominate(gated, node=spare_node)
    assert body is not None and _status_patch(cluster, ns, "late", body).returncode == 0

    racer = kube.pod("racer", namespace=ns, gpus=8, priority_class=high_class,
                     node_selector={"kubernetes.io/hostname": spare_node})
    cluster.kubectl("create", "-f", "-", input=json.dumps(racer))
    kube.poll("the racer bound on the nominated node", lambda: kube.pods(cluster, ns)["racer"]["spec"].get(
        "nodeName") == spare_node)

    gated = cluster.kubectl_json("get", "pod", "late", "-n", ns)
    record = (NAMES.release, outcomes.record(at=_now(), node=spare_node, one_domain=True, why="by the test"))
    ops = patches.release(gated, gate=NAMES.gate, record=record)
    assert cluster.kubectl("patch", "pod", "late", "-n", ns, "--type=json", "-p", json.dumps(ops),
                           check=False).returncode == 0
    uids = {n: p["metadata"]["uid"] for n, p in kube.pods(cluster, ns).items()}
    placed = kube.poll("bound elsewhere", lambda: (p := kube.pods(cluster, ns)["late"])["spec"].get("nodeName") and p,
                       timeout_seconds=60)
    assert placed["spec"]["nodeName"] != spare_node, "the filled node no longer fits: bound elsewhere, not stranded"

    descheduler_factory(GANG_ONLY)
    [told] = kube.poll("PlacedElsewhere told", lambda: kube.events_about(
        cluster, ns, "late", reason=outcomes.EVENTS[outcomes.Cause.PLACED_ELSEWHERE][1]), timeout_seconds=60)
    assert told["type"] == "Normal"
    assert told["message"] == (f"nominated to {spare_node} at release, bound to {placed['spec']['nodeName']} (the "
                               "node no longer fitted it when kube-scheduler tried it)")
    time.sleep(3)  # a few more passes: told once, nothing deleted
    [again] = kube.events_about(cluster, ns, "late", reason="PlacedElsewhere")
    assert again.get("count", 1) == 1, "told once"
    assert {n: p["metadata"]["uid"] for n, p in kube.pods(cluster, ns).items()} == uids, "no pod deleted or re-created"
