"""The reclaim loop's measuring shell: each idle window's queries (descheduler.utilisation_promql), for all
pods at once, at the store's time, judged by descheduler.utilisation.

- Time from the data: the store's "now" is asked first (`vector(time())`), and every query of the window
  is evaluated at it (one instant for all of them), so freshness is judged against the data's clock. If it
  differs from ours by more than `reclaim.max_clock_skew_seconds` (beyond the round trip), the windows we
  screened by our clock and the store's are not the same: nothing that window measured is idle (fail
  closed), said once, and the skew is the `gpu_steward_reclaim_clock_skew_seconds` gauge.
- A partial answer (`warnings`, as Thanos, Mimir or a federated store return it) cannot say which pods'
  series are missing: every pod that window measured is not idle, one log line, one metric.
- The window's queries run at most `prometheus.max_concurrent_queries` at a time, each bounded by the
  client's timeout; the first failure cancels the rest (TaskGroup).
- A failed query is one log line with the error and one metric; each pod's reason only points there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import prometheus_client

from common import prometheus, settings, snapshot
from descheduler import utilisation, utilisation_promql

logger = logging.getLogger(__name__)


class Querier(Protocol):
    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer: ...


class Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.skew = prometheus_client.Gauge(
            "gpu_steward_reclaim_clock_skew_seconds",
            "Prometheus' evaluation time minus the descheduler's clock, at the last utilisation query.",
            registry=registry)
        self.partial = prometheus_client.Counter(
            "gpu_steward_reclaim_prometheus_partial_answers",
            "Utilisation answers refused: carrying warnings, or evaluated at a skewed clock (pods stay not idle).",
            ["cause"], registry=registry)


@dataclasses.dataclass(frozen=True)
class Measured:
    assessments: dict[str, utilisation.Assessment]
    queries: int
    errors: tuple[str, ...]  # one line per failed or refused query


async def measure(
    cluster: snapshot.Snapshot,
    wanted: Mapping[int, Sequence[str]],
    *,
    thresholds: Mapping[str, float],
    querier: Querier | None,
    config: settings.Settings,
    clock: Callable[[], float],
    metrics: Metrics,
    on_query: Callable[[bool], None],
) -> Measured:
    """Assess every pod of `wanted` (window -> pod keys). `on_query(ok)` is told of each query sent."""
    assessments: dict[str, utilisation.Assessment] = {}
    errors: list[str] = []
    queries = 0
    for window in sorted(wanted):
        pods = wanted[window]
        if querier is None:
            reason = "prometheus.url is not set: no utilisation data"
            assessments.update({key: utilisation.failed(reason) for key in pods})
            continue
        window_queries = utilisation_promql.queries(
            window, config=config.prometheus, reclaim=config.descheduler.reclaim,
            kinds=utilisation.kinds_needed((cluster.pods[k] for k in pods), cluster.nodes))
        queries += 1 + len(window_queries)
        try:
            store_now, answers = await _ask(querier, window_queries, clock=clock, config=config, metrics=metrics,
                                            on_query=on_query)
        except _Refused as refused:
            errors.append(f"{window}s window: {refused}")
            reason = (refused.fail_closed_reason
                      or f"Prometheus query for the {window}s window failed (logged once per cycle)")
            assessments.update({key: utilisation.failed(reason) for key in pods})
            continue
        readings = utilisation.parse(answers, labels=config.prometheus.labels,
                                     pods={(key.split("/", 1)[0], key.split("/", 1)[1]) for key in pods})
        for key in pods:
            assessments[key] = utilisation.assess(cluster.pods[key], readings=readings, window_seconds=window,
                                                  threshold_percent=thresholds[key], config=config, now=store_now)
    return Measured(assessments, queries, tuple(errors))


class _Refused(Exception):
    """A window's data cannot be used; the message is logged once, `fail_closed_reason` told per pod."""

    def __init__(self, message: str, *, fail_closed_reason: str | None = None) -> None:
        super().__init__(message)
        self.fail_closed_reason = fail_closed_reason


async def _ask(querier: Querier, window_queries: Mapping[str, str], *, clock: Callable[[], float],
               config: settings.Settings, metrics: Metrics, on_query: Callable[[bool], None],
               ) -> tuple[float, dict[str, list[prometheus.Series]]]:
    """The store's time, then every query of the window evaluated at it (a few at a time)."""
    async def one(promql: str, at: float | None) -> prometheus.Answer:
        try:
            answer = await querier.instant(promql, time=at)
        except prometheus.PrometheusError as exc:
            on_query(False)
            raise _Refused(str(exc)) from exc
        on_query(True)
        if answer.warnings:
            metrics.partial.labels(cause="warnings").inc()
            message = f"Prometheus answered with warnings (partial data): {'; '.join(answer.warnings)[:500]}"
            raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
        return answer

    sent = clock()
    store_now = utilisation.evaluated_at((await one(utilisation_promql.TIME_QUERY, None)).series)
    received = clock()
    if store_now is None:
        metrics.partial.labels(cause="no-time").inc()
        message = "Prometheus' answer to vector(time()) carries no time"
        raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
    # Our clock at the store's evaluation lies within [sent, received]; the skew is outside that.
    skew = store_now - (sent + received) / 2
    metrics.skew.set(skew)
    bound = config.descheduler.reclaim.max_clock_skew_seconds
    if abs(skew) - (received - sent) / 2 > bound:
        metrics.partial.labels(cause="clock-skew").inc()
        message = (f"Prometheus' clock is {skew:+.0f}s from ours (more than max_clock_skew_seconds {bound:g}): "
                   "windows and freshness would not mean what they say")
        raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
    limit = asyncio.Semaphore(config.prometheus.max_concurrent_queries)

    async def bounded(promql: str) -> prometheus.Answer:
        async with limit:
            return await one(promql, store_now)

    try:
        async with asyncio.TaskGroup() as group:
            tasks = {name: group.create_task(bounded(promql)) for name, promql in window_queries.items()}
    except* _Refused as refused:
        raise refused.exceptions[0] from None
    return store_now, {name: task.result().series for name, task in tasks.items()}
