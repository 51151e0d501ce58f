"""Events on the real API server: the same Event again counts up instead of piling up (as client-go's)."""

from __future__ import annotations

from kubernetes_asyncio import client

from common import events
from gpu_steward_lab import localcluster
from tests.support import kube


async def test_a_repeated_event_bumps_the_count_of_one_event(
    control_plane: localcluster.LocalCluster, namespace: str, kube_api: client.ApiClient
) -> None:
    blocked = events.ObjectRef.pod(f"{namespace}/train-0", uid="uid-1")
    said = {"type": "Warning", "reason": "EvictionBlocked", "request_timeout": 10}
    for _ in range(3):
        assert await events.post(kube_api, regarding=blocked, message="a PodDisruptionBudget blocks it", **said)
    assert await events.post(kube_api, regarding=blocked, message="something else", **said)

    listed = kube.events(control_plane, namespace, reason="EvictionBlocked")
    assert sorted((e["message"], e["count"]) for e in listed) == [
        ("a PodDisruptionBudget blocks it", 3), ("something else", 1)]
    assert all(e["involvedObject"]["name"] == "train-0" for e in listed)
