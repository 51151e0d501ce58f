"""The `prometheus_factory` fixture: real Prometheus servers (gpu_steward.localprometheus), stopped at teardown.

    def test_x(prometheus_factory):
        server = prometheus_factory([Series("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, [(120, 3.0), (60, 4.0)])])
        ... query server.url, at server.now or later ...

Available to every test through `pytest_plugins` in tests/conftest.py; tests using it are marked `prometheus`.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator, Sequence

import pytest

from gpu_steward import localprometheus

Series = localprometheus.Series
PrometheusServer = localprometheus.PrometheusServer
start_prometheus = localprometheus.start_prometheus
openmetrics = localprometheus.openmetrics
free_port = localprometheus.free_port

StartPrometheus = Callable[..., PrometheusServer]


@pytest.fixture
def prometheus_factory(tmp_path: pathlib.Path) -> Iterator[StartPrometheus]:
    """`start(series, **start_prometheus_options) -> PrometheusServer`; all stopped at teardown."""
    started: list[PrometheusServer] = []

    def start(series: Sequence[Series], **kwargs: object) -> PrometheusServer:
        server = start_prometheus(tmp_path / f"prometheus-{len(started)}", series, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            with contextlib.suppress(Exception):
                server.stop()
