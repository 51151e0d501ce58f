"""Preemption-aware release on the real 1.37.2 control plane: a gated pod that fits no node, but would once
kube-scheduler preempted a pod of lower priority, is released at once (unpinned), and the scheduler's own preemption
makes room for it — instead of waiting gated (invisible to preemption) for `descheduler.gangs.max_wait_seconds`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from common import settings, snapshot
from descheduler.release import planning
from gpu_steward import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
# The descheduler would keep an unplaceable pod gated for 600 s: only the preemption rule can release it in time.
HOLD_FOR_LONG = {"descheduler": {"reclaim": {"enabled": False}, "gangs": {"max_wait_seconds": 600}}}


@pytest.fixture
def classes(control_plane: localcluster.LocalCluster) -> Iterator[tuple[str, str]]:
    low, high = f"e2e-low-{secrets.token_hex(3)}", f"e2e-high-{secrets.token_hex(3)}"
    control_plane.apply([kube.priority_class(low, value=100), kube.priority_class(high, value=100_000)])
    try:
        yield low, high
    finally:
        control_plane.kubectl("delete", "priorityclass", low, high, "--ignore-not-found", "--wait=false", check=False)


def test_pod_only_preemption_can_place_is_released_at_once_and_preempts(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str, classes: tuple[str, str],
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    low, high = classes
    kube.wait_gpus_free(cluster)
    on_spare = {"kubernetes.io/hostname": spare_node}
    filler = kube.pod("filler", namespace=ns, gpus=8, node_selector=on_spare, priority_class=low)
    cluster.kubectl("create", "-f", "-", input=json.dumps(filler))
    kube.poll("filler bound", lambda: kube.pods(cluster, ns)["filler"]["spec"].get("nodeName"))
    descheduler_factory(HOLD_FOR_LONG)

    urgent = kube.pod("urgent", namespace=ns, gpus=8, node_selector=on_spare, priority_class=high,
                      gates=[NAMES.gate])
    cluster.kubectl("create", "-f", "-", input=json.dumps(urgent))

    placed = kube.poll("urgent bound on the spare node", lambda: (p := kube.pods(cluster, ns).get("urgent")) and
                       p["spec"].get("nodeName") == spare_node and p, timeout_seconds=60)
    assert snapshot.pinned_node(placed) is None, "released unpinned: the scheduler chose where to preempt"
    assert "filler" not in kube.pods(cluster, ns), "the lower-priority pod was preempted"
    [said] = [e["message"] for e in kube.events_about(cluster, ns, "urgent", reason=planning.PREEMPTING)]
    assert said == (f"fits no node now; preempting lower-priority pods on {spare_node} would make room (1 there): "
                    "released unpinned at once so that kube-scheduler preempts for it")
