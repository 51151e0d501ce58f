"""Is a victim still idle right before its eviction? The verdict on its newest samples. Pure: no I/O, no clock.

The plan judged the pod over its window at the cycle's store time; the evictions come later (the live reads, the
dry runs and the evictions of the victims before it take an API round trip each: with an API answering in 8 s, a
pod was evicted 18 s after it turned busy). So right before its eviction each GPU victim is read again, with one
small query (`utilisation_promql.newest`, one for all of a demand's victims, each judged here on its own rows): per
device its newest sample and that sample's time, and the store's time. Judged at the store's time, never our clock:

- busy: any device's newest sample at or above the pod's idle threshold -> not idle (no freshness needed: not
  idle is the safe answer);
- missing: no sample of the pod from its own node (hosts compared as the measurement compares them,
  `utilisation_parts.same_host`: no host label is the pod's), or fewer devices than the pod holds (a whole-GPU
  request is read on MIG-instance series where it has no whole-GPU ones: the MIG `single` strategy; the kinds
  asked are the measurement's, `utilisation.kinds_needed`), or an answer without the store's time -> not idle;
- stale: a device's newest sample older than `reclaim.max_sample_age_seconds` at the store's time -> not idle;
- NaN -> not idle.
A device is its UUID and MIG instance (its GPU index on the pod's node where no copy has a UUID); copies of one
device (two scrape paths, one without the index or the UUID) merge, the busiest and newest winning. A pod with no
GPU (a gang's companion) is not re-checked. The finer staleness bound of the window's judgement (max_gap_intervals
observed scrape intervals) needs the samples' spacing, which one newest sample does not give: the re-check holds
the coarser `max_sample_age_seconds`, after the window itself passed the finer one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from common import dcgm, settings, snapshot
from descheduler.reclaim import utilisation_parts as parts
from descheduler.reclaim import utilisation_promql as promql


@dataclasses.dataclass(frozen=True)
class Verdict:
    idle: bool
    reason: str


@dataclasses.dataclass
class _Device:
    value: float = -math.inf
    last: float = -math.inf


def _store_time(rows: Iterable[Mapping[str, Any]]) -> float | None:
    for row in rows:
        if (row.get("metric") or {}).get(promql.RECHECK) == "now":
            try:
                return float(row["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                return None
    return None


def _devices(
    pod: snapshot.Pod, rows: Iterable[Mapping[str, Any]], labels: settings.PrometheusLabels, *, short_name: bool
) -> tuple[dict[str, dict[tuple[str, ...], _Device]], set[str]]:
    """kind -> device -> its newest sample, of the pod's series from its own node; and the other hosts seen."""
    found: dict[str, dict[tuple[str, ...], _Device]] = {}
    elsewhere: set[str] = set()
    own: list[tuple[str, str, Mapping[str, str], Mapping[str, Any]]] = []
    for row in rows:
        metric = row.get("metric") or {}
        kind, _, stat = str(metric.get(promql.RECHECK, "")).partition("_")
        if stat not in ("value", "last"):
            continue
        if (dcgm.pick(metric, labels.namespace), dcgm.pick(metric, labels.pod)) != (pod.namespace, pod.name):
            continue
        host = dcgm.pick(metric, labels.hostname)
        if not parts.same_host(host, pod.node_name or "", short_name=short_name):  # as the measurement reads it
            elsewhere.add(host)
            continue
        own.append((kind, stat, metric, row))
    # A device is its UUID (and MIG instance) where a copy of it has one, else its index on the host.
    uuids = {(m.get(labels.gpu, ""), m.get(labels.mig_instance, "")): m[labels.uuid]
             for _, _, m, _ in own if m.get(labels.uuid) and m.get(labels.gpu)}
    for kind, stat, metric, row in own:
        index, instance = metric.get(labels.gpu, ""), metric.get(labels.mig_instance, "")
        uuid = metric.get(labels.uuid) or uuids.get((index, instance), "")
        key = (uuid, instance) if uuid else (f"GPU {index}", instance)
        try:
            value = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            value = math.nan
        device = found.setdefault(kind, {}).setdefault(key, _Device())
        if stat == "value":
            device.value = value if math.isnan(value) or math.isnan(device.value) else max(device.value, value)
        else:
            device.last = max(device.last, value)
    return found, elsewhere


def judge(pod: snapshot.Pod, rows: Iterable[Mapping[str, Any]], *, threshold_percent: float,
          config: settings.Settings) -> Verdict:
    """`rows`: the answer to `utilisation_promql.newest` for the pod."""
    listed = list(rows)
    now = _store_time(listed)
    if now is None:
        return Verdict(False, "re-check: the store's answer carries no time")
    found, elsewhere = _devices(pod, listed, config.prometheus.labels,
                                short_name=config.prometheus.hostname_match == "short-name")
    wanted = {"gpu": pod.request.full, "mig": sum(pod.request.mig.values())}
    oldest_allowed = config.descheduler.reclaim.max_sample_age_seconds
    said: list[str] = []
    for kind, count in wanted.items():
        if not count:
            continue
        devices = found.get(kind) or ({} if kind == "mig" or pod.request.mig else found.get("mig") or {})
        busy = [(k, d.value) for k, d in sorted(devices.items()) if d.value >= threshold_percent]
        if busy:
            key, value = busy[0]
            return Verdict(False, f"re-check: busy again, device {'/'.join(k for k in key if k)} reads {value:.1f}% >= "
                                  f"{threshold_percent:g}% at its newest sample")
        if any(math.isnan(d.value) for d in devices.values()):
            return Verdict(False, "re-check: a device reads NaN at its newest sample")
        reporting = {k: d for k, d in devices.items() if d.value > -math.inf and d.last > -math.inf}
        if len(reporting) < count:
            where = f" (samples from {', '.join(sorted(elsewhere))}, not its node)" if elsewhere else ""
            return Verdict(False, f"re-check: only {len(reporting)} of its {count} device(s) report a newest sample "
                                  f"on {pod.node_name or '(no node)'}{where} (missing)")
        age = now - min(d.last for d in reporting.values())
        if age > oldest_allowed:
            return Verdict(False, f"re-check: a device's newest sample is {age:.0f}s old at the store's time, more "
                                  f"than max_sample_age_seconds {oldest_allowed:g} (stale)")
        said.append(f"{len(reporting)} device(s) at most {max(d.value for d in reporting.values()):.1f}%, newest "
                    f"samples at most {age:.0f}s old")
    return Verdict(True, f"re-check: still idle ({'; '.join(said)}) < {threshold_percent:g}%")
