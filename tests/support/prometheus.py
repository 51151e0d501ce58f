"""The `prometheus_factory` fixture: real Prometheus servers (gpu_steward_lab.localprometheus), stopped at teardown.

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
from typing import Any

import prometheus_client
import pytest

from common import prometheus, settings, snapshot
from descheduler.reclaim import measurement, utilisation, utilisation_promql
from gpu_steward_lab import localprometheus

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
    """Answers the reclaim queries (descheduler.reclaim.utilisation_promql) as Prometheus would for `pods`, each with
    one GPU scraped every `every` seconds up to 5 s before the evaluation, at `util` percent: per device the
    samples, peak and last sample of the live stretch (instant) and of each part (range, one step per part):
    for tests where the API side is under test (the real Prometheus is in
    tests/integration/test_reclaim_prometheus.py)."""

    def __init__(self, pods: Mapping[tuple[str, str, str], float], *, now: float, every: float = 15.0) -> None:
        self.pods = pods  # (namespace, pod, node) -> util percent
        self.now = now
        self.every = every
        self.asked: list[str] = []
        self.newest: dict[str, float] = {}  # pod name -> its newest sample, where not its util (turned busy since)

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        self.asked.append(promql)
        at = self.now if time is None else time
        if promql == "vector(time())":
            return prometheus.Answer([{"metric": {}, "value": [at, repr(at)]}])
        if utilisation_promql.RECHECK in promql:
            return prometheus.Answer(self._newest(promql, at))
        rows = self._rows(promql, [at])
        return prometheus.Answer([{"metric": metric, "value": values[0]} for metric, values in rows])

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        self.asked.append(promql)
        steps = [start + k * step for k in range(round((end - start) / step) + 1)]
        return [{"metric": metric, "values": values} for metric, values in self._rows(promql, steps)]

    def _newest(self, promql: str, at: float) -> list[prometheus.Series]:
        """The answer to `utilisation_promql.newest`: the store's time, and each named pod's newest sample (5 s old)."""
        tag = utilisation_promql.RECHECK
        rows: list[prometheus.Series] = [{"metric": {tag: "now"}, "value": [at, repr(at)]}]
        named = {name.replace("\\\\", "")  # one name, or several in one regex of escaped names
                 for names in re.findall(r'[{,]pod=~?"([^"]+)"', promql) for name in names.split("|")}
        for (namespace, pod, node), util in self.pods.items():
            if pod not in named:
                continue
            metric = {"namespace": namespace, "pod": pod, "Hostname": node, "gpu": "0", "UUID": f"GPU-{node}-0"}
            rows += [{"metric": {**metric, tag: "gpu_value"}, "value": [at, repr(self.newest.get(pod, util))]},
                     {"metric": {**metric, tag: "gpu_last"}, "value": [at, repr(at - 5.0)]}]
        return rows

    def _rows(self, promql: str, steps: list[float]) -> list[tuple[dict[str, str], list[list[Any]]]]:
        span = re.search(r"\[(\d+)(ms|s)\]", promql)
        seconds = int(span.group(1)) / (1000 if span.group(2) == "ms" else 1) if span else 0.0
        rows = []
        for (namespace, pod, node), util in self.pods.items():
            metric = {"namespace": namespace, "pod": pod, "Hostname": node, "gpu": "0", "UUID": f"GPU-{node}-0"}
            values: list[list[Any]] = []
            for at in steps:
                if "timestamp(" in promql:
                    value = at - 5.0
                elif "count_over_time(" in promql:
                    value = float(seconds // self.every)  # the samples of the stretch (none in 1 ms)
                else:
                    value = util
                values.append([at, repr(value)])
            rows.append((metric, values))
        return rows


class StoreAt:
    """A real Prometheus client whose queries without a time are evaluated at the test's store clock (`now[0]`)
    instead of the server's wall clock: the data is written around that time, and the test moves the store's time
    on (as while a slow API answers). `asked`: (store time, query) of each instant query."""

    def __init__(self, client: prometheus.Client, now: list[float]) -> None:
        self._client = client
        self.now = now
        self.asked: list[tuple[float, str]] = []

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        self.asked.append((self.now[0], promql))
        return await self._client.instant(promql, time=self.now[0] if time is None else time)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        return await self._client.query_range(promql, start=start, end=end, step=step)


async def judge(url: str, cluster: snapshot.Snapshot, keys: Sequence[str], *, window: int, threshold_percent: float,
                config: settings.Settings, now: float) -> dict[str, utilisation.Assessment]:
    """The pods `keys` of `cluster` judged over one window at store time `now`, as a `--once` cycle judges them
    (`measurement.measure` reading every part back first, from a cold cache); a failed query fails the test."""
    client = prometheus.Client(config.prometheus.model_copy(update={"url": url}))
    try:
        measured = await measurement.measure(
            cluster, {window: list(keys)}, thresholds=dict.fromkeys(keys, threshold_percent),
            querier=StoreAt(client, [now]), config=config, clock=lambda: now,
            metrics=measurement.Metrics(prometheus_client.CollectorRegistry()), on_query=lambda ok: None,
            whole=lambda line: None)
    finally:
        client.close()
    assert not measured.errors, measured.errors
    return measured.assessments
