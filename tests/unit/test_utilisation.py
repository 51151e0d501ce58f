"""The pure half of idle detection: the one PromQL query per window and the fail-closed reading."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest

from common import gpu, settings, settings_loader, snapshot
from descheduler import utilisation, utilisation_promql
from tests import builders

NOW = 1_800_000_000.0
CONFIG = settings_loader.load()
EMPTY_NODE = snapshot.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[], priority_classes=[],
                            names=CONFIG.names, taken_at=NOW).nodes["n1"]
WINDOW = 3600  # six parts of 600 s with the defaults


def pod(*, full: int = 1, mig: dict[str, int] | None = None, node: str = "n1") -> snapshot.Pod:
    return snapshot.Pod(
        "team-a", "p", "uid", node, "Running", gpu.GpuRequest(full=full, mig=mig or {}), 0, "batch",
        "PreemptLowerPriority", {}, {}, None, None, "", (), False, "default-scheduler", {},
    )


PARTS = [(0, 900), (900, 900), (1800, 900), (2700, 900)]  # the hour in four parts, with the defaults


def covered(every: float = 15.0, phase: float = 5.0) -> dict[str, float]:
    """A device scraped every `every` s, its newest sample `phase` s old: its part counts and boundary times."""
    stats = {}
    for k, (offset, length) in enumerate(PARTS):
        stats[f"n{k}"] = length / every
        stats[f"t{k}"] = NOW - offset - phase
    stats["t4"] = NOW - WINDOW - phase
    return stats


def answers(kind: str = "gpu", host: str = "n1", *, util: float | None = 2.0,
            devices: dict[str, dict[str, float]] | None = None, **labels: str) -> dict[str, list[dict[str, Any]]]:
    """The answers of one window's queries for pod team-a/p, its devices keyed by GPU index."""
    pod_labels = {"namespace": "team-a", "pod": "p", "Hostname": host, **labels}
    out: dict[str, list[dict[str, Any]]] = {}
    if util is not None:
        out[f"{kind}_util"] = [{"metric": pod_labels, "value": [NOW, "NaN" if math.isnan(util) else str(util)]}]
    for index, stats in (devices if devices is not None else {"0": covered()}).items():
        for stat, value in stats.items():
            metric = {**pod_labels, "gpu": index, "UUID": f"GPU-{index}"}
            out.setdefault(f"{kind}_{stat}", []).append({"metric": metric, "value": [NOW, str(value)]})
    return out


def merge(*parts: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for part in parts:
        for name, rows in part.items():
            out.setdefault(name, []).extend(rows)
    return out


def queries(window: int, *, statistic: str = "peak", prometheus: settings.Prometheus = CONFIG.prometheus,
            **reclaim_settings: Any) -> dict[str, str]:
    reclaim = CONFIG.descheduler.reclaim.model_copy(update={"idle_statistic": statistic, **reclaim_settings})
    return utilisation_promql.queries(window, config=prometheus, reclaim=reclaim)


# --- the query -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("statistic", "function"), [("peak", "max_over_time"), ("average", "avg_over_time")])
def test_window_statistic_picks_the_promql_function(statistic: str, function: str) -> None:
    util = queries(600, statistic=statistic)["gpu_util"]
    assert f'{function}(DCGM_FI_DEV_GPU_UTIL{{GPU_I_PROFILE=""}}[600s])' in util


def test_no_subquery_no_label_replace_and_every_read_is_the_window_or_a_part() -> None:
    """Cost grows with GPUs, not with GPUs x window / step."""
    for window in (300, 600, 3600, 10800, 86400):
        asked = queries(window)
        text = " ".join(asked.values())
        assert not re.search(r"\[\d+s:", text) and "label_replace" not in text and " or " not in text
        lengths = {int(n) for n in re.findall(r"\[(\d+)s\]", text)}
        parts = utilisation_promql.parts(window, config=CONFIG.descheduler.reclaim)
        assert lengths == {window} | {length for _, length in parts}
        counts, times = utilisation_promql.stat_names(window, config=CONFIG.descheduler.reclaim)
        assert set(asked) == {f"{kind}_{stat}" for kind in ("gpu", "mig") for stat in ["util", *counts, *times]}


def test_parts_and_boundaries_of_an_hour() -> None:
    asked = queries(3600)
    selector = 'DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=""}'
    assert asked["gpu_n0"].endswith(f"(count_over_time({selector}[900s]))")
    assert asked["gpu_n3"].endswith(f"(count_over_time({selector}[900s] offset 2700s))")
    assert asked["gpu_t0"].endswith(f"(timestamp({selector}))")
    assert asked["gpu_t4"].endswith(f"(timestamp({selector} offset 3600s))")


def test_rows_keep_every_label_spelling_and_device_identity() -> None:
    asked = queries(3600)
    by_pod = "namespace, exported_namespace, pod, exported_pod, Hostname, hostname"
    assert asked["gpu_util"].startswith(f"max by ({by_pod}) (")
    assert asked["gpu_n1"].startswith("max by (namespace, exported_namespace, pod, exported_pod, Hostname, hostname, "
                                      "gpu, UUID, GPU_I_ID) (")
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!=""}[3600s]) * 100)' in asked["mig_util"]


