"""The `prometheus_factory` fixture: real Prometheus servers (gpu_steward.localprometheus), stopped at teardown.

    def test_x(prometheus_factory):
        server = prometheus_factory([Series("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, [(120, 3.0), (60, 4.0)])])
        ... query server.url, at server.now or later ...

Available to every test through `pytest_plugins` in tests/conftest.py; tests using it are marked `prometheus`.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from common import prometheus
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


class DcgmStandIn:
    """Answers the reclaim queries (descheduler.utilisation_promql) as Prometheus would for `pods`, each with
    one GPU scraped every `every` seconds up to `now`, at `util` percent: for tests where the API side is
    under test (the real Prometheus is in tests/integration/test_reclaim_prometheus.py)."""

    def __init__(self, pods: Mapping[tuple[str, str, str], float], *, now: float, every: float = 15.0) -> None:
        self.pods = pods  # (namespace, pod, node) -> util percent
        self.now = now
        self.every = every
        self.asked: list[str] = []

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        self.asked.append(promql)
        at = self.now if time is None else time
        if promql == "vector(time())":
            return prometheus.Answer([{"metric": {}, "value": [at, repr(at)]}])
        offset = re.search(r" offset (\d+)s\)", promql)
        ago = float(offset.group(1)) if offset else 0.0
        rows = []
        for (namespace, pod, node), util in self.pods.items():
            metric = {"namespace": namespace, "pod": pod, "Hostname": node}
            if "_over_time(" in promql and "count_over_time(" not in promql:
                value = util
            else:
                metric = {**metric, "gpu": "0", "UUID": f"GPU-{node}-0"}
                length = re.search(r"\[(\d+)s\]", promql)
                # the sample grid ends 5 s before `now`: `every`-spaced samples per part, the last one per boundary
                value = float(length.group(1)) / self.every if length else at - ago - 5.0
            rows.append({"metric": metric, "value": [at, repr(value)]})
        return prometheus.Answer(rows)
