"""The PromQL of one idle window, for every pod at once: what it asks and why it is cheap. Pure.

Cost grows with GPUs, not with GPUs x window / step: only functions over plain range vectors
(`max_over_time`, `avg_over_time`, `count_over_time`) and `timestamp()` of plain selectors, no subquery,
no `label_replace`, no `or` of many vectors. Measured at 10,000 GPUs (benchmarks/RESULTS.md): each
selector costs an index lookup and a chunk read per series whatever it reads, and tagging and joining
many vectors into one answer cost more than the reads themselves; so each statistic is its own small
query, all evaluated at one store time. Per kind, each sample of the window is read twice (the statistic;
the counts of the window's K parts) plus one sample lookup per part boundary: K + 2 range reads and K + 1
lookups. The subqueries this replaces read every sample of the lookback at every step (13x the samples at a
3 h window and 15 s scrapes, 57 s at 10,000 GPUs).

Per kind (`gpu`: whole GPUs, `gpu_util_metric`; `mig`: MIG instances, `mig_activity_metric`):
- `util` per pod (its raw labels): the busiest copy's peak or average over the window, in percent
  (`reclaim.idle_statistic`). NaN samples: `avg_over_time` is NaN if any sample is; `max_over_time`
  ignores them unless all are (then NaN: not idle). No separate NaN check: it would be one more read;
- per device (its raw labels with the GPU index, UUID and MIG instance): `n<k>`, the samples in part k of
  the window (part 0 is the newest), and `t<k>`, the time of the last sample at or before part k's end
  (`t0`: the newest sample; `t<K>`: the last one at or before the window's start).
  `descheduler.utilisation` judges coverage from them exactly: the samples of part k split
  t<k> - t<k+1> into exactly n<k> stretches.

Rows keep the raw label spellings; `descheduler.utilisation` reads the pod, namespace and host from the
label lists of `prometheus.labels` (a later non-empty name wins) and the device from the `gpu` index on
the host, else the `UUID`, plus the MIG instance: two scrape jobs of one exporter (one may drop `UUID`) are
one device, and a device's copies fold into one (the most samples, the newest times). Only standard
PromQL: the same queries run on Prometheus, Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

from collections.abc import Collection

from common import settings

KINDS = ("gpu", "mig")
TIME_QUERY = "vector(time())"  # the store's "now": every query of a window is evaluated at it
STATISTIC = {"peak": "max_over_time", "average": "avg_over_time"}
MIN_PART_INTERVALS = 4  # a part holds at least this many of the slowest believed scrapes


def ratio_metric(metric: str, unit: str) -> bool:
    """Whether `metric` reads 0-1 (scaled x100 to percent): DCGM's profiling metrics are ratios."""
    return unit == "ratio" or (unit == "auto" and metric.startswith("DCGM_FI_PROF_"))


def parts(window_seconds: int, *, config: settings.Reclaim) -> list[tuple[int, int]]:
    """The window's parts, newest first, as (offset, length) in whole seconds; the oldest takes the rest."""
    shortest = MIN_PART_INTERVALS * config.max_scrape_interval_seconds
    count = max(1, min(config.coverage_chunks, int(window_seconds // shortest)))
    length = window_seconds // count
    out = [(k * length, length) for k in range(count - 1)]
    return [*out, ((count - 1) * length, window_seconds - (count - 1) * length)]


def _offset(seconds: int) -> str:
    return f" offset {seconds}s" if seconds else ""


def _labels(labels: settings.PrometheusLabels) -> tuple[str, str]:
    """`by (...)` lists: a pod's raw labels (every spelling), and a device's (the pod's plus its identity)."""
    pod = list(dict.fromkeys([*labels.namespace, *labels.pod, *labels.hostname]))
    device = list(dict.fromkeys([*pod, labels.gpu, labels.uuid, labels.mig_instance]))
    return ", ".join(pod), ", ".join(device)


def stat_names(window_seconds: int, *, config: settings.Reclaim) -> tuple[list[str], list[str]]:
    """The per-device statistics of a window: counts per part (`n0`..), boundary times (`t0`..`t<K>`)."""
    count = len(parts(window_seconds, config=config))
    return [f"n{k}" for k in range(count)], [f"t{k}" for k in range(count + 1)]


def queries(window_seconds: int, *, config: settings.Prometheus, reclaim: settings.Reclaim,
            kinds: Collection[str] = KINDS) -> dict[str, str]:
    """The queries of one idle window, for every pod at once: `"<kind>_<stat>"` -> PromQL, all to be
    evaluated at the same store time (`TIME_QUERY` first). `kinds`: the kinds of device asked about (each
    costs its reads even where no series match)."""
    over_time = STATISTIC[reclaim.idle_statistic]
    mig = config.labels.mig_profile
    selectors = {
        "gpu": (f'{config.gpu_util_metric}{{{mig}=""}}', ratio_metric(config.gpu_util_metric, config.gpu_util_unit)),
        "mig": (f'{config.mig_activity_metric}{{{mig}!=""}}',
                ratio_metric(config.mig_activity_metric, config.mig_activity_unit)),
    }
    by_pod, by_device = _labels(config.labels)
    chunks = parts(window_seconds, config=reclaim)
    ends = [offset for offset, _ in chunks] + [window_seconds]
    out: dict[str, str] = {}
    for kind, (selector, ratio) in selectors.items():
        if kind not in kinds:
            continue
        scale = " * 100" if ratio else ""
        out[f"{kind}_util"] = f"max by ({by_pod}) ({over_time}({selector}[{window_seconds}s]){scale})"
        for k, (offset, length) in enumerate(chunks):
            out[f"{kind}_n{k}"] = f"max by ({by_device}) (count_over_time({selector}[{length}s]{_offset(offset)}))"
        for k, offset in enumerate(ends):
            out[f"{kind}_t{k}"] = f"max by ({by_device}) (timestamp({selector}{_offset(offset)}))"
    return out
