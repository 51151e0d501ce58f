"""`gpu-steward label-node` as a process: a fake nvidia-smi script in front, a mock API server behind.

The mock serves one Node (`GET`/`PATCH /api/v1/nodes/{name}`), applies merge patches the way the API
server does (RFC 7386, key by key) and records every request, so the tests can assert what was sent,
not only what the node ended up with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from aiohttp import web

from common import nvtopo, settings
from tests.support import kube

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "nvidia-smi-topo"
PAIRS = FIXTURES / "traverse-power9-4gpu-v100-nv3-pairs-4xmlx5.txt"
NVSWITCH = FIXTURES / "dgx-a100-8gpu-nv12-12xmlx5.txt"
NAMES = settings.Names()
NODE = "gpu-node-1"
TIMEOUT = 30  # bound of every wait (a hang fails the test instead of blocking it)
FOREIGN_LABELS = {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.count": "4", NAMES.nvlink_domains: "1"}
FOREIGN_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0"}
Json = dict[str, Any]


class FakeApiServer:
    """One Node; PATCH accepts only a merge patch of metadata.labels/annotations; every request is recorded
    as (method, path, content type, body)."""

    def __init__(self) -> None:
        self.node: Json = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": dict(FOREIGN_LABELS), "annotations": dict(FOREIGN_ANNOTATIONS)},
        }
        self.requests: list[tuple[str, str, str, Any]] = []
        self.patched = asyncio.Condition()

    @property
    def patches(self) -> list[Any]:
        return [body for method, _, _, body in self.requests if method == "PATCH"]

    async def handle(self, request: web.Request) -> web.Response:
        body: Any = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, request.content_type, body))
        if request.match_info["name"] != NODE:
            return web.json_response({"kind": "Status", "code": 404, "message": "nodes not found"}, status=404)
        if request.method == "PATCH":
            if request.content_type != "application/merge-patch+json":
                return web.json_response({"kind": "Status", "code": 415, "message": "unsupported"}, status=415)
            if set(body) != {"metadata"} or not set(body["metadata"]) <= {"labels", "annotations"}:
                return web.json_response({"kind": "Status", "code": 422, "message": "not ours"}, status=422)
            # Merge-patch semantics for string maps: keys merge into the map, the map is never replaced.
            for field, values in body["metadata"].items():
                self.node["metadata"].setdefault(field, {}).update(values)
            async with self.patched:
                self.patched.notify_all()
        return web.json_response(self.node)


@pytest.fixture
async def api_server(tmp_path: pathlib.Path) -> AsyncIterator[tuple[FakeApiServer, pathlib.Path]]:
    """The mock API server and a kubeconfig pointing at it."""
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/api/v1/nodes/{name}", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(kube.kubeconfig(f"http://127.0.0.1:{port}")))
        yield fake, kubeconfig
    finally:
        await runner.cleanup()


def fake_nvidia_smi(tmp_path: pathlib.Path, script: str) -> pathlib.Path:
    """An executable standing in for nvidia-smi; it appends a line to `calls` each time it runs."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _calls(tmp_path: pathlib.Path) -> list[str]:
    calls = tmp_path / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


