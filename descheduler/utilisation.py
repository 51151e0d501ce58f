"""Is a GPU pod idle? One PromQL query per idle window for all pods, and a fail-closed reading of it.

`query(window)` builds one instant query whose result carries, per (namespace, pod, host) and per kind
of device (`gpu`: whole GPUs, `DCGM_FI_DEV_GPU_UTIL` in percent; `mig`: MIG slices,
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` ratio x 100), statistics tagged by the `gs_stat` label.

Devices, not series: a device is one GPU (its `UUID` label, else its `gpu` index on the host) or one MIG
instance of it (`GPU_I_ID`). Every series is first folded onto its device (`gs_device`), so a device
scraped twice (two jobs, two exporters) still counts once and a pod holding two GPUs is only measured
when two distinct devices report. Per pod and kind:
- `util`: the busiest device's peak or average over the window (`reclaim.idle_statistic`; a multi-GPU pod
  is idle only if every GPU is);
- `devices`: distinct devices reporting; `valid`: those of them with no copy averaging NaN;
- `samples`: the fewest samples any device has in the window (its best-covered copy);
- `last`: the oldest "newest sample" of any device (staleness);
- coverage by time, not by count (see `coverage_terms`): `lag`, from the window's start to a device's
  first sample, and `gap`, the longest stretch of the window in which a device had no sample, both in
  the device's own observed scrape intervals (window / its samples, at most
  `reclaim.max_scrape_interval_seconds`); the best copy of each device, the worst device of the pod. A
  window is covered when both are <= `reclaim.max_gap_intervals`: one rule at 10, 15, 30 or 60 s scrapes.

Label spellings: the pod/namespace/host label lists of `prometheus.labels` are copied onto our own
`gs_*` labels in list order, so a later name overrides an earlier one when both are set. With the
defaults `exported_pod` beats `pod`: Prometheus only writes `exported_*` when the scrape target's own
`pod` label (the dcgm-exporter pod) clashed with the workload's.

`assess()` fails closed: no series, fewer devices than the pod holds, NaN, a window not covered by
time, stale samples, samples from another node, or a failed query => not idle, with the reason. Pure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from common import settings, snapshot

NAMESPACE, POD, HOST, STAT, DEVICE = "gs_namespace", "gs_pod", "gs_host", "gs_stat", "gs_device"
KINDS = ("gpu", "mig")
STATS = ("util", "samples", "devices", "valid", "last", "lag", "gap")
MIN_SAMPLES = 3  # fewer samples than this show no scrape interval to judge gaps by
MIN_STEPS = 10  # the coverage subqueries look at least this many times into a window ...
MAX_STEPS = 120  # ... and at most this many: their cost grows with steps x series (a 3 h window at 10 s
# steps took Prometheus 2 s for 100 GPUs; at 90 s steps 0.27 s)

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
    # One device, however many series (jobs, exporters) report it: its UUID, index and MIG instance.
    return f'label_join({expr}, "{DEVICE}", "/", "{labels.uuid}", "{labels.gpu}", "{labels.mig_instance}")'


STATISTIC = {"peak": "max_over_time", "average": "avg_over_time"}
BY_POD = f"{NAMESPACE}, {POD}, {HOST}"
BY_DEVICE = f"{BY_POD}, {DEVICE}"


def step_seconds(window_seconds: int, *, config: settings.Reclaim) -> int:
    """Resolution of the coverage subqueries: `coverage_step_seconds`, finer for short windows (at least
    MIN_STEPS steps), coarser for long ones (at most MAX_STEPS): gaps are measured to within a step."""
    fine = max(1, int(min(config.coverage_step_seconds, window_seconds // MIN_STEPS)))
    return max(fine, math.ceil(window_seconds / MAX_STEPS))


def coverage_terms(selector: str, window_seconds: int, step: int, *, max_interval: float) -> dict[str, str]:
    """Per series, in its own observed scrape intervals (window / samples in it, at most `max_interval`: a
    few samples spread over the window must not pass for a slow scrape):
    - `lag`: from the window's start to the first sample (negative: a sample before the start covers it);
    - `gap`: the longest stretch with no sample, the larger of the longest staleness seen by a subquery
      every `step` seconds (`time() - timestamp()`: exact to a step, but blind beyond Prometheus' lookback)
      and the time no sample was visible at all (what the lookback hides, and any time before the first).
    Both divide by the observed interval, so one bound holds at any scrape interval."""
    window, ranged = f"{window_seconds}s", f"[{window_seconds}s:{step}s]"
    per_interval = f"clamp_min(count_over_time({selector}[{window}]) / {window_seconds}, {1 / max_interval:.6g})"
    lag = f"(min_over_time(timestamp({selector}){ranged}) - (time() - {window_seconds}))"
    stale = f"max_over_time((time() - timestamp({selector})){ranged})"
    steps = f"scalar(count_over_time(vector(1){ranged}))"
    hidden = f"((({steps}) - count_over_time(timestamp({selector}){ranged})) * {step})"
    return {"lag": f"{lag} * {per_interval}",
            "gap": f"(({stale} >= {hidden}) or {hidden}) * {per_interval}"}


def query(window_seconds: int, *, config: settings.Prometheus, reclaim: settings.Reclaim,
          below_percent: float | None = None) -> str:
    """The one instant query for every pod whose idle window is `window_seconds`. With `below_percent`
    (the highest idle threshold among the pods asked about), a pod whose `util` reaches it gets that row
    alone: the others only serve to trust an idle reading, and on a busy cluster they were most of it."""
    over_time = STATISTIC[reclaim.idle_statistic]
    step = step_seconds(window_seconds, config=reclaim)
    mig = config.labels.mig_profile
    selectors = {
        "gpu": (f'{config.gpu_util_metric}{{{mig}=""}}', ""),
        "mig": (f'{config.mig_activity_metric}{{{mig}!=""}}', " * 100"),
    }
    parts = []
    for kind, (selector, scale) in selectors.items():
        ranged = f"{selector}[{window_seconds}s]"

        def device(expr: str, fold: str) -> str:  # per device: `fold` over the copies of its series
            return f"{fold} by ({BY_DEVICE}) ({_normalise(expr, config.labels)})"

        util = f"max by ({BY_POD}) ({device(f'{over_time}({ranged}){scale}', 'max')})"
        # `x and on(...) (util < t)` keeps x only where util is below t (NaN < t is false too).
        keep = "" if below_percent is None else f" and on ({BY_POD}) ({util} < {below_percent:g})"
        count = device(f"count_over_time({ranged})", "max")
        coverage = coverage_terms(selector, window_seconds, step, max_interval=reclaim.max_scrape_interval_seconds)
        stats = {
            "util": util,
            "samples": f"min by ({BY_POD}) ({count}){keep}",
            "devices": f"count by ({BY_POD}) ({count}){keep}",
            # NaN >= bool 0 is 0: a device with any copy averaging NaN is not valid.
            "valid": f"sum by ({BY_POD}) ({device(f'avg_over_time({ranged}) >= bool 0', 'min')}){keep}",
            "last": f"min by ({BY_POD}) ({device(f'timestamp({selector})', 'max')}){keep}",
            # The best copy of each device, the worst device of the pod.
            "lag": f"max by ({BY_POD}) ({device(coverage['lag'], 'min')}){keep}",
            "gap": f"max by ({BY_POD}) ({device(coverage['gap'], 'min')}){keep}",
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


WORSE_HIGHER = frozenset({"util", "lag", "gap"})


def _merge(a: Stats, b: Stats) -> Stats:
    """Two host spellings for one node (e.g. with and without a host label): the worse of each."""
    merged = dict(a)
    for stat, value in b.items():
        if stat not in merged:
            merged[stat] = value
        elif math.isnan(merged[stat]) or math.isnan(value):
            merged[stat] = math.nan  # max()/min() would keep or drop a NaN by argument order; it must stay
        else:  # the worse: busier, later, longer gaps; fewer samples, older, fewer devices (they may be
            # one device seen under both spellings: counting it twice could hide a silent one)
            worse = max if stat in WORSE_HIGHER else min
            merged[stat] = worse(merged[stat], value)
    return merged


def _devices(pod: snapshot.Pod) -> dict[str, int]:
    wanted = {"gpu": pod.request.full, "mig": sum(pod.request.mig.values())}
    return {kind: count for kind, count in wanted.items() if count}


def _uncovered(stats: Stats, *, window_seconds: int, config: settings.Reclaim) -> str | None:
    """Why the samples do not cover the window in time, or None. Gaps are measured in the device's own
    observed scrape interval (`coverage_terms`); seconds in the reason use the scarcest device's."""
    samples, bound = stats["samples"], config.max_gap_intervals
    if samples < MIN_SAMPLES:
        return f"{samples:g} samples over {window_seconds}s, need {MIN_SAMPLES} to see a scrape interval"
    interval = min(window_seconds / samples, config.max_scrape_interval_seconds)
    if stats["lag"] > bound:
        return (f"first sample ~{stats['lag'] * interval:.0f}s after the window's start: "
                f"{stats['lag']:.1f}x the observed scrape interval (~{interval:.0f}s), at most {bound:g}x")
    if stats["gap"] > bound:
        return (f"~{stats['gap'] * interval:.0f}s without a sample within the {window_seconds}s window: "
                f"{stats['gap']:.1f}x the observed scrape interval (~{interval:.0f}s), at most {bound:g}x")
    return None


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
        devices, valid = stats.get("devices", 0.0), stats.get("valid", 0.0)
        if devices < count:
            return failed(f"{metric[kind]}: only {devices:g} of {count} devices report")
        if valid < devices:
            return failed(f"{metric[kind]}: a device averages NaN over {window_seconds}s")
        if any(math.isnan(stats.get(s, math.nan)) for s in STATS):
            return failed(f"{metric[kind]}: incomplete or NaN statistics")
        uncovered = _uncovered(stats, window_seconds=window_seconds, config=reclaim)
        if uncovered:
            return failed(f"{metric[kind]}: coverage: {uncovered}")
        age = now - stats["last"]
        if age > reclaim.max_sample_age_seconds:
            return failed(f"{metric[kind]}: newest sample is {age:.0f}s old (stale)")
        utilisations.append(stats["util"])
    value = max(utilisations)
    verdict = "<" if value < threshold_percent else ">="
    reason = (f"{reclaim.idle_statistic} GPU utilisation {value:.1f}% {verdict} {threshold_percent:g}% "
              f"over {window_seconds}s")
    return Assessment(value < threshold_percent, value, reason)

