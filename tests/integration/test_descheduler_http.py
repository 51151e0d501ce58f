"""The descheduler's `/healthz`, `/readyz` and `/metrics` (`descheduler.health`) on a real port, and the
`gpu-steward descheduler --metrics-port` process that serves them from its asyncio loop: replaying a
state file (`--cluster`, synced at once), live while its first sync cannot reach the API server, with
`--once`, and on a port already taken."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import prometheus_client
import pytest

from common import buildinfo, httpserver, snapshot, source
from descheduler import health
from tests.integration import conftest
from tests.support import kube, processes
from tests.support.prometheus import free_port

Get = Callable[[str], Awaitable[tuple[int, str]]]


class Syncing:
    """A snapshot source whose first sync the test completes by setting `synced`."""

    def __init__(self) -> None:
        self.snapshot = snapshot.EMPTY
        self.synced = False


@contextlib.asynccontextmanager
async def served(
    *,
    work: asyncio.Future[object],
    cluster: source.SnapshotSource,
    registry: prometheus_client.CollectorRegistry | None = None,
) -> AsyncIterator[tuple[int, Get]]:
    """The app on 127.0.0.1 in this loop: its port, and GET path -> (status, body)."""
    app = health.create_app(work=work, source=cluster, registry=registry or prometheus_client.CollectorRegistry())
    async with (
        httpserver.serving(app, host="127.0.0.1", port=0, shutdown_seconds=1) as (_, port),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
    ):

        async def get(path: str) -> tuple[int, str]:
            async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                return response.status, await response.text()

        yield port, get


@pytest.fixture
async def running_work() -> AsyncIterator[asyncio.Future[object]]:
    """A work task that runs until the test ends."""
    work: asyncio.Future[object] = asyncio.ensure_future(asyncio.Event().wait())
    yield work
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work


SYNCED = source.StaticSource(snapshot.EMPTY)


# --- the app ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "reason"),
    [
        pytest.param(None, "descheduler work has finished", id="finished"),
        pytest.param(RuntimeError("lost the API server"), "descheduler work failed: RuntimeError: lost the API server",
                     id="failed"),
        pytest.param(asyncio.CancelledError(), "descheduler work was cancelled", id="cancelled"),
    ],
)  # fmt: skip
async def test_healthz_is_ok_while_the_work_runs_and_503_with_the_reason_once_it_ended(
    ending: BaseException | None, reason: str
) -> None:
    release = asyncio.Event()

    async def job() -> None:
        await release.wait()
        if ending is not None:
            raise ending

    work: asyncio.Future[object] = asyncio.ensure_future(job())
    async with served(work=work, cluster=SYNCED) as (_, get):
        running = await get("/healthz")
        release.set()
        await asyncio.wait([work])
        ended = await get("/healthz")
        ready = await get("/readyz")

    assert running == (200, "ok\n")
    assert ended == (503, f"{reason}\n")
    assert ready == (200, "ok\n")  # readiness is the snapshot's, not the work's


async def test_readyz_is_503_until_the_snapshot_synced_while_healthz_is_ok(
    running_work: asyncio.Future[object],
) -> None:
    cluster = Syncing()
    async with served(work=running_work, cluster=cluster) as (_, get):
        syncing = (await get("/readyz"), await get("/healthz"))
        cluster.synced = True
        synced = await get("/readyz")

    assert syncing == ((503, "cluster snapshot not synced yet\n"), (200, "ok\n"))
    assert synced == (200, "ok\n")


async def test_metrics_is_the_registry_given(running_work: asyncio.Future[object]) -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("gpu_steward_test_things", "Things.", registry=registry).inc(3)
    async with served(work=running_work, cluster=SYNCED, registry=registry) as (_, get):
        status, text = await get("/metrics")

    assert status == 200
    assert "gpu_steward_test_things_total 3.0" in text.splitlines()


async def test_healthz_gets_no_answer_while_the_loop_is_blocked(running_work: asyncio.Future[object]) -> None:
    """What a liveness probe sees of a wedged loop: a server in a thread of its own would still answer."""
    outcome: list[str] = []

    def probe(port: int) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.3) as response:
                outcome.append(f"answered {response.status}")
        except (TimeoutError, urllib.error.URLError) as exc:
            outcome.append(f"no answer: {exc}")

    async with served(work=running_work, cluster=SYNCED) as (port, get):
        prober = threading.Thread(target=probe, args=(port,))
        prober.start()
        time.sleep(1.0)  # noqa: ASYNC251 -- the point: the loop is blocked and nothing in it runs
        await asyncio.to_thread(prober.join)  # not join() here: that would block the loop as well
        after = await get("/healthz")

    assert len(outcome) == 1 and outcome[0].startswith("no answer"), outcome
    assert after == (200, "ok\n")


# --- the process ------------------------------------------------------------------------------------


async def _spawn_descheduler(*flags: str) -> asyncio.subprocess.Process:
    """`python -m gpu_steward descheduler --cluster <fixture> FLAGS...`: static mode, nothing to evict."""
    return await processes.spawn("descheduler", "--cluster", str(conftest.CLUSTER_STATE), *flags)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as response:
        return response.status, await response.text()


async def test_the_descheduler_process_serves_health_and_metrics_and_stops_on_sigterm() -> None:
    port = free_port()
    process = await _spawn_descheduler("--metrics-port", str(port))
    with processes.reaped(process):
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            # A replayed state is synced from the start, so /readyz is ready at once.
            await processes.wait_until_ok(session, f"{url}/readyz", process)
            healthz = await _get(session, f"{url}/healthz")
            metrics = await _get(session, f"{url}/metrics")
        took, log = await processes.terminate(process)

    assert healthz == (200, "ok\n")
    assert metrics[0] == 200
    assert "# TYPE gpu_steward_reclaim_candidates gauge" in metrics[1].splitlines()
    assert f'gpu_steward_build_info{{python="{buildinfo.PYTHON}",version="{buildinfo.VERSION}"}} 1.0' in metrics[1]
    assert process.returncode == 0, log
    assert took < 5, log
    assert f"descheduler serving /metrics, /healthz and /readyz on port {port}" in log
    assert "descheduler stopping on a signal" in log


async def test_while_the_first_sync_waits_for_the_api_server_the_process_is_alive_not_ready(
    tmp_path: pathlib.Path,
) -> None:
    """Live mode against an API server that refuses connections: the feeder retries, the server answers."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(kube.kubeconfig(f"http://127.0.0.1:{free_port()}")))  # nothing listens there
    port = free_port()
    process = await processes.spawn("descheduler", "--kubeconfig", str(kubeconfig), "--metrics-port", str(port))
    with processes.reaped(process):
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await processes.wait_until_ok(session, f"{url}/healthz", process)
            readyz = await _get(session, f"{url}/readyz")
        took, log = await processes.terminate(process)

    assert readyz == (503, "cluster snapshot not synced yet\n")
    assert "descheduler stopping on a signal" in log
    assert process.returncode == 0, log
    assert took < 5, log


async def test_once_with_a_metrics_port_prints_the_plan_and_exits() -> None:
    process = await _spawn_descheduler("--once", "--metrics-port", str(free_port()), "--output", "json")
    with processes.reaped(process):
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 0, stderr.decode()
    assert set(json.loads(stdout)) >= {"evictions", "spared"}


async def test_a_taken_metrics_port_exits_2_saying_so() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        process = await _spawn_descheduler("--metrics-port", str(port))
        with processes.reaped(process):
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    log = stderr.decode()
    assert process.returncode == 2, log
    assert f"descheduler: cannot serve /metrics, /healthz and /readyz on --metrics-port {port}: " in log
    assert "Address already in use" in log
    assert "Traceback" not in log
