"""The reclaim loop's measuring shell: each idle window's queries (descheduler.utilisation_promql), for all
pods at once, at the store's time, judged by descheduler.utilisation.

- Time from the data: the store's "now" is asked first (`vector(time())`, once a cycle), and every query
  of every window is evaluated at it (one instant for all of them; a query two windows share is asked
  once), so freshness is judged against the data's clock. If it differs from ours by more than
  `reclaim.max_clock_skew_seconds` (beyond the round trip), the windows we screened by our clock and the
  store's are not the same: nothing is idle this cycle (fail closed), said once, and the skew is the
  `gpu_steward_reclaim_clock_skew_seconds` gauge.
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
    if querier is None or not wanted:
        reason = "prometheus.url is not set: no utilisation data"
        return Measured({key: utilisation.failed(reason) for pods in wanted.values() for key in pods}, 0, ())
    asker = _Asker(querier, config=config, metrics=metrics, on_query=on_query)
    try:
        store_now = await asker.store_time(clock)
    except _Refused as refused:
        reason = refused.fail_closed_reason or "Prometheus query for the store's time failed (logged once per cycle)"
        return Measured({key: utilisation.failed(reason) for pods in wanted.values() for key in pods}, asker.sent,
                        (f"store's time: {refused}",))
    errors: list[str] = []
    for window in sorted(wanted):
        pods = wanted[window]
        window_queries = utilisation_promql.queries(
            window, config=config.prometheus, reclaim=config.descheduler.reclaim,
            kinds=utilisation.kinds_needed((cluster.pods[k] for k in pods), cluster.nodes))
        try:
            answers = await asker.answers(window_queries, at=store_now)
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
    return Measured(assessments, asker.sent, tuple(errors))


class _Refused(Exception):
    """Data that cannot be used; the message is logged once, `fail_closed_reason` told per pod."""

    def __init__(self, message: str, *, fail_closed_reason: str | None = None) -> None:
        super().__init__(message)
        self.fail_closed_reason = fail_closed_reason


class _Asker:
    """One cycle's queries: the store's time once, then every window's queries at it, a query the windows
    share (the newest sample's time) asked once."""

    def __init__(self, querier: Querier, *, config: settings.Settings, metrics: Metrics,
                 on_query: Callable[[bool], None]) -> None:
        self._querier = querier
        self._config = config
        self._metrics = metrics
        self._on_query = on_query
        self._answers: dict[str, prometheus.Answer] = {}
        self._limit = asyncio.Semaphore(config.prometheus.max_concurrent_queries)
        self.sent = 0

    async def _one(self, promql: str, at: float | None) -> prometheus.Answer:
        self.sent += 1
        try:
            async with self._limit:
                answer = await self._querier.instant(promql, time=at)
        except prometheus.PrometheusError as exc:
            self._on_query(False)
            raise _Refused(str(exc)) from exc
        self._on_query(True)
        if answer.warnings:
            self._metrics.partial.labels(cause="warnings").inc()
            message = f"Prometheus answered with warnings (partial data): {'; '.join(answer.warnings)[:500]}"
            raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
        return answer

    async def store_time(self, clock: Callable[[], float]) -> float:
        """The store's "now", checked against our clock."""
        sent = clock()
        store_now = utilisation.evaluated_at((await self._one(utilisation_promql.TIME_QUERY, None)).series)
        received = clock()
        if store_now is None:
            self._metrics.partial.labels(cause="no-time").inc()
            message = "Prometheus' answer to vector(time()) carries no time"
            raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
        # Our clock at the store's evaluation lies within [sent, received]; the skew is outside that.
        skew = store_now - (sent + received) / 2
        self._metrics.skew.set(skew)
        bound = self._config.descheduler.reclaim.max_clock_skew_seconds
        if abs(skew) - (received - sent) / 2 > bound:
            self._metrics.partial.labels(cause="clock-skew").inc()
            message = (f"Prometheus' clock is {skew:+.0f}s from ours (more than max_clock_skew_seconds {bound:g}): "
                       "windows and freshness would not mean what they say")
            raise _Refused(message, fail_closed_reason=f"{message} (fail closed)")
        return store_now

    async def answers(self, queries: Mapping[str, str], *, at: float) -> dict[str, list[prometheus.Series]]:
        """Every query's answer at `at`; the first failure cancels the others (TaskGroup)."""
        missing = sorted({promql for promql in queries.values() if promql not in self._answers})
        try:
            async with asyncio.TaskGroup() as group:
                tasks = {promql: group.create_task(self._one(promql, at)) for promql in missing}
        except* _Refused as refused:
            raise refused.exceptions[0] from None
        self._answers.update({promql: task.result() for promql, task in tasks.items()})
        return {name: self._answers[promql].series for name, promql in queries.items()}
