"""The kwok stand-in for the device plugin + dcgm-exporter: stable indices, dcgm-shaped output."""

from __future__ import annotations

from common import settings, snapshot
from gpu_steward_lab import devicesim
from tests import builders

NAMES = settings.Names()


def cluster(pods: list[dict]) -> snapshot.Snapshot:
    return snapshot.build(nodes=[builders.gpu_node("n", gpus=8, domains=[range(4), range(4, 8)])],
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
