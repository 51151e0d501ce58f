"""The reclaim loop's measuring shell: per kind of device, the kept parts (descheduler.reclaim.utilisation_parts) and
this cycle's queries for what is not kept (descheduler.reclaim.utilisation_promql), all at the store's time, judged
by descheduler.reclaim.utilisation.

- Each cycle asks: the store's "now" (`vector(time())`); the live stretch (the parts not settled yet and the
  part being written), one instant query per statistic at that time; and, as range queries with one step per
  part, the settled parts not kept yet or still short of samples, newest first, at most
  `reclaim.rebuild_parts_per_cycle` parts (after a start or a leader change the kept parts are empty and are
  read back over a few cycles; windows not read back yet keep their pods not idle). Every window is then
  judged from the kept parts and the live stretch: no query grows with the window.
- Time from the data: if the store's time differs from ours by more than `reclaim.max_clock_skew_seconds`
  (beyond the round trip), the windows we screened by our clock and the store's are not the same: nothing is
  idle this cycle (fail closed), said once, and the skew is the `gpu_steward_reclaim_clock_skew_seconds` gauge.
- A partial answer (`warnings`, as Thanos, Mimir or a federated store return it) cannot say which pods'
  series are missing: an instant one fails every window closed, a range one the windows that need its parts
  (the client refuses it as a failed query); one log line, one metric.
- Queries run at most `prometheus.max_concurrent_queries` at a time, each bounded by the client's timeout. A
  failed live query fails every window closed this cycle; a failed read of kept parts only the windows that
  need those parts. A failed query is one log line with the error and one metric; each pod's reason only
  points there. The kept parts are only a copy of the store: losing them costs reads, never a wrong verdict.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

import prometheus_client

from common import dcgm, prometheus, settings, snapshot
from descheduler.reclaim import utilisation, utilisation_parts, utilisation_promql, utilisation_window

logger = logging.getLogger(__name__)
KEEP_SECONDS = 3600.0  # a window no pod was measured over for this long (store time) no longer keeps its parts


class Querier(Protocol):
    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer: ...

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]: ...


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


class Parts:
    """The kept parts, per kind of device, across cycles (one per ReclaimLoop: a new leader starts empty), and
    the windows recently measured (store time last asked), which decide how far back parts are kept."""

    def __init__(self) -> None:
        self.caches: dict[str, utilisation_parts.Cache] = {}
        self.windows: dict[int, float] = {}
        self.read: list[int] = []  # parts read from the store by range queries, per cycle (the last ones)
        self.left_closed: bool | None = None  # the store's ranges include their left end (Prometheus 2.x)


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
    kept: Parts | None = None,
    whole: Callable[[str], None] | None = None,
) -> Measured:
    """Assess every pod of `wanted` (window -> pod keys). `on_query(ok)` is told of each query sent; `kept`:
    the parts kept from earlier cycles (None: none, read everything this cycle). `whole` (`--once`): read every
    part the windows need first, `rebuild_parts_per_cycle` at a time, telling it each step's progress (a line), so
    that one cycle judges as a warmed-up loop does."""
    if querier is None or not wanted:
        reason = "prometheus.url is not set: no utilisation data"
        return Measured({key: utilisation.failed(reason) for pods in wanted.values() for key in pods}, 0, ())
    kept = kept if kept is not None else Parts()
    asker = _Asker(querier, config=config, metrics=metrics, on_query=on_query)
    try:
        store_now = await asker.store_time(clock)
    except _Refused as refused:
        reason = refused.fail_closed_reason or "Prometheus query for the store's time failed (logged once per cycle)"
        return Measured({key: utilisation.failed(reason) for pods in wanted.values() for key in pods}, asker.sent,
                        (f"store's time: {refused}",))
    kept.windows.update({window: store_now for window in wanted})
    kept.windows = {w: at for w, at in kept.windows.items() if store_now - at <= KEEP_SECONDS}
    keys = [key for pods in wanted.values() for key in pods]
    kinds = utilisation.kinds_needed((cluster.pods[k] for k in keys), cluster.nodes)
    if whole is not None:
        await _read_back(asker, kinds, window=max(kept.windows), now=store_now, config=config, kept=kept,
                         progress=whole)
    found = await _read(asker, kinds, window=max(kept.windows), now=store_now, config=config, kept=kept,
                        short=list(wanted))
    if found.refused is not None:
        return Measured({key: utilisation.failed(found.refused) for key in keys}, asker.sent, found.errors)
    assessments: dict[str, utilisation.Assessment] = {}
    for window in sorted(wanted):
        pods = wanted[window]
        nodes = {(key.split("/", 1)[0], key.split("/", 1)[1]): cluster.pods[key].node_name or "" for key in pods}
        readings = found.readings(nodes, window=window)
        if isinstance(readings, str):
            assessments.update({key: utilisation.failed(readings) for key in pods})
            continue
        for key in pods:
            assessments[key] = utilisation.assess(cluster.pods[key], readings=readings, window_seconds=window,
                                                  threshold_percent=thresholds[key], config=config, now=store_now)
    return Measured(assessments, asker.sent, found.errors)


async def _read_back(asker: _Asker, kinds: Collection[str], *, window: int, now: float, config: settings.Settings,
                     kept: Parts, progress: Callable[[str], None]) -> None:
    """Read the kept parts back until every part windows up to `window` need is kept (as a cold cache is read
    back over cycles, but now), one line of progress per read; stops at a read that fails or adds nothing (the
    cycle's own read then judges what is missing, and says so)."""
    grid = utilisation_parts.Grid.of(config.descheduler.reclaim)
    needed = grid.needed(window, now)
    total = len(needed) * len(kinds)

    def kept_parts() -> int:
        return sum(j in kept.caches[kind].parts for kind in kinds if kind in kept.caches for j in needed)

    before = kept_parts()
    while before < total:
        found = await _read(asker, kinds, window=window, now=now, config=config, kept=kept)
        after = kept_parts()
        progress(f"utilisation parts of {grid.part}s read back: {after} of {total}"
                 + (f" (stopped: {'; '.join(found.errors)})" if found.errors else ""))
        if found.errors or found.refused is not None or after <= before:
            return
        before = after


@dataclasses.dataclass(frozen=True)
class _Found:
    """One cycle's reading of the store: the kept parts and the live stretch per kind, the parts whose read
    failed, the errors (one line per failed query) and, when the live stretch failed, why nothing is idle."""

    caches: Mapping[str, utilisation_parts.Cache]
    lives: Mapping[str, utilisation_parts.Part]
    unread: Mapping[str, set[int]]
    errors: tuple[str, ...]
    refused: str | None
    grid: utilisation_parts.Grid
    now: float
    average: bool
    bound: float
    left_closed: Parts  # read when judging: the probe runs after this is made
    # short windows: (their stretch, the last sample before it) per kind, or why they failed
    shorts: Mapping[int, tuple[Mapping[str, utilisation_parts.Part], Mapping[str, utilisation_parts.Part]] | str]
    short_name: bool  # hosts compared up to the first dot (prometheus.hostname_match)

    def readings(self, pods: Mapping[tuple[str, str], str], *, window: int) -> utilisation.Readings | str:
        """The pods' readings over `window`, or why none (a short window's queries failed)."""
        judging = utilisation_window.Judging(window, self.now, self.grid, self.average, self.bound,
                                            self.left_closed.left_closed)
        short = self.shorts.get(window)
        if isinstance(short, str):
            return short
        return utilisation_window.readings(self.caches, self.lives, pods=pods, judging=judging, unread=self.unread,
                                          short=short, short_name=self.short_name)


async def _read(asker: _Asker, kinds: Collection[str], *, window: int, now: float, config: settings.Settings,
                kept: Parts, short: Collection[int] = ()) -> _Found:
    """Read what is not kept for windows up to `window` at store time `now`: the live stretch, and the parts
    `Cache.fetch` names (range queries, concurrently); and each `short` window (shorter than the live stretch)
    as its own stretch: its statistics at `now` over it, the last sample at its start."""
    reclaim = config.descheduler.reclaim
    grid = utilisation_parts.Grid.of(reclaim)
    for kind in kinds:
        kept.caches.setdefault(kind, utilisation_parts.Cache()).prune(grid.needed(window, now)[0])
    caches = {kind: kept.caches[kind] for kind in kinds}
    statistic = reclaim.idle_statistic
    live_span = utilisation_promql.live_range(now - grid.live_start(now))
    live_queries = utilisation_promql.queries(live_span, config=config.prometheus, statistic=statistic, kinds=kinds)
    part_queries = utilisation_promql.queries(utilisation_promql.part_range(grid.part), config=config.prometheus,
                                              statistic=statistic, kinds=kinds)
    reads = [(kind, first, last) for kind, cache in caches.items()
             for first, last in cache.fetch(grid, window=window, now=now)]
    short = sorted(w for w in short if grid.short(w, now))

    async def stretch(w: int) -> tuple[dict[str, list[prometheus.Series]], dict[str, list[prometheus.Series]]]:
        asked = utilisation_promql.queries(utilisation_promql.live_range(w), config=config.prometheus,
                                           statistic=statistic, kinds=kinds)
        inside = {n: q for n, q in asked.items() if not n.endswith("_last")}
        return (await asker.answers(inside, at=now),
                await asker.answers({n: q for n, q in asked.items() if n.endswith("_last")}, at=now - w))

    Answers = dict[str, list[prometheus.Series]]
    done: list[Any] = await asyncio.gather(
        asker.answers(live_queries, at=now),
        *(asker.ranges({n: q for n, q in part_queries.items() if n.startswith(f"{kind}_")},
                       start=(first + 1) * grid.part, end=(last + 1) * grid.part, step=grid.part)
          for kind, first, last in reads),
        *(stretch(w) for w in short),
        return_exceptions=True)
    live_answers: Answers | BaseException = done[0]
    read_answers: list[Answers | BaseException] = done[1:1 + len(reads)]
    short_answers: dict[int, tuple[Answers, Answers] | BaseException] = dict(
        zip(short, done[1 + len(reads):], strict=True))
    errors: list[str] = []
    unread: dict[str, set[int]] = {kind: set() for kind in caches}
    found = functools.partial(_Found, caches, unread=unread, grid=grid, now=now, average=statistic == "average",
                              bound=reclaim.max_gap_intervals, left_closed=kept,
                              short_name=config.prometheus.hostname_match == "short-name")
    if isinstance(live_answers, BaseException):
        if not isinstance(live_answers, _Refused):
            raise live_answers
        errors.append(f"utilisation, newest {live_span}: {live_answers}")
        reason = (live_answers.fail_closed_reason
                  or "Prometheus query for the newest utilisation failed (logged once per cycle)")
        return found({}, errors=tuple(errors), refused=reason, shorts={})
    labels = config.prometheus.labels
    lives = {kind: cache.live(_stats(live_answers, kind), labels=labels) for kind, cache in caches.items()}
    if kept.left_closed is None:
        try:
            kept.left_closed = await _left_closed(asker, live_answers, config=config.prometheus)
        except _Refused as refused:
            errors.append(f"whether the store's ranges include their left end: {refused}")
    kept.read = []
    for (kind, first, last), answers in zip(reads, read_answers, strict=True):
        if isinstance(answers, BaseException):
            if not isinstance(answers, _Refused):
                raise answers
            errors.append(f"utilisation parts {first}-{last} of {grid.part}s: {answers}")
            unread[kind].update(range(first, last + 1))
            continue
        caches[kind].store(grid, _stats(answers, kind), first=first, last=last, now=now, live=lives[kind],
                           labels=labels, left_closed=kept.left_closed)
        kept.read.append(last - first + 1)
    shorts: dict[int, tuple[dict[str, utilisation_parts.Part], dict[str, utilisation_parts.Part]] | str] = {}
    for w, answer in short_answers.items():
        if isinstance(answer, BaseException):
            if not isinstance(answer, _Refused):
                raise answer
            errors.append(f"utilisation over the {w}s window: {answer}")
            shorts[w] = answer.fail_closed_reason or f"Prometheus query for the {w}s window failed (logged once)"
            continue
        inside, before = answer
        newest = {name: rows for name, rows in live_answers.items() if name.endswith("_last")}
        shorts[w] = ({kind: cache.live(_stats({**inside, **newest}, kind), labels=labels)
                      for kind, cache in caches.items()},
                     {kind: cache.live(_stats(before, kind), labels=labels) for kind, cache in caches.items()})
    return found(lives, errors=tuple(errors), refused=None, shorts=shorts)


async def _left_closed(asker: _Asker, answers: Mapping[str, Sequence[Mapping[str, Any]]], *,
                       config: settings.Prometheus) -> bool | None:
    """Whether the store's ranges include their left end (Prometheus 2.x) or not (3.x, VictoriaMetrics): a 1 ms
    range ending 1 ms after a sample whose time the live stretch gave counts it or not. None: no sample known."""
    metric = {"gpu": config.gpu_util_metric, "mig": config.mig_activity_metric}
    for name, rows in answers.items():
        kind, _, stat = name.partition("_")
        for row in rows if stat == "last" else ():
            try:
                at = float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            matchers = [f"{label}={json.dumps(value)}" for label, value in sorted(row["metric"].items())]
            series = dcgm.selector(metric[kind], *matchers, config=config)
            answer = await asker.one(f"count_over_time({series}[1ms])", at + 0.001)
            return any(float(found["value"][1]) >= 1 for found in answer.series)
    return None


def _stats(answers: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """`"<kind>_<stat>"` -> rows, as `stat` -> rows of one kind."""
    return {name.partition("_")[2]: rows for name, rows in answers.items() if name.startswith(f"{kind}_")}


class _Refused(Exception):
    """Data that cannot be used; the message is logged once, `fail_closed_reason` told per pod."""

    def __init__(self, message: str, *, fail_closed_reason: str | None = None) -> None:
        super().__init__(message)
        self.fail_closed_reason = fail_closed_reason


class _Asker:
    """One cycle's queries: the store's time once, then the live stretch's queries at it and the range
    queries of the parts to read."""

    def __init__(self, querier: Querier, *, config: settings.Settings, metrics: Metrics,
                 on_query: Callable[[bool], None]) -> None:
        self._querier = querier
        self._config = config
        self._metrics = metrics
        self._on_query = on_query
        self._limit = asyncio.Semaphore(config.prometheus.max_concurrent_queries)
        self.sent = 0

    async def one(self, promql: str, at: float | None) -> prometheus.Answer:
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
        store_now = utilisation.evaluated_at((await self.one(utilisation_promql.TIME_QUERY, None)).series)
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

    async def ranges(self, queries: Mapping[str, str], *, start: float, end: float,
                     step: float) -> dict[str, list[prometheus.Series]]:
        """Every range query's answer; the first failure cancels the others (TaskGroup)."""
        async def one(promql: str) -> list[prometheus.Series]:
            self.sent += 1
            try:
                async with self._limit:
                    rows = await self._querier.query_range(promql, start=start, end=end, step=step)
            except prometheus.PrometheusError as exc:
                self._on_query(False)
                raise _Refused(str(exc)) from exc
            self._on_query(True)
            return rows

        try:
            async with asyncio.TaskGroup() as group:
                tasks = {name: group.create_task(one(promql)) for name, promql in queries.items()}
        except* _Refused as refused:
            raise refused.exceptions[0] from None
        return {name: task.result() for name, task in tasks.items()}

    async def answers(self, queries: Mapping[str, str], *, at: float) -> dict[str, list[prometheus.Series]]:
        """Every query's answer at `at`; the first failure cancels the others (TaskGroup)."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = {name: group.create_task(self.one(promql, at)) for name, promql in queries.items()}
        except* _Refused as refused:
            raise refused.exceptions[0] from None
        return {name: task.result().series for name, task in tasks.items()}
