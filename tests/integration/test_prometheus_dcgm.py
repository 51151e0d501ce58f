"""The Prometheus client and the DCGM occupancy query against a real Prometheus (and a few fake ones)."""

from __future__ import annotations

import asyncio
import pathlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from common import dcgm, prometheus, settings
from tests.support.prometheus import Series, StartPrometheus, free_port

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
MIG = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
EVERY_30S_FOR_5M = [(ago, 1.0) for ago in range(300, 0, -30)]


def dcgm_labels(gpu: str, **extra: str) -> dict[str, str]:
    """The labels dcgm-exporter puts on every per-GPU series (see the fixtures' README)."""
    return {"gpu": gpu, "UUID": f"GPU-{gpu}-uuid", "device": f"nvidia{gpu}", "modelName": "NVIDIA H100", **extra}


HISTORY = [
    # dcgm-exporter 4.x: lowercase hostname, pod attribution
    Series(
        UTIL, dcgm_labels("0", hostname="node-a", namespace="team-a", pod="train-0", container="c"), EVERY_30S_FOR_5M
    ),
    # older exporter: capitalised Hostname
    Series(
        UTIL, dcgm_labels("1", Hostname="node-b", namespace="team-a", pod="train-1", container="c"), EVERY_30S_FOR_5M
    ),
    # scraped without honor_labels: Prometheus renamed them, pod/namespace are the exporter's own
    Series(
        UTIL,
        dcgm_labels(
            "2",
            Hostname="node-b",
            exported_namespace="team-b",
            exported_pod="infer-3",
            namespace="gpu-operator",
            pod="dcgm-exporter-x7",
        ),
        EVERY_30S_FOR_5M,
    ),
    # a free GPU: labels present but empty, as in NVIDIA's quick-start
    Series(UTIL, dcgm_labels("3", Hostname="node-b", namespace="", pod="", container=""), EVERY_30S_FOR_5M),
    # MIG: activity ratio, two pods on instances of GPU 0 of node-m
    Series(
        MIG,
        dcgm_labels("0", Hostname="node-m", GPU_I_PROFILE="3g.40gb", GPU_I_ID="1", namespace="ns", pod="mig-a"),
        EVERY_30S_FOR_5M,
    ),
    Series(
        MIG,
        dcgm_labels("0", Hostname="node-m", GPU_I_PROFILE="3g.40gb", GPU_I_ID="2", namespace="ns", pod="mig-b"),
        [(ago, 0.5) for ago, _ in EVERY_30S_FOR_5M[:-1]],
    ),
    # a pod that left GPU 4 of node-a three minutes ago: too old to count
    Series(UTIL, dcgm_labels("4", hostname="node-a", namespace="team-a", pod="gone"), [(600, 1.0), (180, 1.0)]),
]


def client(url: str, **overrides: Any) -> prometheus.Client:
    return prometheus.Client(settings.Prometheus(url=url, **overrides))


async def test_occupancy_from_real_prometheus(prometheus_factory: StartPrometheus) -> None:
    server = prometheus_factory(HISTORY)
    config = settings.Prometheus(url=server.url)
    result = await prometheus.Client(config).query(dcgm.occupancy_query(config), time=server.now)
    occupancy, problems = dcgm.parse_occupancy(result, labels=config.labels)
    assert occupancy == {
        "node-a": {0: "team-a/train-0"},
        "node-b": {1: "team-a/train-1", 2: "team-b/infer-3"},
        "node-m": {0: "ns/mig-a"},  # both instances seen at the same time: the first pod key
    }
    assert problems == [
        '{Hostname="node-b",gpu="3"}: no pod label (pod/exported_pod empty): GPU not attributed to a pod'
    ]


async def test_occupancy_window_follows_the_setting(prometheus_factory: StartPrometheus) -> None:
    server = prometheus_factory(HISTORY)
    config = settings.Prometheus(url=server.url, occupancy_max_age_seconds=240)
    result = await prometheus.Client(config).query(dcgm.occupancy_query(config), time=server.now)
    occupancy, _ = dcgm.parse_occupancy(result, labels=config.labels)
    assert occupancy["node-a"] == {0: "team-a/train-0", 4: "team-a/gone"}


async def test_backfill_and_live_scrape_together(prometheus_factory: StartPrometheus) -> None:
    port = free_port()
    history = [Series("backfilled", {"job": "old"}, [(60, 7.0), (5, 8.0)])]
    server = prometheus_factory(history, scrape_targets=[f"127.0.0.1:{port}"], port=port)  # scrapes itself
    api = client(server.url)
    for _ in range(200):  # the first scrape lands about one interval after start
        if await api.query('up{job="test"} == 1'):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("prometheus never scraped itself")
    assert [s["value"][1] for s in await api.query("backfilled")] == ["8"]


async def test_bad_promql_is_a_prometheus_error(prometheus_factory: StartPrometheus) -> None:
    server = prometheus_factory([])
    with pytest.raises(prometheus.PrometheusError, match=r"query failed.*HTTP Status Code 400"):
        await client(server.url).query("max by (")