def test_only_the_kinds_asked_about() -> None:
    reclaim = CONFIG.descheduler.reclaim
    asked = utilisation_promql.queries(600, config=CONFIG.prometheus, reclaim=reclaim, kinds={"gpu"})
    assert {name.partition("_")[0] for name in asked} == {"gpu"}


@pytest.mark.parametrize(
    ("metric", "unit", "scaled"),
    [
        pytest.param("DCGM_FI_DEV_GPU_UTIL", "auto", False, id="dev-util-is-percent"),
        pytest.param("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "auto", True, id="prof-is-a-ratio"),
        pytest.param("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "percent", False, id="unit-set-by-hand-wins"),
        pytest.param("gpu_busy_ratio", "ratio", True, id="recording-rule-ratio"),
        pytest.param("gpu_busy_ratio", "auto", False, id="auto-only-knows-dcgm-prof"),
    ],
)
def test_units(metric: str, unit: str, scaled: bool) -> None:
    prometheus = CONFIG.prometheus.model_copy(update={"gpu_util_metric": metric, "gpu_util_unit": unit})
    util = queries(600, prometheus=prometheus)["gpu_util"]
    assert util.endswith(f'max_over_time({metric}{{GPU_I_PROFILE=""}}[600s]) * 100)') == scaled


@pytest.mark.parametrize(
    ("window", "chunks", "expected"),
    [
        pytest.param(3600, 4, PARTS, id="hour-four-parts"),
        pytest.param(600, 4, [(0, 300), (300, 300)], id="parts-at-least-4-slowest-scrapes"),
        pytest.param(480, 4, [(0, 240), (240, 240)], id="boundary-two-parts-of-exactly-240s"),
        pytest.param(479, 4, [(0, 479)], id="below-boundary-one-part"),
        pytest.param(100, 4, [(0, 100)], id="short-window-one-part"),
        pytest.param(1001, 4, [(0, 250), (250, 250), (500, 250), (750, 251)], id="oldest-part-takes-the-rest"),
        pytest.param(10800, 1, [(0, 10800)], id="one-chunk"),
        pytest.param(10800, 6, [(k * 1800, 1800) for k in range(6)], id="six-chunks"),
    ],
)
def test_parts(window: int, chunks: int, expected: list[tuple[int, int]]) -> None:
    config = CONFIG.descheduler.reclaim.model_copy(update={"coverage_chunks": chunks})
    assert utilisation_promql.parts(window, config=config) == expected


# --- coverage of one device ------------------------------------------------------------------------------


def hole(stats: dict[str, float], **changes: float | None) -> dict[str, float]:
    out = dict(stats)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


@pytest.mark.parametrize(
    ("stats", "reason", "interval"),
    [
        pytest.param(covered(), None, 15.0, id="covered-at-15s"),
        pytest.param(covered(60), None, 60.0, id="covered-at-60s-the-slowest-believed"),
        pytest.param(covered(10, phase=9), None, 10.0, id="covered-at-10s"),
        # one stretch of 2 intervals (one missed scrape) is the bound; 3 is past it
        pytest.param(hole(covered(), n2=59), None, 15.0, id="one-missed-scrape-boundary"),
        pytest.param(hole(covered(), n2=58), "longer than 2x the observed scrape interval (~15s)", 15.0,
                     id="two-missed-scrapes-in-a-row"),
        # 75 s without a sample across the boundary 1800 s ago (two samples lost on each side): the stretch
        # counts whole in the newer part, as the older part's end moves back with its last sample
        pytest.param(hole(covered(), n1=58, n2=58, t2=NOW - 1835), "longer than 2x", 15.0,
                     id="hole-across-a-boundary"),
        pytest.param(hole(covered(), n1=59, n2=60, t2=NOW - 1805), None, 15.0,
                     id="one-missed-scrape-just-after-a-boundary"),
        # late start: no sample before the window, the first 25 s or 40 s after its start
        pytest.param(hole(covered(), t4=None, n3=59), None, 15.0, id="first-sample-25s-after-start-boundary"),
        pytest.param(hole(covered(), t4=None, n3=58), "or from its start to the first", 15.0,
                     id="first-sample-40s-after-start"),
        pytest.param(hole(covered(), t1=None), "1 of the window's 4 parts end with no sample", math.nan,
                     id="part-end-without-a-sample-in-the-lookback"),
        # an empty part hands its length to the next part's span
        pytest.param(hole(covered(), n1=None, t1=NOW - 1805), "longer than 2x", 15.0, id="empty-part"),
        pytest.param(covered(900), "samples ~900s apart, sparser than the longest scrape interval believed (60s)",
                     60.0, id="sparse-samples-are-no-slow-scrape"),
        pytest.param(hole(covered(), n2=30, n3=30), "longer than 2x the observed scrape interval (~15s)", 15.0,
                     id="interval-change-judged-at-the-faster-interval"),
        pytest.param({"t0": NOW, "t1": NOW - 900, "t2": NOW - 1800, "t3": NOW - 2700}, "no spacing of samples",
                     math.nan, id="no-samples-counted"),
    ],
)
def test_coverage(stats: dict[str, float], reason: str | None, interval: float) -> None:
    found, observed = utilisation.coverage(stats, window_seconds=WINDOW, now=NOW, config=CONFIG.descheduler.reclaim)
    assert (found is None, math.isnan(observed) or round(observed, 6)) == (
        reason is None, math.isnan(interval) or interval), found
    assert reason is None or reason in (found or "")


# --- the reading -----------------------------------------------------------------------------------------


STRICT_AGE = settings_loader.load(overrides={"descheduler": {"reclaim": {"max_sample_age_seconds": 20}}})
SINGLE = {"mig": "mig"}  # a whole-GPU request measured on MIG-instance series


def two(first: dict[str, float] | None = None, second: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    return {"0": first or covered(), "1": second or covered()}


@pytest.mark.parametrize(
    ("target", "result", "idle", "reason", "config"),
    [
        pytest.param(pod(), answers(), True, "peak GPU utilisation 2.0% < 10% over 3600s", CONFIG, id="idle"),
        pytest.param(pod(), answers(util=10.0), False, "GPU utilisation 10.0% >= 10%", CONFIG, id="at-threshold"),
        pytest.param(pod(), answers(util=9.99), True, "10.0% < 10%", CONFIG, id="just-below-threshold"),
        pytest.param(pod(), {}, False, "no DCGM series for the pod over 3600s", CONFIG, id="no-series"),
        pytest.param(pod(), answers(devices={"0": hole(covered(), n2=58)}), False, "coverage: a stretch of the 3600s "
                     "window without a sample (or from its start to the first) is longer than 2x the observed scrape "
                     "interval (~15s)", CONFIG, id="coverage"),
        # freshness at the store's time: at most 2 observed intervals, at most max_sample_age_seconds
        pytest.param(pod(), answers(devices={"0": covered(phase=30)}), True, "2.0% < 10%", CONFIG,
                     id="fresh-at-the-bound"),
        pytest.param(pod(), answers(devices={"0": covered(phase=31)}), False, "newest sample is 31s old at the "
                     "store's time, more than 30s (2x the observed scrape interval ~15s", CONFIG,
                     id="stale-past-2-intervals"),
        pytest.param(pod(), answers(devices={"0": covered(60, phase=150)}), False, "more than 120s", CONFIG,
                     id="stale-150s-at-60s-scrape-the-issue"),
        pytest.param(pod(), answers(devices={"0": covered(phase=21)}), False, "more than 20s", STRICT_AGE,
                     id="max-sample-age-caps"),
        pytest.param(pod(), answers(devices={"0": covered(phase=20)}), True, "2.0% < 10%", STRICT_AGE,
                     id="max-sample-age-boundary"),
        # values
        pytest.param(pod(), answers(util=math.nan), False, "a device averages NaN", CONFIG, id="nan-util"),
        pytest.param(pod(), answers(util=100.5), False, "100.5% >= 10%", CONFIG, id="percent-ceiling-boundary"),
        pytest.param(pod(), answers(util=100.6), False, "DCGM_FI_DEV_GPU_UTIL reads 100.6% (> 100 %): its unit is "
                     "not what prometheus.gpu_util_unit (auto) says; set it to percent", CONFIG, id="unit-error"),
        # devices, not series
        pytest.param(pod(full=2), answers(), False, "only 1 of 2 devices report", CONFIG, id="missing-gpu"),
        pytest.param(pod(full=2), answers(devices=two()), True, "2.0% < 10%", CONFIG, id="both-gpus-report"),
        pytest.param(pod(full=2), answers(devices=two(second=hole(covered(), n0=50))), False, "coverage", CONFIG,
                     id="worst-device-decides"),
        pytest.param(pod(full=2), merge(answers(job="a"), answers(util=None, job="b", UUID="")), False,
                     "only 1 of 2 devices report", CONFIG, id="a-gpu-scraped-twice-one-copy-without-uuid-is-one"),
        pytest.param(pod(), answers(devices={"0": {k: v for k, v in covered().items() if k != "t0"}}), False,
                     "no sample within Prometheus' lookback (stale)", CONFIG, id="no-newest-sample"),
        pytest.param(pod(), answers(devices={}), False, "no sample within Prometheus' lookback (stale)", CONFIG,
                     id="util-alone-is-not-trusted"),
        # where
        pytest.param(pod(), answers(host="n2"), False, "DCGM series come from n2, not the pod's node n1", CONFIG,
                     id="other-node"),
        pytest.param(pod(), answers(host="n1.cluster.local"), True, "2.0% < 10%", CONFIG, id="fqdn-host"),
        pytest.param(pod(), answers(host=""), True, "2.0% < 10%", CONFIG, id="no-host-label"),
        pytest.param(pod(), answers(host="", hostname="n1"), True, "2.0% < 10%", CONFIG, id="later-host-label-wins"),
        # MIG
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), answers(), False, "no DCGM_FI_PROF_GR_ENGINE_ACTIVE series",
                     CONFIG, id="mig-pod-needs-mig-metric"),
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), answers("mig", util=3.0), True, "3.0% < 10%", CONFIG, id="mig"),
        pytest.param(pod(full=1), answers("mig", util=3.0), True, "3.0% < 10%", CONFIG, id="mig-single-strategy"),
        pytest.param(pod(full=1), answers("mig", util=30.0), False, "30.0% >= 10%", CONFIG, id="mig-single-busy"),
        pytest.param(pod(full=1), merge(answers(util=40.0), answers("mig", util=3.0)), False, "40.0% >= 10%", CONFIG,
                     id="whole-gpu-series-first"),
        pytest.param(pod(full=1, mig={"1g.10gb": 1}), answers("mig", util=3.0), False,
                     "no DCGM_FI_DEV_GPU_UTIL series", CONFIG, id="mixed-pod-is-no-single-strategy"),
        pytest.param(pod(full=1, mig={"1g.10gb": 1}), merge(answers(), answers("mig", util=30.0)), False,
                     "30.0% >= 10%", CONFIG, id="both-kinds-busiest-wins"),
        # busy needs nothing else
        pytest.param(pod(), answers(util=55.0, devices={}), False, "peak GPU utilisation 55.0% >= 10% over 3600s",
                     CONFIG, id="busy-util-alone-is-enough"),
        pytest.param(pod(), answers(util=55.0, devices={"0": hole(covered(), n0=1)}), False, "55.0% >= 10%", CONFIG,
                     id="busy-needs-no-coverage"),
    ],
)
def test_assess(target: snapshot.Pod, result: dict[str, list[dict[str, Any]]], idle: bool, reason: str,
                config: settings.Settings) -> None:
    found = utilisation.assess(target, readings=utilisation.parse(result, labels=config.prometheus.labels),
                               window_seconds=WINDOW, threshold_percent=10, config=config, now=NOW)
    assert found.idle == idle
    assert reason in found.reason, found.reason


