"""The I/O half of learned idle windows: read each pod's coarse utilisation history, rarely and in bounded
chunks, and hand the reclaim cycle each learning pod's window (`descheduler.reclaim.idle_learning` decides).

Cost: one range query, `max by (namespace, pod)` of each pod's peak per `step_seconds`, over only the history
not read yet: at start (or after failures) `chunk_seconds` of it per cycle until the look-back is read, then
every `refresh_seconds` the new part. Each GPU's raw samples are read once in all; what is kept per pod is a
few numbers (`idle_learning.History`), not its samples. After each read the pool of all pods' stretches
(`idle_learning.pool`) is built once, O(stretches in the look-back). No tier learning: no query at all.
All of it runs beside the reclaim cycle, not on its path (`Learner.start()`: a task started after a cycle's
evictions, the fold and pool in a worker thread); a cycle uses the newest complete refresh.

Fails closed: no range-capable Prometheus client, a failed or malformed query, or history older than
`refresh_seconds` (plus a step) means no learned window — every pod keeps its tier window, and says why.
A pod given a learned window W is re-screened with W (`reclaim.screen`: scheduled longer than W, cooldowns)
and then judged idle over W by the normal fail-closed utilisation query, one per distinct window.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import prometheus_client

from common import dcgm, prometheus, settings, snapshot
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
    gpu = dcgm.selector(config.gpu_util_metric, f'{mig}=""', config=config)
    slices = dcgm.selector(config.mig_activity_metric, f'{mig}!=""', config=config)
    return (f"max by ({by}) (max_over_time({gpu}[{step_seconds:g}s]) or "
            f"max_over_time({slices}[{step_seconds:g}s]) * 100)")


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


@dataclasses.dataclass(frozen=True)
class _Read:
    start: float  # history is read from here ...
    end: float  # ... to here, contiguously
    threshold: float  # the idle threshold it was folded at


@dataclasses.dataclass(frozen=True)
class _Learned:
    """What one refresh publishes, whole: the histories folded up to `read.end`, and their pool."""

    read: _Read
    histories: Mapping[tuple[str, str], idle_learning.History]
    pool: idle_learning.Pool


def _folded(learned: _Learned, rows: list[dict[str, Any]], *, stop: float, since: float,
            labels: settings.PrometheusLabels, learning: settings.LearnedWindow) -> _Learned:
    """`learned` after one read's `rows` (up to `stop`), history before `since` forgotten, its pool built: the
    CPU-heavy part of a refresh, run in a worker thread. Builds new objects only (histories are immutable), so an
    abandoned refresh leaves `learned` as it was."""
    threshold = learned.read.threshold
    histories = dict(learned.histories)
    for row in rows:
        key = pod_of(row.get("metric") or {}, labels=labels)
        if key is not None:
            histories[key] = idle_learning.fold(histories.get(key, idle_learning.History()), _points(row),
                                                step_seconds=learning.step_seconds, threshold_percent=threshold)
    histories = {k: h.since(since) for k, h in histories.items()
                 if h.ends or (h.last is not None and h.last >= since)}
    pool = idle_learning.pool(histories.values(), step_seconds=learning.step_seconds,
                              min_stretches=learning.min_stretches)
    return _Learned(dataclasses.replace(learned.read, end=stop), histories, pool)


class Learner:
    """Per-descheduler state: the histories folded so far, and their pool, replaced only whole by a complete
    refresh. A refresh is at most one range query (the next chunk not read yet, if one is due), bounded by
    `prometheus.timeout_seconds`, then the fold and the pool built in a worker thread (`_folded`, so the event loop
    keeps serving). In the process the reclaim cycle starts it (`start()`, after its evictions) and does not
    wait for it: a cycle always uses the newest complete refresh, and only the next cycle sees the new one. A
    refresh that fails, times out or is cancelled (`close()`: shutdown, leadership lost) leaves the previous one.
    `read()` runs one refresh to completion (replays in store time, tests). `at_once` (`gpu-steward descheduler
    --once`): read the whole look-back in the first cycle, before its plan (`lookback_seconds / chunk_seconds`
    range queries, one after the other), so that a single cycle can show learned windows. `wait` (replays in
    store time, `benchmarks/reclaim_trace.py`): each cycle runs its refresh first and uses it, as if it took no
    time, so that a replay's decisions do not depend on the machine's speed. `until` (benchmarks
    only): read no history after it, to learn on one part of a trace and judge on another. Metrics:
    `gpu_steward_reclaim_history_queries_total`, `..._history_errors_total` (a failed or timed-out read: one log
    line and this), `..._history_fresh` (1: learned windows apply; 0: tier windows, history not read yet or
    stale)."""

    def __init__(self, *, config: settings.Settings, prometheus: object | None, until: float | None = None,
                 registry: prometheus_client.CollectorRegistry | None = None, at_once: bool = False,
                 wait: bool = False) -> None:
        self._config = config
        self._at_once = at_once
        self.wait = wait
        self._querier = prometheus if isinstance(prometheus, RangeQuerier) else None
        self._until = until
        self._learned: _Learned | None = None
        self._lock = asyncio.Lock()  # one refresh at a time
        self._task: asyncio.Task[bool] | None = None  # the refresh running beside the cycles, if any
        self._threshold: float | None = None  # of the learning tiers, at the last screen (None: no tier learns)
        self.queries = 0
        self.errors = 0
        registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._queries = prometheus_client.Counter(
            "gpu_steward_reclaim_history_queries", "Range queries reading learned idle windows' history.",
            registry=registry)
        self._errors = prometheus_client.Counter(
            "gpu_steward_reclaim_history_errors",
            "Failed or timed-out history reads (learned windows wait; tier windows apply).", registry=registry)
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
    def _histories(self) -> Mapping[tuple[str, str], idle_learning.History]:
        return self._learned.histories if self._learned is not None else {}

    @property
    def pool(self) -> idle_learning.Pool:
        """All pods' stretches of the newest complete refresh (`idle_learning.pool`), built once by it."""
        return self._learned.pool if self._learned is not None else idle_learning.Pool()

    def fresh(self, now: float) -> bool:
        """The whole look-back is read, up to `refresh_seconds` (and a step) ago."""
        learning = self._learning
        read = self._learned.read if self._learned is not None else None
        return read is not None and read.end > read.start and \
            read.end >= self._end(now) - learning.refresh_seconds - learning.step_seconds

    def _base(self, *, threshold: float, end: float) -> _Learned:
        """What the next read folds into: the newest refresh, or nothing read (another threshold, or the clock
        went back: folded again from scratch)."""
        learned = self._learned
        if learned is not None and learned.read.threshold == threshold and learned.read.end <= end:
            return learned
        learning = self._learning
        start = end - math.ceil(learning.lookback_seconds / learning.step_seconds) * learning.step_seconds
        return _Learned(_Read(start, start, threshold), {}, idle_learning.Pool())

    def due(self, *, threshold: float, now: float) -> bool:
        """A refresh would read something now."""
        end = self._end(now)
        base = self._base(threshold=threshold, end=end)
        fresh = base is self._learned and self.fresh(now)
        return self._querier is not None and base.read.end < end - (self._learning.refresh_seconds if fresh else 0)

    async def read(self, *, threshold: float, now: float) -> bool:
        """One refresh, to completion: the next chunk of history not read yet, if any is due, folded and
        published whole. True: one was read."""
        async with self._lock:
            return await self._refresh(threshold=threshold, now=now)

    async def _refresh(self, *, threshold: float, now: float) -> bool:
        learning = self._learning
        end = self._end(now)
        base = self._base(threshold=threshold, end=end)
        if base is not self._learned:
            self._learned = base  # the old history is of another threshold or from the future: never used
        if self._querier is None or not self.due(threshold=threshold, now=now):
            return False
        start = base.read.end + learning.step_seconds
        stop = min(end, base.read.end + learning.chunk_seconds)
        self.queries += 1
        self._queries.inc()
        timeout = self._config.prometheus.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                rows = await self._querier.query_range(query(config=self._config.prometheus,
                                                             step_seconds=learning.step_seconds),
                                                       start=start, end=stop, step=learning.step_seconds)
        except (prometheus.PrometheusError, TimeoutError) as exc:
            self.errors += 1
            self._errors.inc()
            why = exc if isinstance(exc, prometheus.PrometheusError) else f"no answer within {timeout:g}s"
            logger.warning("reclaim: idle history not read (learned idle windows wait; tier windows apply): %s", why)
            return False
        self._learned = await asyncio.to_thread(
            _folded, base, rows, stop=stop, since=end - learning.lookback_seconds,
            labels=self._config.prometheus.labels, learning=learning)
        return True

    def start(self, *, now: float) -> None:
        """Start a refresh beside the cycles if one is due and none runs (the cycle does not wait for it); not
        with `at_once` or `wait`, whose cycles read themselves."""
        threshold = self._threshold
        if threshold is None or self._at_once or self.wait or (self._task is not None and not self._task.done()) \
                or not self.due(threshold=threshold, now=now):
            return
        self._task = asyncio.create_task(self._background(threshold=threshold, now=now), name="reclaim-history")

    async def _background(self, *, threshold: float, now: float) -> bool:
        try:
            return await self.read(threshold=threshold, now=now)
        except Exception as exc:  # a malformed answer the fold trips on, a bug: logged, counted, the old pool stays
            self.errors += 1
            self._errors.inc()
            logger.exception("reclaim: idle history refresh failed (the previous one stays): %s", exc)
            return False

    async def settle(self) -> None:
        """Wait for the refresh running beside the cycles, if any (replays and tests, in store time)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Cancel the refresh running beside the cycles, if any, and wait for it: its chunk is read again later."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
            self._threshold = None
            return dict(screened), {}
        threshold = self._threshold = max(policies[name].threshold_percent for name in tier_windows)
        if self._at_once:
            while await self.read(threshold=threshold, now=now) and not self.fresh(now):
                pass  # `--once`: the next chunk at once, until the look-back is read (or a read fails)
        elif self.wait:
            await self.read(threshold=threshold, now=now)  # a replay in store time: the refresh takes no time
        elif self._base(threshold=threshold, end=self._end(now)) is not self._learned:
            self._learned = None  # of another threshold, or from the future: never used (`start()` reads again)
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

