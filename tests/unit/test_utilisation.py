"""The pure half of idle detection: the one PromQL query per window and the fail-closed reading."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from common import gpu, settings, snapshot
from descheduler import utilisation, utilisation_promql

NOW = 1_800_000_000.0
CONFIG = settings.load()
WINDOW = 3600  # six parts of 600 s with the defaults


def pod(*, full: int = 1, mig: dict[str, int] | None = None, node: str = "n1") -> snapshot.Pod:
    return snapshot.Pod(
        "team-a", "p", "uid", node, "Running", gpu.GpuRequest(full=full, mig=mig or {}), 0, "batch",
        "PreemptLowerPriority", {}, {}, None, None, "", (), False, "default-scheduler", {},
    )


def rows(kind: str = "gpu", host: str = "n1", **stats: float) -> list[dict[str, Any]]:
    """What the query returns for one pod scraped every 15 s, fully covered, unless `stats` say otherwise."""
    values = {"util": 2.0, "devices": 1.0, "valid": 1.0, "last": NOW - 10, "interval": 15.0, "worst": 14.5,
              "parts": 6.0, **stats}
    return [
        {"metric": {"gs_namespace": "team-a", "gs_pod": "p", "gs_host": host, "gs_stat": f"{kind}_{stat}"},
         "value": [NOW, "NaN" if math.isnan(value) else str(value)]}
        for stat, value in values.items()
    ]


def query(window: int, *, statistic: str = "peak", below_percent: float | None = None,
          prometheus: settings.Prometheus = CONFIG.prometheus, **reclaim_settings: Any) -> str:
    reclaim = CONFIG.descheduler.reclaim.model_copy(update={"idle_statistic": statistic, **reclaim_settings})
    return utilisation_promql.query(window, config=prometheus, reclaim=reclaim, below_percent=below_percent)


# --- the query -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("statistic", "function"), [("peak", "max_over_time"), ("average", "avg_over_time")])
def test_window_statistic_picks_the_promql_function(statistic: str, function: str) -> None:
    promql = query(600, statistic=statistic)
    assert f'{function}(DCGM_FI_DEV_GPU_UTIL{{GPU_I_PROFILE=""}}[600s])' in promql


def test_no_subquery_whatever_the_window() -> None:
    """Cost grows with GPUs, not with GPUs x window / step: no `[range:step]` anywhere."""
    for window in (300, 600, 3600, 10800, 86400):
        promql = query(window)
        assert not re.search(r"\[\d+s:", promql), window
        # Every range read is the window itself (statistic, NaN check) or one of its parts.
        lengths = {int(n) for n in re.findall(r"\[(\d+)s\]", promql)}
        parts = utilisation_promql.parts(window, config=CONFIG.descheduler.reclaim)
        assert lengths == {window} | {length for _, length in parts}


def test_each_part_is_counted_twice_per_kind_and_the_window_read_three_times() -> None:
    promql = query(WINDOW, below_percent=5)
    # per kind: the statistic (its row and the `below_percent` filter) and the NaN check
    assert promql.count(f"[{WINDOW}s])") == 2 * 3
    # per kind and part: the interval and the longest stretch
    assert promql.count("count_over_time(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=\"\"}[600s] offset 1200s)") == 2


def test_query_is_one_expression_for_all_pods_with_every_label_spelling() -> None:
    promql = query(3600, statistic="average")
    assert 'DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=""}' in promql
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!=""}[3600s]) * 100' in promql
    for label in ("pod", "exported_pod", "namespace", "exported_namespace", "Hostname", "hostname"):
        assert f'"$1", "{label}", "(.+)"' in promql
    assert "team-a" not in promql and "max by (gs_namespace, gs_pod, gs_host)" in promql
    assert promql.startswith('label_replace(vector(time()), "gs_stat", "time", "", "")')


def test_a_device_is_its_index_before_its_uuid() -> None:
    """Two jobs scrape one exporter, one drops UUID: the index (set last, so it wins) makes them one device."""
    promql = query(600)
    uuid = promql.index('"gs_device", "$1", "UUID", "(.+)")')
    index = promql.index('"gs_device", "$1", "gpu", "(.+)")')
    assert uuid < index  # label_replace nests: the outer (later in the text) runs last
    assert 'label_join(' in promql and '"gs_device", "/", "gs_device", "GPU_I_ID")' in promql


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
    promql = query(600, prometheus=prometheus)
    assert (f'max_over_time({metric}{{GPU_I_PROFILE=""}}[600s]) * 100' in promql) == scaled


@pytest.mark.parametrize(
    ("window", "chunks", "expected"),
    [
        pytest.param(3600, 6, [(0, 600), (600, 600), (1200, 600), (1800, 600), (2400, 600), (3000, 600)],
                     id="hour-six-parts"),
        pytest.param(600, 6, [(0, 300), (300, 300)], id="parts-at-least-4-slowest-scrapes"),
        pytest.param(480, 6, [(0, 240), (240, 240)], id="boundary-two-parts-of-exactly-240s"),
        pytest.param(479, 6, [(0, 479)], id="below-boundary-one-part"),
        pytest.param(100, 6, [(0, 100)], id="short-window-one-part"),
        pytest.param(1001, 6, [(0, 250), (250, 250), (500, 250), (750, 251)], id="oldest-part-takes-the-rest"),
        pytest.param(10800, 1, [(0, 10800)], id="one-chunk"),
    ],
)
def test_parts(window: int, chunks: int, expected: list[tuple[int, int]]) -> None:
    config = CONFIG.descheduler.reclaim.model_copy(update={"coverage_chunks": chunks})
    assert utilisation_promql.parts(window, config=config) == expected


def test_with_a_threshold_only_util_comes_back_for_busy_pods() -> None:
    promql = query(3600, below_percent=7.5)
    keep = "and on (gs_namespace, gs_pod, gs_host) (max by (gs_namespace, gs_pod, gs_host) ("
    assert promql.count(keep) == 2  # once per kind, for all of its other statistics together
    assert promql.count(") < 7.5)") == 2
    assert "and on" not in query(3600)


def test_the_window_start_stands_in_for_a_sample_before_it() -> None:
    """A device whose series starts inside the window is measured from the window's start (late start)."""
    promql = query(600)
    selector = 'DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=""}'
    assert f"(timestamp({selector} offset 600s) or (0 * timestamp({selector}) + (time() - 600)))" in promql


