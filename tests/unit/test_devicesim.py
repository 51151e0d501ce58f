"""The kwok stand-in for the device plugin + dcgm-exporter: stable indices, dcgm-shaped output."""

from __future__ import annotations

from typing import Any

import pytest

from common import settings, snapshot, snapshot_build
from gpu_steward_lab import devicesim
from tests import builders

NAMES = settings.Names()


def cluster(pods: list[dict]) -> snapshot.Snapshot:
    return snapshot_build.build(nodes=[builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])],
                                pods=pods, names=NAMES, taken_at=0.0)


def test_indices_follow_the_policy_and_stay_put_when_others_leave():
    a = builders.pod("a", gpus=2, node="n", phase="Running", created="2026-01-01T00:00:01Z")
    b = builders.pod("b", gpus=4, node="n", phase="Running", created="2026-01-01T00:00:02Z")
    c = builders.pod("c", gpus=2, node="n", phase="Running", created="2026-01-01T00:00:03Z")
    assignments = devicesim.Assignments()
    assignments.update(cluster([a, b, c]))
    assert assignments.by_node["n"] == {"default/a": (0, 1), "default/b": (4, 5, 6, 7), "default/c": (2, 3)}

    d = builders.pod("d", gpus=1, node="n", phase="Running", created="2026-01-01T00:00:04Z")
    assignments.update(cluster([b, c, d]))  # a ended: d takes the smallest free domain, others keep theirs
    assert assignments.by_node["n"] == {"default/b": (4, 5, 6, 7), "default/c": (2, 3), "default/d": (0,)}


def test_render_is_dcgm_shaped_with_empty_labels_for_free_gpus_and_annotated_utilisation():
    pod = builders.pod("nb", namespace="ml", gpus=2, node="n", phase="Running",
                       annotations={devicesim.UTILISATION_ANNOTATION: "0,35"})
    snap = cluster([pod])
    assignments = devicesim.Assignments()
    assignments.update(snap)
    lines = devicesim.render(snap, assignments).splitlines()
    assert lines[0].startswith("# HELP DCGM_FI_DEV_GPU_UTIL")
    series = lines[2:]
    assert len(series) == 8
    assert series[0] == ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-n-0",device="nvidia0",'
                         'modelName="NVIDIA-Simulated-GPU",Hostname="n",container="main",namespace="ml",pod="nb"} 0')
    assert series[1].endswith('namespace="ml",pod="nb"} 35')
    assert series[2].endswith('container="",namespace="",pod=""} 0')


def dra_cluster(*items: dict[str, Any]) -> snapshot.Snapshot:
    """Node `n`: 8 GPUs that are DRA devices (NVLink domains 0-3, 4-7), its slice listing them by index."""
    return snapshot_build.from_list({"kind": "List", "items": [
        builders.device_class(), builders.dra_node("n", domains=[range(4), range(4, 8)]),
        builders.resource_slice("n", 8), *items]}, names=NAMES, taken_at=0.0)


def _extended(name: str, gpus: int, devices: tuple[int, ...] | None) -> list[dict[str, Any]]:
    """A bound pod asking `nvidia.com/gpu: gpus`; its scheduler-made claim allocated `devices` (None: not seen)."""
    pod = builders.pod(name, gpus=gpus, node="n", phase="Running", created=f"2026-01-01T00:00:0{gpus}Z",
                       mutate=builders.with_extended_claim(f"{name}-x"))
    if devices is None:
        return [pod]
    return [pod, builders.resource_claim(f"{name}-x", spec=builders.claim_spec(gpus),
                                         devices=[("n", i) for i in devices], reserved_for=[name], extended=True)]


@pytest.mark.parametrize(("items", "expected"), [
    # The allocator's first fit split the 4-GPU pod (3-6) while 4-7 was free: the policy would have given 4-7.
    pytest.param([*_extended("one", 1, (0,)), *_extended("two", 2, (1, 2)), *_extended("four", 4, (3, 4, 5, 6))],
                 {"default/one": (0,), "default/two": (1, 2), "default/four": (3, 4, 5, 6)},
                 id="dra-node-the-claims-allocation-not-the-policy"),
    pytest.param([*_extended("one", 1, (0,)), *_extended("four", 4, None)], {"default/one": (0,)},
                 id="dra-node-claim-not-seen-allocated-no-indices-yet"),
    pytest.param([*_extended("four", 4, (2, 3, 4, 5))], {"default/four": (2, 3, 4, 5)},
                 id="dra-node-a-lone-pod-keeps-its-claims-devices"),
])
def test_on_a_dra_node_indices_are_the_claims_allocation(items: list[dict[str, Any]],
                                                        expected: dict[str, tuple[int, ...]]) -> None:
    assignments = devicesim.Assignments()
    assignments.update(dra_cluster(*items))
    assert assignments.by_node == {"n": expected}


def test_on_a_dra_node_a_pod_gets_its_indices_once_its_claim_is_seen_and_dcgm_reports_them() -> None:
    assignments = devicesim.Assignments()
    assignments.update(dra_cluster(*_extended("four", 4, None)))
    assert assignments.by_node == {"n": {}}
    snap = dra_cluster(*_extended("four", 4, (3, 4, 5, 6)))
    assignments.update(snap)
    assert assignments.by_node == {"n": {"default/four": (3, 4, 5, 6)}}
    series = devicesim.render(snap, assignments).splitlines()[2:]
    assert [s.split("pod=")[1] for s in series] == ['""} 0', '""} 0', '""} 0', *['"four"} 60'] * 4, '""} 0']
