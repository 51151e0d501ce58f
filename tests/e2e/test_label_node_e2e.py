"""`gpu-steward label-node` against the real API server: what the mock in tests/integration/test_label_node.py
re-implements (a merge patch merges our keys into the node's maps and never drops another's; an unknown node is
a 404) checked where the rule lives."""

from __future__ import annotations

import asyncio
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from gpu_steward_lab import localcluster
from tests.integration import test_label_node as unit

pytestmark = pytest.mark.e2e

HANG_SECONDS = 180  # a bound for a hang, not a speed assert: a process start takes 25 s on a loaded machine
FOREIGN_LABELS = {"team.example.com/pool": "a", "nvidia.com/gpu.count": "4"}
FOREIGN_ANNOTATIONS = {"team.example.com/owner": "ml-platform"}


@pytest.fixture
def node(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    name = f"label-e2e-{uuid.uuid4().hex[:6]}"
    control_plane.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": FOREIGN_LABELS, "annotations": FOREIGN_ANNOTATIONS}}])
    yield name
    control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")


def _metadata(cluster: localcluster.LocalCluster, name: str) -> dict[str, dict[str, str]]:
    meta = cluster.kubectl_json("get", "node", name)["metadata"]
    return {"labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}}


async def _label(cluster: localcluster.LocalCluster, tmp_path: pathlib.Path, node: str, topo: pathlib.Path
                 ) -> tuple[int, str]:
    smi = unit.fake_nvidia_smi(tmp_path, f"cat {topo}")
    args = ("--once", "--nvidia-smi", str(smi), "--kubeconfig", str(cluster.kubeconfig), "--node", node)
    async with unit.label_node(*args) as process:
        async with asyncio.timeout(HANG_SECONDS):
            _, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_our_keys_merge_into_the_nodes_maps_and_change_with_the_topology(
    control_plane: localcluster.LocalCluster, node: str, tmp_path: pathlib.Path
) -> None:
    code, err = await _label(control_plane, tmp_path, node, unit.PAIRS)
    assert code == 0, err
    labels, annotations = unit._expected(unit.PAIRS)
    got = _metadata(control_plane, node)
    assert {k: got["labels"].get(k) for k in (*FOREIGN_LABELS, *labels)} == {**FOREIGN_LABELS, **labels}
    assert {k: got["annotations"].get(k) for k in (*FOREIGN_ANNOTATIONS, *annotations)} == {
        **FOREIGN_ANNOTATIONS, **annotations}
    # The node's topology changes (another board): our values change, another's keys stay.
    (tmp_path / "calls").unlink(missing_ok=True)
    code, err = await _label(control_plane, tmp_path, node, unit.NVSWITCH)
    assert code == 0, err
    switch_labels, _ = unit._expected(unit.NVSWITCH)
    got = _metadata(control_plane, node)
    assert {k: got["labels"].get(k) for k in (*FOREIGN_LABELS, *switch_labels)} == {
        **FOREIGN_LABELS, **switch_labels}


async def test_an_unknown_node_fails_and_writes_nothing(
    control_plane: localcluster.LocalCluster, tmp_path: pathlib.Path
) -> None:
    name = f"no-such-node-{uuid.uuid4().hex[:6]}"
    code, err = await _label(control_plane, tmp_path, name, unit.PAIRS)
    assert code == 1, err
    assert f'node {name}: cannot publish the topology: HTTP 404: nodes "{name}" not found' in err, err