# --- the reading -----------------------------------------------------------------------------------------


def util_only(value: float) -> list[dict[str, Any]]:
    """What a query with `below_percent` returns for a pod whose util is not below it."""
    return [row for row in rows(util=value) if row["metric"]["gs_stat"] == "gpu_util"]


STRICT_AGE = settings.load(overrides={"descheduler": {"reclaim": {"max_sample_age_seconds": 20}}})


@pytest.mark.parametrize(
    ("target", "result", "idle", "reason", "config"),
    [
        pytest.param(pod(), rows(), True, "peak GPU utilisation 2.0% < 10% over 3600s", CONFIG, id="idle"),
        pytest.param(pod(), rows(util=10.0), False, "GPU utilisation 10.0% >= 10%", CONFIG, id="at-threshold"),
        pytest.param(pod(), rows(util=9.99), True, "10.0% < 10%", CONFIG, id="just-below-threshold"),
        pytest.param(pod(), [], False, "no DCGM series for the pod over 3600s", CONFIG, id="no-series"),
        # coverage: the longest stretch within 2 intervals <=> worst <= interval
        pytest.param(pod(), rows(worst=15.0), True, "2.0% < 10%", CONFIG, id="coverage-stretch-at-the-bound"),
        pytest.param(pod(), rows(worst=15.1), False, "coverage: a stretch of the 3600s window without a sample (or "
                     "from its start to the first) is longer than 2x the observed scrape interval (~15s)", CONFIG,
                     id="coverage-stretch-past-the-bound"),
        pytest.param(pod(), rows(parts=5), False, "coverage: 1 of the window's 6 parts end with no sample in the "
                     "store's lookback before them", CONFIG, id="coverage-part-without-samples"),
        pytest.param(pod(), rows(parts=math.nan), False, "coverage: 6 of the window's 6 parts", CONFIG,
                     id="coverage-parts-missing"),
        pytest.param(pod(), rows(interval=0.0), False, "no spacing of samples to read a scrape interval from",
                     CONFIG, id="coverage-no-spacing"),
        pytest.param(pod(), rows(interval=60.0, worst=60.0, last=NOW - 60), True, "2.0% < 10%", CONFIG,
                     id="slowest-believed-scrape-at-the-bound"),
        pytest.param(pod(), rows(interval=600.0, worst=500.0), False, "samples ~600s apart, sparser than the "
                     "longest scrape interval believed (60s)", CONFIG, id="sparse-samples-are-no-slow-scrape"),
        # freshness at the store's time: at most 2 observed intervals, at most max_sample_age_seconds
        pytest.param(pod(), rows(last=NOW - 30), True, "2.0% < 10%", CONFIG, id="fresh-at-the-bound"),
        pytest.param(pod(), rows(last=NOW - 31), False, "newest sample is 31s old at the store's time, more than "
                     "30s (2x the observed scrape interval ~15s", CONFIG, id="stale-past-2-intervals"),
        pytest.param(pod(), rows(last=NOW - 150, interval=60.0, worst=50.0), False, "more than 120s", CONFIG,
                     id="stale-150s-at-60s-scrape-the-issue"),
        pytest.param(pod(), rows(last=NOW - 21), False, "more than 20s", STRICT_AGE, id="max-sample-age-caps"),
        pytest.param(pod(), rows(last=NOW - 20), True, "2.0% < 10%", STRICT_AGE, id="max-sample-age-boundary"),
        # values
        pytest.param(pod(), rows(util=math.nan), False, "incomplete or NaN statistics", CONFIG, id="nan-util"),
        pytest.param(pod(), rows(valid=0), False, "a device averages NaN", CONFIG, id="nan-device"),
        pytest.param(pod(), rows(util=100.5), False, "100.5% >= 10%", CONFIG, id="percent-ceiling-boundary"),
        pytest.param(pod(), rows(util=100.6), False, "DCGM_FI_DEV_GPU_UTIL reads 100.6% (> 100 %): its unit is not "
                     "what prometheus.gpu_util_unit (auto) says; set it to percent", CONFIG, id="unit-error"),
        pytest.param(pod(full=2), rows(), False, "only 1 of 2 devices report", CONFIG, id="missing-gpu"),
        pytest.param(pod(full=2), rows(devices=2, valid=2), True, "2.0% < 10%", CONFIG, id="both-gpus-report"),
        pytest.param(pod(), rows(host="n2"), False, "DCGM series come from n2, not the pod's node n1", CONFIG,
                     id="other-node"),
        pytest.param(pod(), rows(host="n1.cluster.local"), True, "2.0% < 10%", CONFIG, id="fqdn-host"),
        pytest.param(pod(), rows(host=""), True, "2.0% < 10%", CONFIG, id="no-host-label"),
        # MIG
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), rows(), False, "no DCGM_FI_PROF_GR_ENGINE_ACTIVE series",
                     CONFIG, id="mig-pod-needs-mig-metric"),
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), rows("mig", util=3.0), True, "3.0% < 10%", CONFIG, id="mig"),
        pytest.param(pod(full=1), rows("mig", util=3.0), True, "3.0% < 10%", CONFIG, id="mig-single-strategy"),
        pytest.param(pod(full=1), rows("mig", util=30.0), False, "30.0% >= 10%", CONFIG, id="mig-single-busy"),
        pytest.param(pod(full=1), rows(util=40.0) + rows("mig", util=3.0), False, "40.0% >= 10%", CONFIG,
                     id="whole-gpu-series-first"),
        pytest.param(pod(full=1, mig={"1g.10gb": 1}), rows("mig", util=3.0), False, "no DCGM_FI_DEV_GPU_UTIL series",
                     CONFIG, id="mixed-pod-is-no-single-strategy"),
        pytest.param(pod(full=1, mig={"1g.10gb": 1}), rows() + rows("mig", util=30.0), False, "30.0% >= 10%", CONFIG,
                     id="both-kinds-busiest-wins"),
        # what a query with `below_percent` leaves
        pytest.param(pod(), util_only(55.0), False, "peak GPU utilisation 55.0% >= 10% over 3600s", CONFIG,
                     id="busy-util-alone-is-enough"),
        pytest.param(pod(), rows(util=55.0, worst=900.0), False, "55.0% >= 10%", CONFIG, id="busy-needs-no-coverage"),
        pytest.param(pod(), util_only(math.nan), False, "a device averages NaN over 3600s", CONFIG,
                     id="nan-util-alone"),
        pytest.param(pod(), util_only(2.0), False, "no sample within Prometheus' lookback", CONFIG,
                     id="idle-util-alone-is-not-trusted"),
    ],
)
def test_assess(target: snapshot.Pod, result: list[dict[str, Any]], idle: bool, reason: str,
                config: settings.Settings) -> None:
    found = utilisation.assess(target, readings=utilisation.parse(result), window_seconds=WINDOW,
                               threshold_percent=10, config=config, now=NOW)
    assert found.idle == idle
    assert reason in found.reason, found.reason


