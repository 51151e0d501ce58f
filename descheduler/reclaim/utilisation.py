"""Is a GPU pod idle? The fail-closed reading of a window's parts. Pure.

What is read and kept: descheduler.reclaim.utilisation_parts (the parts of the store's time, per device) and
descheduler.reclaim.utilisation_promql (their queries).

`assess()` fails closed: no series, fewer devices than the pod holds (or, without `prometheus.scope_matchers`,
more distinct GPUs than it holds: another cluster's series in a shared store; or an idle reading from a series
without a host label, which could be such a series), NaN (a part whose every sample is NaN
for the peak; any NaN for the average), a reading above 100 % (a ratio metric read as percent: the unit
setting is wrong), a window not covered by time (a stretch without a sample longer than
`reclaim.max_gap_intervals` observed scrape intervals, the first one counted from the window's start on the
part grid), a part of the window not read from the store yet, or whose read failed, a newest sample older
than `max_gap_intervals` intervals (or `max_sample_age_seconds`) at the store's time, samples from another
node => not idle, with the reason. A busy reading needs none of that: not idle is the safe answer. An idle
verdict names the devices identified by host and GPU index only (their series carry no UUID).

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
from descheduler.reclaim import utilisation_fold as folding
from descheduler.reclaim import utilisation_promql as promql
from descheduler.reclaim import utilisation_window as window

KINDS = promql.KINDS
PERCENT_CEILING = 100.5  # above this a "percent" reading is a unit error, not a busy GPU (DCGM rounds)

Readings = window.Readings
KindReading = window.KindReading


@dataclasses.dataclass(frozen=True)
class Assessment:
    idle: bool
    utilisation: float | None  # percent; None when unknown
    reason: str


def evaluated_at(result: Iterable[Mapping[str, Any]]) -> float | None:
    """The store's evaluation time, from the answer to `utilisation_promql.TIME_QUERY` (None if malformed)."""
    for row in result:
        try:
            return float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return None


def _devices(pod: snapshot.Pod) -> dict[str, int]:
    """The devices a measurement expects, by kind: those its running containers hold (`snapshot.Pod.measured`),
    not the larger count the scheduler accounts for a one-off init container."""
    wanted = {"gpu": pod.measured.full, "mig": sum(pod.measured.mig.values())}
    return {kind: count for kind, count in wanted.items() if count}


def kinds_needed(pods: Iterable[snapshot.Pod], nodes: Mapping[str, snapshot.Node]) -> set[str]:
    """The kinds of device a query must ask about for `pods`: MIG instances for MIG requests, and for
    whole-GPU requests on a node labelled with the `single` MIG strategy."""
    kinds: set[str] = set()
    for pod in pods:
        if pod.measured.mig:
            kinds.add("mig")
        if pod.measured.full:
            kinds.add("gpu")
            node = nodes.get(pod.node_name or "")
            if node is not None and node.topology.mig_strategy == "single":
                kinds.add("mig")
    return kinds


def coverage(device: folding.DeviceReading, *, window_seconds: int,
             config: settings.Reclaim) -> tuple[str | None, float]:
    """Why one device's samples do not cover the window in time (or None), and its observed scrape interval.

    Each part's samples split its stretch (from the last sample before it, or the window's start on the grid
    where the series started later, to its own last sample) into between n_lo and n_hi stretches (n_lo = n_hi
    - 1 where a sample on the part's start may be counted twice, see descheduler.reclaim.utilisation_parts). The
    interval I is the smallest mean stretch of a part (span / n_hi: exact wherever a part has no gap), at most
    `max_scrape_interval_seconds`. If every stretch but one is at least I, the longest stretch in a part is at
    most span - (n_lo - 1) I, which is <= b I (b = `max_gap_intervals`) exactly when span / (n_lo + b - 1) <= I
    (`DeviceReading.worst`, the largest over the parts)."""
    if device.lost:
        return (f"{device.lost} of the window's parts hold samples but no last sample within the store's lookback "
                "at their end (is the store's lookback delta shorter than part_seconds?)"), math.nan
    bound, ceiling = config.max_gap_intervals, config.max_scrape_interval_seconds
    if math.isinf(device.observed):
        return f"no spacing of samples to read a scrape interval from over {window_seconds}s", math.nan
    observed = device.observed
    interval = min(observed, ceiling)
    if device.worst > interval * (1 + 1e-9):  # float noise only; the bound itself is inclusive
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