def test_evaluated_at_is_the_time_answer() -> None:
    assert utilisation.evaluated_at([{"metric": {}, "value": [NOW, str(NOW)]}]) == NOW
    assert utilisation.evaluated_at([]) is None
    assert utilisation.evaluated_at([{"metric": {}, "value": [NOW]}]) is None


def test_parse_keeps_only_the_pods_asked_about_and_ignores_foreign_rows() -> None:
    foreign = {"gpu_util": [{"metric": {"pod": "p"}, "value": [NOW, "1"]}, {"metric": {}, "value": [NOW, "1"]}],
               "other_util": [{"metric": {"namespace": "team-a", "pod": "p"}, "value": [NOW, "99"]}]}
    mixed = merge(foreign, answers(), answers(util=1.0, namespace="team-b"))
    readings = utilisation.parse(mixed, labels=CONFIG.prometheus.labels, pods={("team-a", "p")})
    assert set(readings) == {("team-a", "p")}


def test_host_spellings_merge_busier_and_one_device() -> None:
    readings = utilisation.parse(merge(answers(host=""), answers(host="n1", util=7.0)),
                                 labels=CONFIG.prometheus.labels)
    found = utilisation.assess(pod(full=2), readings=readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert found.reason == "DCGM_FI_DEV_GPU_UTIL: only 1 of 2 devices report"  # GPU 0 under both spellings
    found = utilisation.assess(pod(), readings=readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert found.reason == "peak GPU utilisation 7.0% < 10% over 3600s"  # the busier spelling


@pytest.mark.parametrize("nan_first", [True, False], ids=["nan-spelling-first", "nan-spelling-last"])
def test_a_nan_under_one_host_spelling_is_never_merged_away(nan_first: bool) -> None:
    """A spelling whose util is NaN merged with a clean idle spelling: the NaN survives whichever comes first
    (max() and min() keep it only as first argument)."""
    clean, nan_only = answers(host="n1"), answers(host="", util=math.nan, devices={})
    readings = utilisation.parse(merge(nan_only, clean) if nan_first else merge(clean, nan_only),
                                 labels=CONFIG.prometheus.labels)
    found = utilisation.assess(pod(), readings=readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert not found.idle
    assert "NaN" in found.reason


def test_kinds_needed() -> None:
    def node(strategy: str | None) -> snapshot.Node:
        return dataclasses.replace(EMPTY_NODE, topology=dataclasses.replace(
            EMPTY_NODE.topology, mig_strategy=strategy))

    nodes = {"n1": node(None), "n2": node("single")}
    assert utilisation.kinds_needed([pod()], nodes) == {"gpu"}
    assert utilisation.kinds_needed([pod(node="n2")], nodes) == {"gpu", "mig"}
    assert utilisation.kinds_needed([pod(full=0, mig={"1g.10gb": 1})], nodes) == {"mig"}
    assert utilisation.kinds_needed([], nodes) == set()