@contextlib.asynccontextmanager
async def label_node(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m gpu_steward label-node ARGS` as a process; killed on the way out if still running."""
    env = {**os.environ, "NODE_NAME": NODE}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_steward", "label-node", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


async def run_once(*args: str) -> tuple[int, str, str]:
    async with label_node("--once", *args) as process:
        async with asyncio.timeout(TIMEOUT):
            out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _expected(fixture: pathlib.Path) -> tuple[dict[str, str], dict[str, str]]:
    topology = nvtopo.parse(fixture.read_text())
    return nvtopo.node_labels(topology, names=NAMES), nvtopo.node_annotations(topology, names=NAMES)


async def test_once_patches_only_our_keys(
    api_server: tuple[FakeApiServer, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    fake, kubeconfig = api_server
    smi = fake_nvidia_smi(tmp_path, f"cat {PAIRS}")
    code, _, err = await run_once("--nvidia-smi", str(smi), "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    labels, annotations = _expected(PAIRS)
    assert _calls(tmp_path) == ["topo -m"]
    path = f"/api/v1/nodes/{NODE}"
    assert [(m, p) for m, p, _, _ in fake.requests] == [("GET", path), ("PATCH", path)]
    assert fake.requests[1][2] == "application/merge-patch+json"
    # Only our keys, and only those that differ: the node already had nvlink-domains=1 (now 2).
    assert fake.patches == [{"metadata": {"labels": labels, "annotations": annotations}}]
    assert fake.node["metadata"]["labels"] == {**FOREIGN_LABELS, **labels}
    assert fake.node["metadata"]["annotations"] == {**FOREIGN_ANNOTATIONS, **annotations}
    assert f"node {NODE} patched" in err


async def test_current_node_is_not_patched(
    api_server: tuple[FakeApiServer, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    fake, kubeconfig = api_server
    labels, annotations = _expected(PAIRS)
    fake.node["metadata"]["labels"].update(labels)
    fake.node["metadata"]["annotations"].update(annotations)
    smi = fake_nvidia_smi(tmp_path, f"cat {PAIRS}")
    code, _, err = await run_once("--nvidia-smi", str(smi), "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert [m for m, _, _, _ in fake.requests] == ["GET"]
    assert f"node {NODE} up to date" in err


@pytest.mark.parametrize(
    ("script", "extra", "message"),
    [
        pytest.param(None, (), "cannot run /nonexistent/nvidia-smi: [Errno 2] No such file or directory",
                     id="nvidia-smi-missing"),
        pytest.param("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
                     (), "topo -m exited with 9: NVIDIA-SMI has failed because it could not communicate",
                     id="nvidia-smi-fails"),
        pytest.param("echo 'No devices were found'", (),
                     "printed a matrix we cannot parse: no GPU matrix found", id="unparseable-output"),
        pytest.param(f"head -n 3 {PAIRS}", (),
                     "cannot parse: line 1: header names GPUs [0, 1, 2, 3] but the matrix has rows for GPUs [0, 1]",
                     id="truncated-output"),
        pytest.param("exec sleep 60", ("--nvidia-smi-timeout", "0.5"), "topo -m did not finish within 0.5s",
                     id="nvidia-smi-hangs"),
    ],
)
async def test_failed_read_writes_nothing(
    api_server: tuple[FakeApiServer, pathlib.Path],
    tmp_path: pathlib.Path,
    script: str | None,
    extra: tuple[str, ...],
    message: str,
) -> None:
    fake, kubeconfig = api_server
    smi = "/nonexistent/nvidia-smi" if script is None else str(fake_nvidia_smi(tmp_path, script))
    code, _, err = await run_once("--nvidia-smi", smi, "--kubeconfig", str(kubeconfig), *extra)
    assert code == 1
    assert message in err
    assert "node labels left as they are" in err
    assert fake.requests == []


async def test_unknown_node_fails(api_server: tuple[FakeApiServer, pathlib.Path], tmp_path: pathlib.Path) -> None:
    fake, kubeconfig = api_server
    smi = fake_nvidia_smi(tmp_path, f"cat {PAIRS}")
    code, _, err = await run_once("--nvidia-smi", str(smi), "--kubeconfig", str(kubeconfig), "--node", "other")
    assert code == 1
    assert "node other: cannot publish the topology: HTTP 404: nodes not found" in err
    assert fake.patches == []


async def test_dry_run_prints_the_patch_and_calls_no_api(
    api_server: tuple[FakeApiServer, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    fake, kubeconfig = api_server
    smi = fake_nvidia_smi(tmp_path, f"cat {PAIRS}")
    code, out, err = await run_once("--nvidia-smi", str(smi), "--kubeconfig", str(kubeconfig), "--dry-run")
    assert code == 0, err
    labels, annotations = _expected(PAIRS)
    assert json.loads(out) == {"metadata": {"labels": labels, "annotations": annotations}}
    assert fake.requests == []


async def test_rechecks_follow_changes_and_skip_failed_reads(
    api_server: tuple[FakeApiServer, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    """Re-checks publish a changed topology; a failing read in between sends nothing; SIGTERM ends it cleanly."""
    fake, kubeconfig = api_server
    source = tmp_path / "topo.txt"
    source.write_text(PAIRS.read_text())
    smi = fake_nvidia_smi(tmp_path, f"cat {source}")

    async def patches(count: int) -> None:
        async with fake.patched:
            await fake.patched.wait_for(lambda: len(fake.patches) >= count)

    logged: list[str] = []

    async def failed_reads(count: int) -> None:
        """Read the labeler's log until `count` failed reads were reported."""
        assert process.stderr is not None
        while sum("cannot parse" in line for line in logged) < count:
            line = await process.stderr.readline()
            assert line, "label-node exited"
            logged.append(line.decode())

    async with label_node("--nvidia-smi", str(smi), "--kubeconfig", str(kubeconfig), "--interval", "0.1") as process:
        async with asyncio.timeout(TIMEOUT):
            await patches(1)
            source.write_text("garbage\n")
            await failed_reads(3)
            assert len(fake.patches) == 1
            source.write_text(NVSWITCH.read_text())
            await patches(2)
            process.send_signal(signal.SIGTERM)
            _, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    pairs_labels, pairs_annotations = _expected(PAIRS)
    switch_labels, switch_annotations = _expected(NVSWITCH)
    assert fake.patches[:2] == [
        {"metadata": {"labels": pairs_labels, "annotations": pairs_annotations}},
        {"metadata": {"labels": {key: switch_labels[key] for key in switch_labels if switch_labels[key] !=
                                 pairs_labels[key]}, "annotations": switch_annotations}},
    ]
    assert fake.node["metadata"]["labels"] == {**FOREIGN_LABELS, **switch_labels}
    assert "node labels left as they are" in logged[-1]
    assert "label-node stopped on a signal" in err.decode()
