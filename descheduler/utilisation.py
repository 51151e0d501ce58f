"""Is a GPU pod idle? One PromQL query per idle window for all pods, and a fail-closed reading of it.

`query(window)` builds one instant query whose result carries, per (namespace, pod, host) and per kind
of device (`gpu`: whole GPUs, `DCGM_FI_DEV_GPU_UTIL` in percent; `mig`: MIG slices,
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` ratio x 100), five statistics tagged by the `gs_stat` label:
`util` (max over the pod's devices of the window's peak or average, per `reclaim.idle_statistic`: a
multi-GPU pod is idle only if every GPU is), `samples` (min sample count of any device: the
coverage), `series` (devices reporting), `valid` (devices whose average is a number, not NaN) and
`last` (oldest "newest sample" of any device).

Label spellings: the pod/namespace/host label lists of `prometheus.labels` are copied onto our own
`gs_*` labels in list order, so a later name overrides an earlier one when both are set. With the
defaults `exported_pod` beats `pod`: Prometheus only writes `exported_*` when the scrape target's own
`pod` label (the dcgm-exporter pod) clashed with the workload's.

`assess()` fails closed: no series, fewer devices than the pod holds, NaN, too little coverage, stale
samples, samples from another node, or a failed query => not idle, with the reason. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from common import settings, snapshot

NAMESPACE, POD, HOST, STAT = "gs_namespace", "gs_pod", "gs_host", "gs_stat"
KINDS = ("gpu", "mig")
STATS = ("util", "samples", "series", "valid", "last")

Stats = dict[str, float]  # stat name -> value, for one kind of device
Readings = Mapping[tuple[str, str], Mapping[str, Mapping[str, Stats]]]  # (ns, pod) -> host -> kind -> stats


@dataclasses.dataclass(frozen=True)
class Assessment:
    idle: bool
    utilisation: float | None  # percent; None when unknown
    reason: str


def _normalise(expr: str, labels: settings.PrometheusLabels) -> str:
    for target, sources in ((NAMESPACE, labels.namespace), (POD, labels.pod), (HOST, labels.hostname)):
        for source in sources:
            expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'
    return expr


STATISTIC = {"peak": "max_over_time", "average": "avg_over_time"}


def query(window_seconds: int, *, config: settings.Prometheus, statistic: str, below_percent: float | None = None
          ) -> str:
    """The one instant query for every pod whose idle window is `window_seconds`; `statistic` is
    `peak` or `average` (settings.Reclaim.idle_statistic). With `below_percent` (the highest idle
    threshold among the pods asked about), a pod whose `util` reaches it gets that row alone: the
    other four only serve to trust an idle reading, and on a busy cluster they were most of the answer."""
    over_time = STATISTIC[statistic]
    mig = config.labels.mig_profile
    selectors = {
        "gpu": (f'{config.gpu_util_metric}{{{mig}=""}}', ""),
        "mig": (f'{config.mig_activity_metric}{{{mig}!=""}}', " * 100"),
    }
    by = f"by ({NAMESPACE}, {POD}, {HOST})"
    parts = []
    for kind, (selector, scale) in selectors.items():
        ranged = f"{selector}[{window_seconds}s]"
        util = f"max {by} ({_normalise(f'{over_time}({ranged}){scale}', config.labels)})"
        # `x and on(...) (util < t)` keeps x only where util is below t (NaN < t is false too).
        keep = "" if below_percent is None else f" and on ({NAMESPACE}, {POD}, {HOST}) ({util} < {below_percent:g})"
        stats = {
            "util": util,
            "samples": f"min {by} ({_normalise(f'count_over_time({ranged})', config.labels)}){keep}",
            "series": f"count {by} ({_normalise(f'count_over_time({ranged})', config.labels)}){keep}",
            # NaN >= 0 is false: a device averaging NaN drops out of `valid` but not `series`.
            "valid": f"count {by} ({_normalise(f'avg_over_time({ranged}) >= 0', config.labels)}){keep}",
            "last": f"min {by} ({_normalise(f'timestamp({selector})', config.labels)}){keep}",
        }
        parts += [f'label_replace({expr}, "{STAT}", "{kind}_{stat}", "", "")' for stat, expr in stats.items()]
    return " or ".join(parts)


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


def _same_host(host: str, node: str) -> bool:
    return not host or host == node or host.split(".")[0] == node.split(".")[0]


def _merge(a: Stats, b: Stats) -> Stats:
    """Two host spellings for one node (e.g. with and without a host label): the worse of each."""
    merged = dict(a)
    for stat, value in b.items():
        if stat not in merged:
            merged[stat] = value
        elif stat in ("series", "valid"):
            merged[stat] += value
        elif math.isnan(merged[stat]) or math.isnan(value):
            merged[stat] = math.nan  # max()/min() would keep or drop a NaN by argument order; it must stay
        else:  # util: the busier; samples, last: the scarcer
            merged[stat] = max(merged[stat], value) if stat == "util" else min(merged[stat], value)
    return merged


def _devices(pod: snapshot.Pod) -> dict[str, int]:
    wanted = {"gpu": pod.request.full, "mig": sum(pod.request.mig.values())}
    return {kind: count for kind, count in wanted.items() if count}


def failed(reason: str) -> Assessment:
    return Assessment(False, None, reason)


def assess(
    pod: snapshot.Pod,
    *,
    readings: Readings,
    window_seconds: int,
    threshold_percent: float,
    config: settings.Settings,
    now: float,
) -> Assessment:
    reclaim = config.descheduler.reclaim
    metric = {"gpu": config.prometheus.gpu_util_metric, "mig": config.prometheus.mig_activity_metric}
    hosts = readings.get((pod.namespace, pod.name))
    if not hosts:
        return failed(f"no DCGM series for the pod over {window_seconds}s")
    node = pod.node_name or ""
    matching = [kinds for host, kinds in hosts.items() if _same_host(host, node)]
    if not matching:
        return failed(f"DCGM series come from {', '.join(sorted(hosts))}, not the pod's node {node}")
    utilisations: list[float] = []
    for kind, count in _devices(pod).items():
        stats: Stats = {}
        for kinds in matching:
            stats = _merge(stats, kinds.get(kind, {}))
        if not stats:
            return failed(f"no {metric[kind]} series for the pod over {window_seconds}s")
        util = stats.get("util", math.nan)
        if util >= threshold_percent:
            # Busy needs no coverage or freshness check (not idle is the safe answer), and a query
            # with `below_percent` sends nothing else for a busy pod.
            utilisations.append(util)
            continue
        if math.isnan(util) and len(stats) == 1:  # `below_percent` dropped the rest: NaN < t is false
            return failed(f"{metric[kind]}: a device averages NaN over {window_seconds}s")
        if "last" not in stats:
            return failed(f"{metric[kind]}: no sample within Prometheus' lookback (stale)")
        series, valid = stats.get("series", 0.0), stats.get("valid", 0.0)
        if series < count:
            return failed(f"{metric[kind]}: only {series:g} of {count} devices report")
        if valid < series:
            return failed(f"{metric[kind]}: a device averages NaN over {window_seconds}s")
        if any(math.isnan(stats.get(s, math.nan)) for s in STATS):
            return failed(f"{metric[kind]}: incomplete or NaN statistics")
        required = reclaim.min_coverage * window_seconds / reclaim.sample_interval_seconds
        if stats["samples"] < required:
            return failed(
                f"{metric[kind]}: {stats['samples']:g} samples over {window_seconds}s, "
                f"need {required:g} ({reclaim.min_coverage:.0%} coverage)"
            )
        age = now - stats["last"]
        if age > reclaim.max_sample_age_seconds:
            return failed(f"{metric[kind]}: newest sample is {age:.0f}s old (stale)")
        utilisations.append(stats["util"])
    value = max(utilisations)
    verdict = "<" if value < threshold_percent else ">="
    reason = (f"{reclaim.idle_statistic} GPU utilisation {value:.1f}% {verdict} {threshold_percent:g}% "
              f"over {window_seconds}s")
    return Assessment(value < threshold_percent, value, reason)

