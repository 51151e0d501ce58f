"""Is a GPU pod idle? The fail-closed reading of the one query per idle window. Pure.

The query itself, what each statistic means and why it is cheap: `descheduler.utilisation_promql`.

`assess()` fails closed: no series, fewer devices than the pod holds, NaN, a reading above 100 % (a
ratio metric read as percent: the unit setting is wrong), a window not covered by time (a stretch
without a sample longer than `reclaim.max_gap_intervals` observed scrape intervals, the first one
counted from the window's start, or a part of the window with no sample in the lookback), a newest
sample older than `max_gap_intervals` intervals (or `max_sample_age_seconds`) at the store's time,
samples from another node, or a failed query => not idle, with the reason.

MIG: a pod that requests MIG profiles (`mixed` strategy) is measured on MIG-instance series; a pod that
requests `nvidia.com/gpu` on whole-GPU series, or, where there are none for it, on MIG-instance series
(the `single` strategy: the device plugin hands out instances as `nvidia.com/gpu`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from common import settings, snapshot
from descheduler import utilisation_promql as promql

NAMESPACE, POD, HOST, STAT = promql.NAMESPACE, promql.POD, promql.HOST, promql.STAT
KINDS, STATS = promql.KINDS, promql.STATS
PERCENT_CEILING = 100.5  # above this a "percent" reading is a unit error, not a busy GPU (DCGM rounds)

Stats = dict[str, float]  # stat name -> value, for one kind of device
Readings = Mapping[tuple[str, str], Mapping[str, Mapping[str, Stats]]]  # (ns, pod) -> host -> kind -> stats


@dataclasses.dataclass(frozen=True)
class Assessment:
    idle: bool
    utilisation: float | None  # percent; None when unknown
    reason: str


def parse(result: Iterable[Mapping[str, Any]]) -> Readings:
    """Index an instant-vector result (`[{"metric": {...}, "value": [t, "v"]}, ...]`) by pod and host."""
    readings: dict[tuple[str, str], dict[str, dict[str, Stats]]] = {}
    for row in result:
        metric = row.get("metric") or {}
        kind, _, stat = str(metric.get(STAT, "")).partition("_")
        namespace, pod = metric.get(NAMESPACE), metric.get(POD)
        if kind not in KINDS or stat not in STATS or not namespace or not pod:
            continue
        try:
            value = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            value = math.nan
        host = str(metric.get(HOST, ""))
        readings.setdefault((namespace, pod), {}).setdefault(host, {}).setdefault(kind, {})[stat] = value
    return readings


def evaluated_at(result: Iterable[Mapping[str, Any]]) -> float | None:
    """The store's evaluation time: the `time` row every query carries (None if it is missing)."""
    for row in result:
        if (row.get("metric") or {}).get(STAT) == promql.TIME:
            try:
                return float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                return None
    return None


def _same_host(host: str, node: str) -> bool:
    return not host or host == node or host.split(".")[0] == node.split(".")[0]


WORSE_HIGHER = frozenset({"util", "worst"})


def _merge(a: Stats, b: Stats) -> Stats:
    """Two host spellings for one node (e.g. with and without a host label): the worse of each."""
    merged = dict(a)
    for stat, value in b.items():
        if stat not in merged:
            merged[stat] = value
        elif math.isnan(merged[stat]) or math.isnan(value):
            merged[stat] = math.nan  # max()/min() would keep or drop a NaN by argument order; it must stay
        else:  # the worse: busier, longer stretches; fewer devices or parts, older, a shorter interval
            # (they may be one device seen under both spellings: counting it twice could hide a silent one)
            worse = max if stat in WORSE_HIGHER else min
            merged[stat] = worse(merged[stat], value)
    return merged


def _devices(pod: snapshot.Pod) -> dict[str, int]:
    wanted = {"gpu": pod.request.full, "mig": sum(pod.request.mig.values())}
    return {kind: count for kind, count in wanted.items() if count}


def _uncovered(stats: Stats, *, window_seconds: int, config: settings.Reclaim) -> str | None:
    """Why the samples do not cover the window in time, or None (see `utilisation_promql`)."""
    bound, ceiling = config.max_gap_intervals, config.max_scrape_interval_seconds
    parts, seen = len(promql.parts(window_seconds, config=config)), stats.get("parts", 0.0)
    seen = 0.0 if math.isnan(seen) else seen
    if seen < parts:
        return (f"{parts - seen:g} of the window's {parts} parts end with no sample in the store's lookback "
                f"before them: a long hole, or the series started late")
    observed = stats.get("interval", math.nan)
    if not observed > 0 or math.isnan(stats.get("worst", math.nan)):
        return f"no spacing of samples to read a scrape interval from over {window_seconds}s"
    interval = min(observed, ceiling)
    if stats["worst"] > interval * (1 + 1e-9):  # float noise only; the bound itself is inclusive
        sparse = (f"; samples ~{observed:.0f}s apart, sparser than the longest scrape interval believed "
                  f"({ceiling:g}s)") if observed > ceiling else ""
        return (f"a stretch of the {window_seconds}s window without a sample (or from its start to the first) "
                f"is longer than {bound:g}x the observed scrape interval (~{interval:.0f}s){sparse}")
    return None