def _kind_reading(found: window.PodReading, kind: str, pod: snapshot.Pod) -> tuple[str, window.KindReading | None]:
    """What a pod's `kind` of request is measured by, and the kind it comes from: a whole-GPU request with
    no whole-GPU series but MIG-instance ones is the MIG `single` strategy."""
    reading = found.kinds.get(kind)
    if reading is None and kind == "gpu" and not pod.measured.mig:
        return "mig", found.kinds.get("mig")
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
    """`now`: the store's time (freshness is judged against the data's clock)."""
    reclaim = config.descheduler.reclaim
    prometheus = config.prometheus
    metric = {"gpu": prometheus.gpu_util_metric, "mig": prometheus.mig_activity_metric}
    unit = {"gpu": ("gpu_util_unit", prometheus.gpu_util_unit),
            "mig": ("mig_activity_unit", prometheus.mig_activity_unit)}
    found = readings.get((pod.namespace, pod.name))
    if found is None:
        return failed(f"no DCGM series for the pod over {window_seconds}s")
    if not found.kinds:
        return failed(f"DCGM series come from {', '.join(found.hosts)}, not the pod's node {pod.node_name or ''}")
    utilisations: list[float] = []
    by_index: list[str] = []
    if not _devices(pod):
        return failed(f"no running container holds a GPU (its {pod.request.describe()} were asked by init "
                      "containers only): nothing to measure")
    for wanted, count in _devices(pod).items():
        kind, reading = _kind_reading(found, wanted, pod)
        name = metric[kind]
        util = reading.util if reading is not None else None
        if reading is None or util is None:
            return failed(f"no {name} series for the pod over {window_seconds}s")
        if util > PERCENT_CEILING:
            setting, configured = unit[kind]
            return failed(f"{name} reads {util:.1f}% (> 100 %): its unit is not what prometheus."
                          f"{setting} ({configured}) says; set it to percent")
        if util >= threshold_percent:
            # Busy needs no coverage or freshness check (not idle is the safe answer), not even every part.
            utilisations.append(util)
            continue
        if reading.unknown:
            return failed(f"{name}: {reading.unknown}")
        if math.isnan(util):
            return failed(f"{name}: a device reads NaN over {window_seconds}s")
        reporting = {device: found for device, found in reading.devices.items() if not math.isnan(found.newest)}
        if not reporting:
            return failed(f"{name}: no sample within Prometheus' lookback (stale)")
        if len(reporting) < count:
            # dcgm-exporter before 4.8.4 labels a DRA-allocated GPU without its pod: such a GPU is never seen.
            dra = (f" (its DRA GPUs: {', '.join(d.describe() for d in pod.dra.devices)}; a DRA GPU without a "
                   "pod-attributed series is not seen)") if pod.dra.devices else ""
            return failed(f"{name}: only {len(reporting)} of {count} devices report{dra}")
        if len(reading.devices) > count and not prometheus.scope_matchers:
            return failed(f"{name}: the pod's series show {len(reading.devices)} distinct GPUs, it holds {count} "
                          "(another cluster's series in the same store? set prometheus.scope_matchers)")
        for _, device in sorted(reporting.items()):
            uncovered, interval = coverage(device, window_seconds=window_seconds, config=reclaim)
            if uncovered:
                return failed(f"{name}: coverage: {uncovered}")
            stale = _stale(device.newest, interval, now=now, config=reclaim)
            if stale:
                return failed(f"{name}: {stale}")
        utilisations.append(util)
        by_index.extend(reading.by_index)
    value = max(utilisations)
    if value < threshold_percent and "" in found.hosts and not prometheus.scope_matchers:
        # A series without a host is taken for the pod's wherever it comes from (utilisation_parts.same_host).
        return failed(f"idle, but read partly from series without a {prometheus.labels.hostname[0]} label, which a "
                      "store shared by several clusters cannot tell from another cluster's same-named pod; set "
                      "prometheus.scope_matchers (or keep the exporter's host label)")
    verdict = "<" if value < threshold_percent else ">="
    reason = (f"{reclaim.idle_statistic} GPU utilisation {value:.1f}% {verdict} {threshold_percent:g}% "
              f"over {window_seconds}s")
    if by_index:
        reason += f"; identified by host and index, no {prometheus.labels.uuid} label: {', '.join(by_index)}"
    return Assessment(value < threshold_percent, value, reason)
