"""The one PromQL instant query per idle window, for every pod at once: what it asks and why it is cheap. Pure.

Cost grows with GPUs, not with GPUs x window / step: only functions over plain range vectors
(`max_over_time`, `avg_over_time`, `count_over_time`) and `timestamp()` of plain selectors, no subquery.
Every sample of the window is read a few times (the statistic, the NaN check, the coverage terms); the
subqueries this replaces (measured in the reclaim-cycle benchmark) read each one at every step of the
lookback, 13x more at a 3 h window and 15 s scrapes.

Per device (a GPU or a MIG instance, however many series report it) and per kind (`gpu`: whole GPUs,
`gpu_util_metric`; `mig`: MIG instances, `mig_activity_metric`), tagged by `gs_stat`:
- `util`: the pod's busiest device: peak or average over the window, in percent (`reclaim.idle_statistic`);
- `devices`: devices with a sample in Prometheus' lookback; `valid`: those with no copy averaging NaN;
- `last`: the oldest "newest sample" of the pod's devices (freshness, judged at the store's time);
- coverage by time (`coverage_terms`): the window is read as K consecutive parts. In part k, with n_k
  samples and `span_k` = (the last sample at or before its end) - (the last sample at or before its
  start), the samples split `span_k` into exactly n_k stretches. `interval` is the smallest mean
  stretch over the parts (the scrape interval, exactly, wherever a part has no gap; the fastest device
  of the pod: strict). `worst` is the largest span_k / (n_k + b - 1), b = `reclaim.max_gap_intervals`:
  if every stretch but one is at least the interval I, the longest stretch in part k is at most
  span_k - (n_k - 1) I, and that is <= b I exactly when span_k / (n_k + b - 1) <= I. So
  `worst <= interval` means no stretch of the window without a sample is longer than b intervals,
  including the one from the window's start (a device with no sample before the start is measured from
  the start). A part that holds no sample hands its whole length to the next part's span; a boundary
  with no sample in the lookback before it drops its parts, and `parts` (the parts' ends that have a
  sample in the lookback before them; all K for a covered device) says so.

Device identity: the `gpu` index on the host, else the `UUID`, plus the MIG instance: two scrape jobs of
one exporter (one may drop `UUID`) are one device. The pod/namespace/host label lists of
`prometheus.labels` are copied onto our own `gs_*` labels in list order (a later name wins).
Only standard PromQL: the same query runs on Prometheus, Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

from common import settings

NAMESPACE, POD, HOST, STAT, DEVICE, PART = "gs_namespace", "gs_pod", "gs_host", "gs_stat", "gs_device", "gs_part"
KINDS = ("gpu", "mig")
STATS = ("util", "devices", "valid", "last", "interval", "worst", "parts")
TIME = "time"  # the row carrying the store's evaluation time
STATISTIC = {"peak": "max_over_time", "average": "avg_over_time"}
BY_POD = f"{NAMESPACE}, {POD}, {HOST}"
BY_DEVICE = f"{BY_POD}, {DEVICE}"
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


def coverage_terms(selector: str, window_seconds: int, *, config: settings.Reclaim) -> dict[str, str]:
    """Per series: `interval`, `worst` and `parts` (see the module docstring)."""
    chunks = parts(window_seconds, config=config)

    def newest_before(offset: int) -> str:  # the last sample at or before `offset` seconds ago
        if offset < window_seconds:
            return f"timestamp({selector}{_offset(offset)})"
        # The window's start: a device with no sample before it is measured from the start itself.
        return (f"(timestamp({selector}{_offset(offset)}) or "
                f"(0 * timestamp({selector}) + (time() - {window_seconds})))")

    def tagged(part: int, expr: str) -> str:
        return f'label_replace({expr}, "{PART}", "{part}", "", "")'

    means, worst, seen = [], [], []
    slack = config.max_gap_intervals - 1
    for k, (offset, length) in enumerate(chunks):
        span = f"({newest_before(offset)} - {newest_before(offset + length)})"
        count = f"count_over_time({selector}[{length}s]{_offset(offset)})"
        means.append(tagged(k, f"(({span} / {count}) > 0)"))
        worst.append(tagged(k, f"({span} / ({count} + {slack:g}))"))
        seen.append(tagged(k, newest_before(offset)))
    return {
        "interval": f"min without ({PART}) ({' or '.join(means)})",
        "worst": f"max without ({PART}) ({' or '.join(worst)})",
        "parts": f"count without ({PART}) ({' or '.join(seen)})",
    }


def _normalise(expr: str, labels: settings.PrometheusLabels) -> str:
    for target, sources in ((NAMESPACE, labels.namespace), (POD, labels.pod), (HOST, labels.hostname)):
        for source in sources:
            expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.+)")'
    # One device, however many series (jobs, exporters) report it: the GPU index wins over the UUID
    # (a relabelled job may drop the UUID), then the MIG instance.
    expr = f'label_replace({expr}, "{DEVICE}", "$1", "{labels.uuid}", "(.+)")'
    expr = f'label_replace({expr}, "{DEVICE}", "$1", "{labels.gpu}", "(.+)")'
    return f'label_join({expr}, "{DEVICE}", "/", "{DEVICE}", "{labels.mig_instance}")'


def query(window_seconds: int, *, config: settings.Prometheus, reclaim: settings.Reclaim,
          below_percent: float | None = None) -> str:
    """The one instant query for every pod whose idle window is `window_seconds`, plus a `time` row (the
    store's evaluation time). With `below_percent` (the highest idle threshold among the pods asked about),
    a pod whose `util` reaches it gets that row alone: on a busy cluster the others were most of the answer."""
    over_time = STATISTIC[reclaim.idle_statistic]
    mig = config.labels.mig_profile
    selectors = {
        "gpu": (f'{config.gpu_util_metric}{{{mig}=""}}', ratio_metric(config.gpu_util_metric, config.gpu_util_unit)),
        "mig": (f'{config.mig_activity_metric}{{{mig}!=""}}',
                ratio_metric(config.mig_activity_metric, config.mig_activity_unit)),
    }
    parts_ = [f'label_replace(vector(time()), "{STAT}", "{TIME}", "", "")']
    for kind, (selector, ratio) in selectors.items():
        ranged = f"{selector}[{window_seconds}s]"

        def device(expr: str, fold: str) -> str:  # per device: `fold` over the copies of its series
            return f"{fold} by ({BY_DEVICE}) ({_normalise(expr, config.labels)})"

        scale = " * 100" if ratio else ""
        util = f"max by ({BY_POD}) ({device(f'{over_time}({ranged}){scale}', 'max')})"
        coverage = coverage_terms(selector, window_seconds, config=reclaim)
        rest = {
            "devices": f"count by ({BY_POD}) ({device(f'timestamp({selector})', 'max')})",
            # NaN >= bool 0 is 0: a device with any copy averaging NaN is not valid.
            "valid": f"sum by ({BY_POD}) ({device(f'avg_over_time({ranged}) >= bool 0', 'min')})",
            "last": f"min by ({BY_POD}) ({device(f'timestamp({selector})', 'max')})",
            # The best copy of each device; the fastest device's interval, the worst device's stretch.
            "interval": f"min by ({BY_POD}) ({device(coverage['interval'], 'min')})",
            "worst": f"max by ({BY_POD}) ({device(coverage['worst'], 'min')})",
            "parts": f"min by ({BY_POD}) ({device(coverage['parts'], 'max')})",
        }
        tagged = " or ".join(f'label_replace({expr}, "{STAT}", "{kind}_{stat}", "", "")' for stat, expr in rest.items())
        # `x and on(...) (util < t)` keeps x only where util is below t (NaN < t is false too); util is
        # evaluated once more for all the other statistics together, not once per statistic.
        keep = "" if below_percent is None else f" and on ({BY_POD}) ({util} < {below_percent:g})"
        parts_ += [f'label_replace({util}, "{STAT}", "{kind}_util", "", "")', f"(({tagged}){keep})"]
    return " or ".join(parts_)