def _stale(stats: Stats, *, now: float, config: settings.Reclaim) -> str | None:
    """Why the newest sample is too old at the store's time `now`, or None."""
    interval = min(stats["interval"], config.max_scrape_interval_seconds)
    allowed = min(config.max_gap_intervals * interval, config.max_sample_age_seconds)
    age = now - stats["last"]
    if age > allowed:
        return (f"newest sample is {age:.0f}s old at the store's time, more than {allowed:.0f}s "
                f"({config.max_gap_intervals:g}x the observed scrape interval ~{interval:.0f}s, at most "
                f"max_sample_age_seconds {config.max_sample_age_seconds:g}) (stale)")
    return None


def failed(reason: str) -> Assessment:
    return Assessment(False, None, reason)


def _kind_stats(kinds: list[Mapping[str, Stats]], kind: str, pod: snapshot.Pod) -> tuple[str, Stats]:
    """The stats a pod's `kind` of request is measured by, and the kind they come from: a whole-GPU request
    with no whole-GPU series but MIG-instance ones is the MIG `single` strategy."""
    def merged(of: str) -> Stats:
        stats: Stats = {}
        for found in kinds:
            stats = _merge(stats, found.get(of, {}))
        return stats

    stats = merged(kind)
    if not stats and kind == "gpu" and not pod.request.mig:
        return "mig", merged("mig")
    return kind, stats


def assess(
    pod: snapshot.Pod,
    *,
    readings: Readings,
    window_seconds: int,
    threshold_percent: float,
    config: settings.Settings,
    now: float,
) -> Assessment:
    """`now`: the store's evaluation time of the query (freshness is judged against the data's clock)."""
    reclaim = config.descheduler.reclaim
    prometheus = config.prometheus
    metric = {"gpu": prometheus.gpu_util_metric, "mig": prometheus.mig_activity_metric}
    unit = {"gpu": ("gpu_util_unit", prometheus.gpu_util_unit),
            "mig": ("mig_activity_unit", prometheus.mig_activity_unit)}
    hosts = readings.get((pod.namespace, pod.name))
    if not hosts:
        return failed(f"no DCGM series for the pod over {window_seconds}s")
    node = pod.node_name or ""
    matching = [kinds for host, kinds in hosts.items() if _same_host(host, node)]
    if not matching:
        return failed(f"DCGM series come from {', '.join(sorted(hosts))}, not the pod's node {node}")
    utilisations: list[float] = []
    for wanted, count in _devices(pod).items():
        kind, stats = _kind_stats(matching, wanted, pod)
        if not stats:
            return failed(f"no {metric[kind]} series for the pod over {window_seconds}s")
        util = stats.get("util", math.nan)
        if util > PERCENT_CEILING:
            setting, configured = unit[kind]
            return failed(f"{metric[kind]} reads {util:.1f}% (> 100 %): its unit is not what prometheus."
                          f"{setting} ({configured}) says; set it to percent")
        if util >= threshold_percent:
            # Busy needs no coverage or freshness check (not idle is the safe answer), and a query
            # with `below_percent` sends nothing else for a busy pod.
            utilisations.append(util)
            continue
        if math.isnan(util) and len(stats) == 1:  # `below_percent` dropped the rest: NaN < t is false
            return failed(f"{metric[kind]}: a device averages NaN over {window_seconds}s")
        if "last" not in stats:
            return failed(f"{metric[kind]}: no sample within Prometheus' lookback (stale)")
        devices, valid = stats.get("devices", 0.0), stats.get("valid", 0.0)
        if devices < count:
            return failed(f"{metric[kind]}: only {devices:g} of {count} devices report")
        if valid < devices:
            return failed(f"{metric[kind]}: a device averages NaN over {window_seconds}s")
        uncovered = _uncovered(stats, window_seconds=window_seconds, config=reclaim)
        if uncovered:
            return failed(f"{metric[kind]}: coverage: {uncovered}")
        if any(math.isnan(stats.get(s, math.nan)) for s in STATS):
            return failed(f"{metric[kind]}: incomplete or NaN statistics")
        stale = _stale(stats, now=now, config=reclaim)
        if stale:
            return failed(f"{metric[kind]}: {stale}")
        utilisations.append(util)
    value = max(utilisations)
    verdict = "<" if value < threshold_percent else ">="
    reason = (f"{reclaim.idle_statistic} GPU utilisation {value:.1f}% {verdict} {threshold_percent:g}% "
              f"over {window_seconds}s")
    return Assessment(value < threshold_percent, value, reason)
