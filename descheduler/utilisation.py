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
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from common import dcgm, settings, snapshot
from descheduler import utilisation_promql as promql

KINDS = promql.KINDS
PERCENT_CEILING = 100.5  # above this a "percent" reading is a unit error, not a busy GPU (DCGM rounds)

Stats = dict[str, float]  # stat name -> value


@dataclasses.dataclass
class KindReading:
    """One kind of device of one pod under one host spelling: pod-level `util`, and per device its part
    counts `n<k>` and boundary times `t<k>`."""

    stats: Stats = dataclasses.field(default_factory=dict)
    devices: dict[str, Stats] = dataclasses.field(default_factory=dict)


Readings = Mapping[tuple[str, str], Mapping[str, Mapping[str, KindReading]]]  # (ns, pod) -> host -> kind -> ...


@dataclasses.dataclass(frozen=True)
class Assessment:
    idle: bool
    utilisation: float | None  # percent; None when unknown
    reason: str


def parse(answers: Mapping[str, Iterable[Mapping[str, Any]]], *, labels: settings.PrometheusLabels,
          pods: Collection[tuple[str, str]] | None = None) -> Readings:
    """Index the answers to `utilisation_promql.queries` (`"<kind>_<stat>"` -> instant-vector result) by pod
    and host, keeping only `pods` ((namespace, name)) when given: each answer covers every pod with DCGM
    series. Copies of a device (label sets that differ but for job, instance or a missing UUID) fold."""
    readings: dict[tuple[str, str], dict[str, dict[str, KindReading]]] = {}
    for name, result in answers.items():
        kind, _, stat = name.partition("_")
        if kind not in KINDS or not stat:
            continue
        per_device = stat != "util"
        for row in result:
            metric = row.get("metric") or {}
            key = (dcgm.pick(metric, labels.namespace), dcgm.pick(metric, labels.pod))
            if not key[0] or not key[1] or (pods is not None and key not in pods):
                continue
            try:
                value = float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                value = math.nan
            host = dcgm.pick(metric, labels.hostname)
            reading = readings.setdefault(key, {}).setdefault(host, {}).setdefault(kind, KindReading())
            if not per_device:
                reading.stats[stat] = _worse(reading.stats.get(stat), value, higher=True)
                continue
            # A device: its index (a copy may lack the UUID), else its UUID; then its MIG instance.
            device = f"{metric.get(labels.gpu) or metric.get(labels.uuid, '')}/{metric.get(labels.mig_instance, '')}"
            stats = reading.devices.setdefault(device, {})
            stats[stat] = max(stats.get(stat, value), value)  # copies: the most samples, the newest times
    return readings


def evaluated_at(result: Iterable[Mapping[str, Any]]) -> float | None:
    """The store's evaluation time, from the answer to `utilisation_promql.TIME_QUERY` (None if malformed)."""
    for row in result:
        try:
            return float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return None


def _same_host(host: str, node: str) -> bool:
    return not host or host == node or host.split(".")[0] == node.split(".")[0]


def _worse(a: float | None, b: float, *, higher: bool) -> float:
    """The worse of two pod-level readings; a NaN always stays (max()/min() keep it only as first argument)."""
    if a is None:
        return b
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b) if higher else min(a, b)


def _merged(readings: Iterable[KindReading]) -> KindReading:
    """Host spellings of one node (e.g. with and without a host label) as one: the busier pod-level reading;
    a device's copies under several spellings fold as copies do in the query
    (the most samples, the newest times), so one device seen twice is still one device."""
    out = KindReading()
    for reading in readings:
        for stat, value in reading.stats.items():
            out.stats[stat] = _worse(out.stats.get(stat), value, higher=True)
        for device, stats in reading.devices.items():
            folded = out.devices.setdefault(device, {})
            for stat, value in stats.items():
                folded[stat] = max(folded.get(stat, value), value)
    return out


def _devices(pod: snapshot.Pod) -> dict[str, int]:
    wanted = {"gpu": pod.request.full, "mig": sum(pod.request.mig.values())}
    return {kind: count for kind, count in wanted.items() if count}


def kinds_needed(pods: Iterable[snapshot.Pod], nodes: Mapping[str, snapshot.Node]) -> set[str]:
    """The kinds of device a query must ask about for `pods`: MIG instances for MIG requests, and for
    whole-GPU requests on a node labelled with the `single` MIG strategy."""
    kinds: set[str] = set()
    for pod in pods:
        if pod.request.mig:
            kinds.add("mig")
        if pod.request.full:
            kinds.add("gpu")
            node = nodes.get(pod.node_name or "")
            if node is not None and node.topology.mig_strategy == "single":
                kinds.add("mig")
    return kinds