async def test_stopped_server_fails_fast(prometheus_factory: StartPrometheus) -> None:
    server = prometheus_factory([])
    server.stop()
    # A generous timeout: the error must be the refused connection, not the timeout.
    with pytest.raises(prometheus.PrometheusError, match=r"cannot reach.*Connection refused"):
        await client(server.url, timeout_seconds=60).query("up")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        pytest.param("not-a-url", "cannot reach not-a-url: Invalid URL", id="no-scheme"),
        pytest.param("ftp://127.0.0.1:1", "cannot reach ftp://127.0.0.1:1: Not supported URL scheme ftp", id="scheme"),
        pytest.param("http://", "cannot reach http:.*Invalid URL", id="no-host"),
    ],
)
async def test_bad_url(url: str, match: str) -> None:
    with pytest.raises(prometheus.PrometheusError, match=match):
        await client(url).query("up")


async def test_unset_url_is_refused() -> None:
    with pytest.raises(ValueError, match=r"prometheus\.url is not set"):
        prometheus.Client(settings.Prometheus())


async def test_timeout_on_a_server_that_never_answers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(prometheus.PrometheusError, match=r"timed out after 0\.3s"):
            await client(f"http://127.0.0.1:{port}", timeout_seconds=0.3).query("up")


Handler = Callable[[web.Request], web.Response]
FORM = web.RequestKey("form", dict[str, str])


@pytest.fixture
async def fake_prometheus() -> AsyncIterator[Callable[[Handler], Any]]:
    runners: list[web.AppRunner] = []

    async def serve(handler: Handler) -> str:
        async def route(request: web.Request) -> web.Response:
            request[FORM] = {k: str(v) for k, v in (await request.post()).items()}  # a form-encoded POST
            return handler(request)

        app = web.Application()
        app.router.add_route("*", "/api/v1/query", route)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield serve
    for runner in runners:
        await runner.cleanup()


OK = {"status": "success", "data": {"resultType": "vector", "result": []}}


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        pytest.param(web.Response(text="<html>proxy error</html>"), "malformed answer", id="not-json"),
        pytest.param(web.json_response({"status": "success"}), "malformed answer.*'data'", id="no-data"),
        pytest.param(
            web.json_response({"status": "success", "data": {"result": [1, 2]}}),
            "malformed answer.*expected a list of series",
            id="not-series",
        ),
        pytest.param(web.Response(status=503, text="overloaded"), "HTTP Status Code 503", id="http-503"),
    ],
)
async def test_malformed_answers(fake_prometheus: Any, answer: web.Response, match: str) -> None:
    url = await fake_prometheus(lambda request: answer)
    with pytest.raises(prometheus.PrometheusError, match=match):
        await client(url).query("up")


async def test_headers_and_rotating_bearer_token(fake_prometheus: Any, tmp_path: pathlib.Path) -> None:
    seen: list[tuple[str | None, str | None, str]] = []

    def handler(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), request.headers.get("X-Scope-OrgID"), request[FORM]["time"]))
        return web.json_response(OK)

    url = await fake_prometheus(handler)
    token = tmp_path / "token"
    token.write_text("first\n")
    api = client(url, headers={"X-Scope-OrgID": "gpu"}, bearer_token_file=token)
    await api.query("up", time=100.0)
    token.write_text("second")
    await api.query("up", time=200.5)
    assert seen == [("Bearer first", "gpu", "100.000"), ("Bearer second", "gpu", "200.500")]


async def test_unreadable_token_file(fake_prometheus: Any, tmp_path: pathlib.Path) -> None:
    url = await fake_prometheus(lambda request: web.json_response(OK))
    with pytest.raises(prometheus.PrometheusError, match=r"bearer token file .*missing"):
        await client(url, bearer_token_file=tmp_path / "missing").query("up")


async def test_warnings_are_kept_and_the_query_goes_in_the_body(fake_prometheus: Any) -> None:
    """Thanos answers a partial response with `warnings`; the caller must see them. The query is several KB:
    it goes in the POST body, not the URL (proxies cap URLs at a few KB)."""
    seen: list[tuple[str, str, str]] = []

    def handler(request: web.Request) -> web.Response:
        seen.append((request.method, request.query_string, request[FORM]["query"]))
        return web.json_response({**OK, "warnings": ["partial response: store 10.0.0.1:10901 unavailable"]})

    url = await fake_prometheus(handler)
    long_query = "up or " * 2000 + "up"
    answer = await client(url).instant(long_query)
    assert answer == prometheus.Answer(series=[], warnings=("partial response: store 10.0.0.1:10901 unavailable",))
    assert seen == [("POST", "", long_query)]  # no `time`: the store's own now


async def test_errors_do_not_repeat_the_query(prometheus_factory: StartPrometheus) -> None:
    server = prometheus_factory([])
    with pytest.raises(prometheus.PrometheusError) as error:
        await client(server.url).query("max by (" + "x" * 3000)
    assert "xxxx" not in str(error.value) and len(str(error.value)) < 500
