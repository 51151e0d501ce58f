"""Which pod holds which GPU index, read from DCGM exporter series in Prometheus. Pure: no I/O.

dcgm-exporter labels every per-GPU series with the GPU `gpu` index, the host (`Hostname` in older
releases, `hostname` in newer ones) and, with pod attribution on, `pod`/`namespace` — renamed
`exported_pod`/`exported_namespace` when Prometheus scrapes it without `honor_labels` (`pod` is then
the exporter's own pod): in each configured list a later non-empty label wins, as in
`descheduler.reclaim.utilisation`. A GPU no pod holds still has series, with empty pod labels (NVIDIA's
quick-start shows `pod=""`). MIG instances
carry `GPU_I_PROFILE`/`GPU_I_ID` and report activity in `DCGM_FI_PROF_GR_ENGINE_ACTIVE`.

Every selector gpu-steward sends is written by `selector()`: it puts `prometheus.scope_matchers` (e.g.
`cluster="prod-a"` in a store holding several clusters) first in the braces, and `common.prometheus.Client` refuses a
query with a selector that does not start with them (`unscoped`), so no query (utilisation, occupancy, history, a
re-check) can read another cluster's series. `store_checks` judges what the store says of the configured metrics
(common.prometheus reads it at start and for `gpu-steward check --prometheus`).

One query covers the whole cluster: for every series of either metric, the time of its latest sample
(`timestamp()` of a plain selector is the sample's own time), kept only if newer than
`occupancy_max_age_seconds`, so a deleted pod's series drops out. When two pods claim one GPU index
(a pod replaced on the same GPU within that window, or several MIG instances of one GPU), the most
recently seen wins: the index is taken either way, which is all the snapshot needs; MIG capacity
itself is counted from pod requests.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import settings, snapshot


def _by_labels(labels: settings.PrometheusLabels) -> list[str]:
    names = [*labels.hostname, labels.gpu, *labels.namespace, *labels.pod, labels.mig_profile, labels.mig_instance]
    return list(dict.fromkeys(names))


def selector(metric: str, *matchers: str, config: settings.Prometheus) -> str:
    """`metric{<scope matchers>, <matchers>}`: the only way a selector is written (`metric` may be empty when a
    matcher names `__name__`)."""
    return f"{metric}{{{','.join([*config.scope_matchers, *matchers])}}}"


def unscoped(promql: str, *, config: settings.Prometheus) -> bool:
    """Whether `promql` has a selector that does not start with the scope matchers (always False without them)."""
    if not config.scope_matchers:
        return False
    return "{" in promql.replace("{" + ",".join(config.scope_matchers), "")


def occupancy_query(config: settings.Prometheus) -> str:
    """One PromQL expression: per (host, GPU, pod, MIG instance), the unix time of the latest sample."""
    metrics = "|".join(dict.fromkeys([config.gpu_util_metric, config.mig_activity_metric]))
    return (
        f"max by ({', '.join(_by_labels(config.labels))}) "
        f"(timestamp({selector('', '__name__=~' + json.dumps(metrics), config=config)})) "
        f"> time() - {config.occupancy_max_age_seconds:g}"
    )


@dataclasses.dataclass(frozen=True)
class _Claim:
    node: str
    index: int
    pod: str
    seen_at: float
    mig: bool


def pick(metric: Mapping[str, str], names: Sequence[str]) -> str:
    """The value of the last of `names` that is set (later spellings override earlier ones)."""
    return next((metric[n] for n in reversed(names) if metric.get(n)), "")


def _render(metric: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"


def _claim(series: Mapping[str, Any], labels: settings.PrometheusLabels) -> _Claim | str:
    """A claim, or why the series says nothing about occupancy."""
    metric = series.get("metric")
    if not isinstance(metric, dict):
        return "no metric labels"
    pod = pick(metric, labels.pod)
    if not pod:
        return f"no pod label ({'/'.join(labels.pod)} empty): GPU not attributed to a pod"
    namespace = pick(metric, labels.namespace)
    if not namespace:
        return f"pod {pod} has no namespace label ({'/'.join(labels.namespace)} empty)"
    node = pick(metric, labels.hostname)
    if not node:
        return f"pod {namespace}/{pod} has no host label ({'/'.join(labels.hostname)} empty)"
    raw_index = metric.get(labels.gpu, "")
    if not raw_index.isdigit():
        return f"pod {namespace}/{pod} on {node}: GPU label {labels.gpu}={raw_index!r} is not an index"
    value = series.get("value")
    try:
        seen_at = float(value[1])  # type: ignore[index]
    except (TypeError, ValueError, IndexError):
        return f"pod {namespace}/{pod} on {node}: sample value {value!r} is not a timestamp"
    return _Claim(
        node=node,
        index=int(raw_index),
        pod=f"{namespace}/{pod}",
        seen_at=seen_at,
        mig=bool(metric.get(labels.mig_instance)),
    )


def parse_occupancy(
    result: Iterable[Mapping[str, Any]], *, labels: settings.PrometheusLabels
) -> tuple[snapshot.Occupancy, list[str]]:
    """Map node -> GPU index -> "namespace/pod" from the answer to `occupancy_query`.

    Also returns, for every series that was not used, why (rendered with its labels).
    """
    problems: list[str] = []
    best: dict[tuple[str, int], _Claim] = {}
    for series in result:
        claim = _claim(series, labels)
        if isinstance(claim, str):
            problems.append(f"{_render(series.get('metric') or {})}: {claim}")
            continue
        slot = (claim.node, claim.index)
        held = best.get(slot)
        if held is None:
            best[slot] = claim
            continue
        winner, loser = sorted((held, claim), key=lambda c: (-c.seen_at, c.pod))
        best[slot] = winner
        if winner.pod != loser.pod and not (winner.mig and loser.mig):  # MIG instances share a GPU
            problems.append(
                f"node {claim.node} GPU {claim.index}: claimed by {loser.pod} (seen {loser.seen_at:.0f}) "
                f"and {winner.pod} (seen {winner.seen_at:.0f}); kept {winner.pod}, seen last"
            )
    occupancy: dict[str, dict[int, str]] = {}
    for (node, index), claim in sorted(best.items()):
        occupancy.setdefault(node, {})[index] = claim.pod
    return occupancy, problems


@dataclasses.dataclass(frozen=True)
class MetricFacts:
    """What the store says of one configured metric under the scope matchers (common.prometheus reads it)."""

    series: int  # series with a sample within the store's lookback
    labels: frozenset[str]  # label names those series carry


NO_SERIES = MetricFacts(0, frozenset())  # a configured metric the store said nothing of


@dataclasses.dataclass(frozen=True)
class StoreFacts:
    metrics: Mapping[str, MetricFacts]  # configured metric name -> facts
    retention: str | None  # the store's retention as it says it (e.g. "15d"), None: it does not say
    retention_source: str  # where that came from, or why there is none


_UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")


def duration_seconds(text: str) -> float | None:
    """A Prometheus duration ("15d", "1h30m") in seconds; the time part of "15d or 10GiB"; None: no time bound."""
    for part in text.split(" or "):
        part = part.strip()
        found = _DURATION.findall(part)
        if found and "".join(f"{n}{u}" for n, u in found) == part:
            return sum(int(n) * _UNITS[u] for n, u in found) or None
    return None


def store_checks(facts: StoreFacts, *, config: settings.Prometheus,
                 longest_window: float | None) -> list[tuple[bool, str]]:
    """Whether the store can serve reclaim, one line each (ok, why): the utilisation metric has series under
    `prometheus.scope_matchers`, or, on a fleet whose GPUs are all in MIG mode (where dcgm-exporter reports no
    whole-GPU utilisation), the MIG activity metric has series with a per-GPU identity (said, not failed); each
    configured metric that has series carries a per-GPU identity (`UUID` or `gpu`: a recording rule aggregated over
    GPUs has neither, and no pod of it could ever be judged); the store keeps at least `longest_window` seconds (the
    longest idle window of the cluster's PriorityClasses)."""
    labels = config.labels
    scope = f" matching prometheus.scope_matchers {config.scope_matchers}" if config.scope_matchers else ""
    out: list[tuple[bool, str]] = []
    found_mig = facts.metrics.get(config.mig_activity_metric, NO_SERIES)
    mig = bool(found_mig.series and {labels.uuid, labels.gpu} & found_mig.labels)
    for setting, metric in (("gpu_util_metric", config.gpu_util_metric),
                            ("mig_activity_metric", config.mig_activity_metric)):
        found = facts.metrics.get(metric, NO_SERIES)
        if not found.series:
            if setting == "gpu_util_metric":
                judged = (f"no whole-GPU pod could be judged idle, only MIG instances ({config.mig_activity_metric})"
                          if mig else "no pod could be judged idle")
                hint = "; is the matcher's label (e.g. the external label cluster) on the series?"
                out.append((mig, f"no series of {metric} (prometheus.{setting}){scope} in the store: {judged}"
                                 + (hint if scope and not mig else "")))
            continue
        identity = sorted({labels.uuid, labels.gpu} & found.labels)
        if not identity:
            out.append((False, f"{metric} (prometheus.{setting}): its {found.series} series{scope} carry neither "
                               f"{labels.uuid} nor {labels.gpu}: no per-GPU identity (a recording rule aggregated "
                               "over GPUs?); configure the exporter's own metric"))
            continue
        out.append((True, f"{metric}: {found.series} series{scope}, GPUs identified by {' and '.join(identity)}"))
    retention = duration_seconds(facts.retention) if facts.retention else None
    if facts.retention is None:
        out.append((True, f"retention not checked: {facts.retention_source}"))
    elif retention is None:
        out.append((True, f"retention not checked: {facts.retention} ({facts.retention_source}) has no time bound"))
    elif longest_window is not None and retention < longest_window:
        out.append((False, f"the store keeps {facts.retention} ({facts.retention_source}), less than the longest "
                           f"idle window {longest_window:g}s: pods of that window could never be judged idle"))
    else:
        against = f" >= the longest idle window {longest_window:g}s" if longest_window is not None else ""
        out.append((True, f"the store keeps {facts.retention} ({facts.retention_source}){against}"))
    return out
