"""The I/O half of learned idle windows: read each pod's coarse utilisation history, rarely and in bounded
chunks, and hand the reclaim cycle each learning pod's window (`descheduler.reclaim.idle_learning` decides).

Cost: one range query, `max by (namespace, pod)` of each pod's peak per `step_seconds`, over only the history
not read yet: at start (or after failures) `chunk_seconds` of it per cycle until the look-back is read, then
every `refresh_seconds` the new part. Each GPU's raw samples are read once in all; what is kept per pod is a
few numbers (`idle_learning.History`), not its samples. After each read the pool of all pods' stretches
(`idle_learning.pool`) is built once, O(stretches in the look-back). No tier learning: no query at all.

Fails closed: no range-capable Prometheus client, a failed or malformed query, or history older than
`refresh_seconds` (plus a step) means no learned window — every pod keeps its tier window, and says why.
A pod given a learned window W is re-screened with W (`reclaim.screen`: scheduled longer than W, cooldowns)
and then judged idle over W by the normal fail-closed utilisation query, one per distinct window.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import prometheus_client

from common import prometheus, settings, snapshot
from descheduler import cooldowns, policy, reclaim
from descheduler.reclaim import idle_learning, utilisation

logger = logging.getLogger(__name__)


@runtime_checkable
class RangeQuerier(Protocol):
    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]: ...


def query(*, config: settings.Prometheus, step_seconds: float) -> str:
    """Each pod's peak utilisation (%) per step, whole GPUs and MIG slices (ratio x 100) alike, grouped by
    every spelling of the pod and namespace labels: `pod_of()` picks the one that names the workload. (The
    utilisation query's `label_replace` chain would run at every step of every series: 10x the cost.)"""
    mig = config.labels.mig_profile
    by = ", ".join(sorted({*config.labels.namespace, *config.labels.pod}))
    return (f'max by ({by}) (max_over_time({config.gpu_util_metric}{{{mig}=""}}[{step_seconds:g}s]) or '
            f'max_over_time({config.mig_activity_metric}{{{mig}!=""}}[{step_seconds:g}s]) * 100)')


def pod_of(metric: Mapping[str, str], *, labels: settings.PrometheusLabels) -> tuple[str, str] | None:
    """(namespace, pod) of a series: in each list of spellings the last non-empty one wins, as in the
    utilisation query (`exported_pod` after a rename)."""
    namespace = [metric[k] for k in labels.namespace if metric.get(k)]
    pod = [metric[k] for k in labels.pod if metric.get(k)]
    return (namespace[-1], pod[-1]) if namespace and pod else None


def _points(row: Mapping[str, Any]) -> list[tuple[float, float]]:
    out = []
    for t, v in row.get("values") or ():
        try:
            out.append((float(t), float(v)))
        except (TypeError, ValueError):
            out.append((float(t), math.nan))
    return out


@dataclasses.dataclass
class _Read:
    start: float  # history is read from here ...
    end: float  # ... to here, contiguously
    threshold: float  # the idle threshold it was folded at


class Learner:
    """Per-descheduler state: the histories folded so far. `at_once` (`gpu-steward descheduler --once`): read
    the whole look-back in the first cycle (`lookback_seconds / chunk_seconds` range queries, one after the other),
    so that a single cycle can show learned windows. `until` (benchmarks only): read no history after it,
    to learn on one part of a trace and judge on another. Metrics: `gpu_steward_reclaim_history_queries_total`,
    `..._history_errors_total` (a failed read: one log line and this), `..._history_fresh` (1: learned windows
    apply; 0: tier windows, history not read yet or stale)."""

    def __init__(self, *, config: settings.Settings, prometheus: object | None, until: float | None = None,
                 registry: prometheus_client.CollectorRegistry | None = None, at_once: bool = False) -> None:
        self._config = config
        self._at_once = at_once
        self._querier = prometheus if isinstance(prometheus, RangeQuerier) else None
        self._until = until
        self._histories: dict[tuple[str, str], idle_learning.History] = {}
        self._pool: idle_learning.Pool | None = None  # of `_histories`, built when first needed after a read
        self._read: _Read | None = None
        self.queries = 0
        self.errors = 0
        registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._queries = prometheus_client.Counter(
            "gpu_steward_reclaim_history_queries", "Range queries reading learned idle windows' history.",
            registry=registry)
        self._errors = prometheus_client.Counter(
            "gpu_steward_reclaim_history_errors", "Failed history reads (learned windows wait; tier windows apply).",
            registry=registry)
        self._fresh = prometheus_client.Gauge(
            "gpu_steward_reclaim_history_fresh", "1: the look-back is read and fresh, learned windows apply.",
            registry=registry)

    @property
    def _learning(self) -> settings.LearnedWindow:
        return self._config.descheduler.reclaim.learned_window

    def _end(self, now: float) -> float:
        step = self._learning.step_seconds
        end = now if self._until is None else min(now, self._until)
        return math.floor(end / step) * step

    @property
    def pool(self) -> idle_learning.Pool:
        """All pods' stretches read so far (`idle_learning.pool`), built once after each read."""
        if self._pool is None:
            self._pool = idle_learning.pool(self._histories.values(), step_seconds=self._learning.step_seconds,
                                            min_stretches=self._learning.min_stretches)
        return self._pool

    def fresh(self, now: float) -> bool:
        """The whole look-back is read, up to `refresh_seconds` (and a step) ago."""
        learning = self._learning
        read = self._read
        return read is not None and read.end > read.start and \
            read.end >= self._end(now) - learning.refresh_seconds - learning.step_seconds

    async def read(self, *, threshold: float, now: float) -> bool:
        """One range query at most: the next chunk of history not read yet, if any is due. True: one was read."""
        learning = self._learning
        end = self._end(now)
        if self._read is not None and (self._read.threshold != threshold or self._read.end > end):
            self._read = None  # another threshold, or the clock went back: fold again from scratch
        if self._read is None:
            self._histories, self._pool = {}, None
            start = end - math.ceil(learning.lookback_seconds / learning.step_seconds) * learning.step_seconds
            self._read = _Read(start, start, threshold)
        if self._read.end >= end - (learning.refresh_seconds if self.fresh(now) else 0) or self._querier is None:
            return False
        start = self._read.end + learning.step_seconds
        stop = min(end, self._read.end + learning.chunk_seconds)
        self.queries += 1
        self._queries.inc()
        try:
            rows = await self._querier.query_range(query(config=self._config.prometheus,
                                                         step_seconds=learning.step_seconds),
                                                   start=start, end=stop, step=learning.step_seconds)
        except prometheus.PrometheusError as exc:
            self.errors += 1
            self._errors.inc()
            logger.warning("reclaim: idle history not read (learned idle windows wait; tier windows apply): %s", exc)
            return False
        for row in rows:
            key = pod_of(row.get("metric") or {}, labels=self._config.prometheus.labels)
            if key is not None:
                self._histories[key] = idle_learning.fold(
                    self._histories.get(key, idle_learning.History()), _points(row),
                    step_seconds=learning.step_seconds, threshold_percent=threshold)
        self._read.end = stop
        since = end - learning.lookback_seconds
        self._histories = {k: h.since(since) for k, h in self._histories.items()
                           if h.stretches or (h.last is not None and h.last >= since)}
        self._pool = None
        return True

    async def screen(
        self,
        cluster: snapshot.Snapshot,
        screened: reclaim.Screened,
        *,
        policies: Mapping[str, policy.ReclaimPolicy],
        state: cooldowns.State,
        now: float,
    ) -> tuple[dict[str, policy.ReclaimPolicy | str], dict[str, str]]:
        """`screened` with each learning pod screened again at its learned window, and each learning pod's
        reason (for its assessment, so that its Event and the dry-run output say it)."""
        tier_windows = {}
        for name, pc in cluster.priority_classes.items():
            tier, on = policies.get(name), idle_learning.enabled(pc, names=self._config.names)  # a problem: off
            if tier and tier.reclaimable and tier.idle_seconds and on.value:
                tier_windows[name] = tier.idle_seconds
        if not tier_windows:
            return dict(screened), {}
        threshold = max(policies[name].threshold_percent for name in tier_windows)
        while await self.read(threshold=threshold, now=now) and self._at_once and not self.fresh(now):
            pass  # `--once`: the next chunk at once, until the look-back is read (or a read fails)
        self._fresh.set(1 if self.fresh(now) else 0)
        learned = idle_learning.windows(
            (cluster.pods[key] for key in screened), tier_windows=tier_windows,
            histories=self._histories if self.fresh(now) else None,
            since=self._end(now) - self._learning.lookback_seconds, pool=self.pool, config=self._learning)
        out = dict(screened)
        for key, found in learned.items():
            pod = cluster.pods[key]
            if found.learned and pod.priority_class_name:
                narrowed = dataclasses.replace(policies[pod.priority_class_name], idle_seconds=found.window_seconds)
                out[key] = reclaim.screen(pod, cluster=cluster, policies={pod.priority_class_name: narrowed},
                                          state=state, config=self._config, now=now)
        return out, {key: found.reason for key, found in learned.items()}


def explained(assessments: Mapping[str, utilisation.Assessment],
              reasons: Mapping[str, str]) -> dict[str, utilisation.Assessment]:
    """Each learning pod's assessment with its window's reason appended (it flows into the eviction's reason)."""
    return {key: dataclasses.replace(a, reason=f"{a.reason}; {reasons[key]}") if key in reasons else a
            for key, a in assessments.items()}