def test_evaluated_at_is_the_time_row() -> None:
    time_row = {"metric": {"gs_stat": "time"}, "value": [NOW, str(NOW)]}
    assert utilisation.evaluated_at([*rows(), time_row]) == NOW
    assert utilisation.evaluated_at(rows()) is None
    assert utilisation.evaluated_at([{"metric": {"gs_stat": "time"}, "value": [NOW]}]) is None


def test_parse_ignores_foreign_rows_and_merges_host_spellings() -> None:
    foreign = [{"metric": {"gs_stat": "gpu_util"}, "value": [NOW, "1"]}, {"metric": {}, "value": [NOW, "1"]},
               {"metric": {"gs_stat": "time"}, "value": [NOW, "1"]}]
    readings = utilisation.parse(foreign + rows(host="") + rows(host="n1", util=7.0, interval=10.0))
    assert set(readings) == {("team-a", "p")}
    found = utilisation.assess(pod(), readings=readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    # the busier spelling, and the shorter interval: 14.5 s stretches at a 10 s interval are too long
    assert found.reason.endswith("longer than 2x the observed scrape interval (~10s)")


@pytest.mark.parametrize("nan_first", [True, False], ids=["nan-spelling-first", "nan-spelling-last"])
def test_a_nan_under_one_host_spelling_is_never_merged_away(nan_first: bool) -> None:
    """With `below_percent`, a spelling whose util is NaN sends that row alone; merged with a clean idle
    spelling, the NaN must survive whichever comes first (max() and min() keep it only as first argument)."""
    clean = rows(host="n1")
    nan_only = [r for r in rows(host="", util=math.nan) if r["metric"]["gs_stat"] == "gpu_util"]
    readings = utilisation.parse(nan_only + clean if nan_first else clean + nan_only)
    found = utilisation.assess(pod(), readings=readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert not found.idle
    assert "NaN" in found.reason
