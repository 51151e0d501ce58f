"""The reclaim loop's measuring shell: one PromQL query per idle window, judged at the store's time.

- Time from the data: each query is evaluated at the store's own "now" (no `time=`), and every answer
  carries that time (a `time` row). Freshness is judged against it. If it differs from our clock by more
  than `reclaim.max_clock_skew_seconds` (after the round trip), the windows we screened by our clock and
  the store's windows are not the same: nothing that query measured is idle (fail closed), and the skew
  is one log line and the `gpu_steward_reclaim_clock_skew_seconds` gauge.
- A partial answer (`warnings`, as Thanos, Mimir or a federated store return it) cannot say which pods'
  series are missing: every pod that query measured is not idle, one log line, one metric.
- A failed query is one log line with the error and one metric; each pod's reason only points there.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

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


def _rows_of(rows: Sequence[Mapping[str, Any]], pods: Sequence[str]) -> list[Mapping[str, Any]]:
    """The rows about `pods`: an answer covers every pod with DCGM series, and parsing them is the cost."""
    wanted = {tuple(key.split("/", 1)) for key in pods}
    out = []
    for row in rows:
        metric = row.get("metric") or {}
        if (metric.get(utilisation.NAMESPACE), metric.get(utilisation.POD)) in wanted:
            out.append(row)
    return out


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
    reclaim = config.descheduler.reclaim
    assessments: dict[str, utilisation.Assessment] = {}
    errors: list[str] = []
    queries = 0
    for window in sorted(wanted):
        pods = wanted[window]
        if querier is None:
            reason = "prometheus.url is not set: no utilisation data"
            assessments.update({key: utilisation.failed(reason) for key in pods})
            continue
        queries += 1
        promql = utilisation_promql.query(window, config=config.prometheus, reclaim=reclaim,
                                          below_percent=max((thresholds[k] for k in pods), default=0.0))
        sent = clock()
        try:
            answer = await querier.instant(promql)
        except prometheus.PrometheusError as exc:
            on_query(False)
            errors.append(f"{window}s window: {exc}")
            refused = f"Prometheus query for the {window}s window failed (logged once per cycle)"
            assessments.update({key: utilisation.failed(refused) for key in pods})
            continue
        received = clock()
        on_query(True)
        store_now = utilisation.evaluated_at(answer.series)
        refusal = _refusal(answer, store_now, sent=sent, received=received, config=reclaim, metrics=metrics)
        if refusal is not None or store_now is None:
            refusal = refusal or "Prometheus' answer carries no evaluation time"
            errors.append(f"{window}s window: {refusal}")
            assessments.update({key: utilisation.failed(f"{refusal} (fail closed)") for key in pods})
            continue
        readings = utilisation.parse(_rows_of(answer.series, pods))
        for key in pods:
            assessments[key] = utilisation.assess(cluster.pods[key], readings=readings, window_seconds=window,
                                                  threshold_percent=thresholds[key], config=config, now=store_now)
    return Measured(assessments, queries, tuple(errors))


def _refusal(answer: prometheus.Answer, store_now: float | None, *, sent: float, received: float,
             config: settings.Reclaim, metrics: Metrics) -> str | None:
    """Why an answer cannot be used, or None."""
    if answer.warnings:
        metrics.partial.labels(cause="warnings").inc()
        return f"Prometheus answered with warnings (partial data): {'; '.join(answer.warnings)[:500]}"
    if store_now is None:
        metrics.partial.labels(cause="no-time").inc()
        return "Prometheus' answer carries no evaluation time"
    # Our clock at the store's evaluation lies within [sent, received]; the skew is outside that.
    skew = store_now - (sent + received) / 2
    metrics.skew.set(skew)
    if abs(skew) - (received - sent) / 2 > config.max_clock_skew_seconds:
        metrics.partial.labels(cause="clock-skew").inc()
        return (f"Prometheus' clock is {skew:+.0f}s from ours (more than max_clock_skew_seconds "
                f"{config.max_clock_skew_seconds:g}): windows and freshness would not mean what they say")
    return None