def coverage(stats: Stats, *, window_seconds: int, now: float, config: settings.Reclaim) -> tuple[str | None, float]:
    """Why one device's samples do not cover the window in time (or None), and its observed scrape interval.

    Part k holds n<k> samples after t<k+1> up to t<k>: they split t<k> - t<k+1> into exactly n<k>
    stretches (t<K> missing: the series started inside the window; its start stands in, so the stretch
    from the start to the first sample counts). The interval I is the smallest mean stretch of a part
    (exact wherever a part has no gap), at most `max_scrape_interval_seconds`. If every stretch but one
    is at least I, the longest stretch in part k is at most span - (n - 1) I, which is <= b I
    (b = `max_gap_intervals`) exactly when span / (n + b - 1) <= I."""
    chunks = promql.parts(window_seconds, config=config)
    counts, times = promql.stat_names(window_seconds, config=config)
    missing = [name for name in times[:-1] if name not in stats]
    if missing:
        return (f"{len(missing)} of the window's {len(chunks)} parts end with no sample in the store's lookback "
                f"before them: a long hole, or the series started late"), math.nan
    ends = [stats[name] for name in times[:-1]] + [stats.get(times[-1], now - window_seconds)]
    bound, ceiling = config.max_gap_intervals, config.max_scrape_interval_seconds
    means, worst = [], 0.0
    for k, name in enumerate(counts):
        samples, span = stats.get(name, 0.0), ends[k] - ends[k + 1]
        if samples > 0 and span > 0:
            means.append(span / samples)
        worst = max(worst, span / (samples + bound - 1))
    if not means:
        return f"no spacing of samples to read a scrape interval from over {window_seconds}s", math.nan
    observed = min(means)
    interval = min(observed, ceiling)
    if worst > interval * (1 + 1e-9):  # float noise only; the bound itself is inclusive
        sparse = (f"; samples ~{observed:.0f}s apart, sparser than the longest scrape interval believed "
                  f"({ceiling:g}s)") if observed > ceiling else ""
        return (f"a stretch of the {window_seconds}s window without a sample (or from its start to the first) "
                f"is longer than {bound:g}x the observed scrape interval (~{interval:.0f}s){sparse}"), interval
    return None, interval


def _stale(newest: float, interval: float, *, now: float, config: settings.Reclaim) -> str | None:
    """Why a device's newest sample is too old at the store's time `now`, or None."""
    allowed = min(config.max_gap_intervals * interval, config.max_sample_age_seconds)
    age = now - newest
    if age > allowed:
        return (f"newest sample is {age:.0f}s old at the store's time, more than {allowed:.0f}s "
                f"({config.max_gap_intervals:g}x the observed scrape interval ~{interval:.0f}s, at most "
                f"max_sample_age_seconds {config.max_sample_age_seconds:g}) (stale)")
    return None


def failed(reason: str) -> Assessment:
    return Assessment(False, None, reason)


def _kind_reading(kinds: list[Mapping[str, KindReading]], kind: str, pod: snapshot.Pod) -> tuple[str, KindReading]:
    """What a pod's `kind` of request is measured by, and the kind it comes from: a whole-GPU request with
    no whole-GPU series but MIG-instance ones is the MIG `single` strategy."""
    def merged(of: str) -> KindReading:
        return _merged(found[of] for found in kinds if of in found)

    reading = merged(kind)
    if not reading.stats and not reading.devices and kind == "gpu" and not pod.request.mig:
        return "mig", merged("mig")
    return kind, reading


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
        kind, reading = _kind_reading(matching, wanted, pod)
        name = metric[kind]
        if not reading.stats and not reading.devices:
            return failed(f"no {name} series for the pod over {window_seconds}s")
        util = reading.stats.get("util", math.nan)
        if util > PERCENT_CEILING:
            setting, configured = unit[kind]
            return failed(f"{name} reads {util:.1f}% (> 100 %): its unit is not what prometheus."
                          f"{setting} ({configured}) says; set it to percent")
        if util >= threshold_percent:
            # Busy needs no coverage or freshness check (not idle is the safe answer), and a query
            # with `below_percent` sends nothing else for a busy pod.
            utilisations.append(util)
            continue
        if math.isnan(util):
            return failed(f"{name}: a device averages NaN over {window_seconds}s")
        reporting = {device: stats for device, stats in reading.devices.items() if "t0" in stats}
        if not reporting:
            return failed(f"{name}: no sample within Prometheus' lookback (stale)")
        if len(reporting) < count:
            return failed(f"{name}: only {len(reporting)} of {count} devices report")
        for _, stats in sorted(reporting.items()):
            uncovered, interval = coverage(stats, window_seconds=window_seconds, now=now, config=reclaim)
            if uncovered:
                return failed(f"{name}: coverage: {uncovered}")
            stale = _stale(stats["t0"], interval, now=now, config=reclaim)
            if stale:
                return failed(f"{name}: {stale}")
        utilisations.append(util)
    value = max(utilisations)
    verdict = "<" if value < threshold_percent else ">="
    reason = (f"{reclaim.idle_statistic} GPU utilisation {value:.1f}% {verdict} {threshold_percent:g}% "
              f"over {window_seconds}s")
    return Assessment(value < threshold_percent, value, reason)
