"""The PromQL of the utilisation parts, for every device at once: what it asks and why it is cheap. Pure.

Utilisation is read in parts of the store's time (`reclaim.part_seconds`, aligned to multiples of it;
descheduler.reclaim.utilisation_parts keeps them): per device and part, its sample count, its peak (or, for the
`average` statistic, its sum and the fewest samples of any copy) and the time of its last sample at or
before the part's end. Each is one small query over plain range vectors (`count_over_time`, `max_over_time`,
`sum_over_time`) or `timestamp()` of a plain selector: no subquery, no `label_replace`, no `or` of many
vectors (measured at 10,000 GPUs: tagging and joining vectors costs more than the reads,
benchmarks/RESULTS.md). Two shapes of the same expressions:
- settled parts: a range query with `step` = the part, each step's range exactly one part (`[300s]`), so each
  sample is read once per statistic, whatever the windows (10 min, 3 h) that later use the part;
- the newest minutes (the parts not settled yet and the part being written): one instant query per statistic
  at the store's time over `[<ms>ms]` back to the end of the newest settled part.

Prometheus 2.x range selectors include their left end (3.x does not): a sample exactly on a part boundary may
count in both parts. descheduler.reclaim.utilisation_parts accounts for it (the peak may take it twice: stricter; a
count is read as one less where a sample sits on the part's start).

Per kind (`gpu`: whole GPUs, `gpu_util_metric`; `mig`: MIG instances, `mig_activity_metric`), per device (its
raw labels: every pod, namespace and host spelling, the GPU index, UUID and MIG instance):
- `n`: samples in the part (`max by`: of two copies of a device, the fuller);
- `peak`: the part's highest sample in percent (`max_over_time` ignores NaN unless every sample is NaN);
- `sum`, `n_min` (`average` only): the part's sum in percent (NaN if any sample is) and the fewest samples of
  any copy (so that sum / samples bounds every copy's average from above);
- `last`: the time of the last sample at or before the part's end, within the store's lookback.

Rows keep the raw label spellings; descheduler.reclaim.utilisation_parts reads the pod, namespace and host from the
label lists of `prometheus.labels` (a later non-empty name wins) and the device from the `gpu` index on the
host, else the `UUID`, plus the MIG instance: two scrape jobs of one exporter (one may drop `UUID`) are one
device. Only standard PromQL: the same queries run on Prometheus, Thanos, Mimir and VictoriaMetrics.
"""

from __future__ import annotations

import json
import string
from collections.abc import Collection, Sequence

from common import dcgm, settings

KINDS = ("gpu", "mig")
TIME_QUERY = "vector(time())"  # the store's "now": every query of a cycle is evaluated at it
RECHECK = "gpu_steward_recheck"  # the label `newest` tags its answer's rows with
STATS = {"peak": ("n", "peak", "last"), "average": ("n", "n_min", "sum", "last")}  # per idle_statistic


def ratio_metric(metric: str, unit: str) -> bool:
    """Whether `metric` reads 0-1 (scaled x100 to percent): DCGM's profiling metrics are ratios."""
    return unit == "ratio" or (unit == "auto" and metric.startswith("DCGM_FI_PROF_"))


def series(kind: str, *, config: settings.Prometheus, matchers: Sequence[str] = ()) -> str:
    """The selector of every device of `kind` (`gpu`: whole GPUs, `mig`: MIG instances), `matchers` added after the
    scope matchers (`common.dcgm.selector`)."""
    metric, op = (config.gpu_util_metric, "=") if kind == "gpu" else (config.mig_activity_metric, "!=")
    return dcgm.selector(metric, f'{config.labels.mig_profile}{op}""', *matchers, config=config)


def ratio(kind: str, *, config: settings.Prometheus) -> bool:
    """Whether `kind`'s metric reads 0-1 (scaled x100 to percent)."""
    if kind == "gpu":
        return ratio_metric(config.gpu_util_metric, config.gpu_util_unit)
    return ratio_metric(config.mig_activity_metric, config.mig_activity_unit)


def newest(pods: Collection[str], *, config: settings.Prometheus, kinds: Collection[str] = KINDS) -> str:
    """One small instant query for the newest samples of the pods named `pods` (the re-check right before their
    eviction, descheduler.reclaim.recheck: a demand's victims in one query): per device of `kinds` under each pod
    label spelling, its newest sample in percent (label `RECHECK="<kind>_value"`) and that sample's time
    (`"<kind>_last"`), and the store's time (`"now"`, no other label). One name is matched exactly, several by one
    anchored regex of the escaped names. The newest sample within the store's lookback; the namespace and host are
    checked on the answer (any of their spellings), so a same-named pod of another namespace is told apart there.
    `label_replace` tags the three, which costs nothing on a few pods' series (unlike the cluster-wide reads
    above)."""
    def tagged(expr: str, tag: str) -> str:
        return f'label_replace({expr}, "{RECHECK}", "{tag}", "", "")'

    names = sorted(set(pods))
    parts = [tagged(TIME_QUERY, "now")]
    for kind in KINDS:
        if kind not in kinds:
            continue
        scale = " * 100" if ratio(kind, config=config) else ""
        for label in dict.fromkeys(config.labels.pod):
            matcher = f"{label}={json.dumps(names[0])}" if len(names) == 1 else \
                f"{label}=~{json.dumps('|'.join(_literal(n) for n in names))}"
            selector = series(kind, config=config, matchers=[matcher])
            parts += [tagged(f"{selector}{scale}", f"{kind}_value"), tagged(f"timestamp({selector})", f"{kind}_last")]
    return " or ".join(parts)


def _literal(name: str) -> str:
    """`name` as an RE2 pattern matching exactly it: its ASCII punctuation escaped (a pod name's `.`) but `-`, which
    is a literal outside a character class."""
    return "".join(f"\\{c}" if c in string.punctuation and c != "-" else c for c in name)


def device_labels(labels: settings.PrometheusLabels) -> str:
    """The `by (...)` list of a device: every pod, namespace and host spelling, and its identity."""
    names = [*labels.namespace, *labels.pod, *labels.hostname, labels.gpu, labels.uuid, labels.mig_instance]
    return ", ".join(dict.fromkeys(names))


def part_range(part_seconds: int) -> str:
    return f"{part_seconds}s"


def live_range(seconds: float) -> str:
    """The range back to the end of the newest settled part, in whole milliseconds (Prometheus' resolution)."""
    return f"{max(1, round(seconds * 1000))}ms"


def queries(span: str, *, config: settings.Prometheus, statistic: str,
            kinds: Collection[str] = KINDS) -> dict[str, str]:
    """`"<kind>_<stat>"` -> PromQL over the range `span` (`part_range` or `live_range`) ending at the evaluation
    time. `kinds`: the kinds of device asked about (each costs its reads even where no series match)."""
    by = device_labels(config.labels)
    out: dict[str, str] = {}
    for kind in KINDS:
        if kind not in kinds:
            continue
        selector = series(kind, config=config)
        scale = " * 100" if ratio(kind, config=config) else ""
        shapes = {
            "n": f"max by ({by}) (count_over_time({selector}[{span}]))",
            "n_min": f"min by ({by}) (count_over_time({selector}[{span}]))",
            "peak": f"max by ({by}) (max_over_time({selector}[{span}]){scale})",
            "sum": f"max by ({by}) (sum_over_time({selector}[{span}]){scale})",
            "last": f"max by ({by}) (timestamp({selector}))",
        }
        for stat in STATS[statistic]:
            out[f"{kind}_{stat}"] = shapes[stat]
    return out
