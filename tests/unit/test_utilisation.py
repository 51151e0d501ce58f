"""The pure half of idle detection: the one PromQL query per window and the fail-closed reading."""

from __future__ import annotations

import math
from typing import Any

import pytest

from common import gpu, settings_loader, snapshot
from descheduler import utilisation

NOW = 1_800_000_000.0
CONFIG = settings_loader.load()


def pod(*, full: int = 1, mig: dict[str, int] | None = None, node: str = "n1") -> snapshot.Pod:
    return snapshot.Pod(
        "team-a", "p", "uid", node, "Running", gpu.GpuRequest(full=full, mig=mig or {}), 0, "batch",
        "PreemptLowerPriority", {}, {}, None, None, "", (), False, "default-scheduler", {},
    )


def rows(kind: str = "gpu", host: str = "n1", **stats: float) -> list[dict[str, Any]]:
    values = {"util": 2.0, "samples": 60.0, "devices": 1.0, "valid": 1.0, "last": NOW - 30, "lag": -0.5, "gap": 1.0,
              **stats}
    return [
        {"metric": {"gs_namespace": "team-a", "gs_pod": "p", "gs_host": host, "gs_stat": f"{kind}_{stat}"},
         "value": [NOW, "NaN" if math.isnan(value) else str(value)]}
        for stat, value in values.items()
    ]


def query(window: int, *, statistic: str = "peak", below_percent: float | None = None) -> str:
    reclaim = CONFIG.descheduler.reclaim.model_copy(update={"idle_statistic": statistic})
    return utilisation.query(window, config=CONFIG.prometheus, reclaim=reclaim, below_percent=below_percent)


@pytest.mark.parametrize(("statistic", "function"), [("peak", "max_over_time"), ("average", "avg_over_time")])
def test_window_statistic_picks_the_promql_function(statistic: str, function: str) -> None:
    promql = query(600, statistic=statistic)
    assert f'{function}(DCGM_FI_DEV_GPU_UTIL{{GPU_I_PROFILE=""}}[600s])' in promql


def test_query_is_one_expression_for_all_pods_with_every_label_spelling() -> None:
    promql = query(3600, statistic="average")
    # util, samples, devices, valid, and in each of the two coverage terms the samples per interval
    assert promql.count("[3600s])") == 2 * 6
    assert promql.count("[3600s:30s]") == 2 * 6  # first sample, staleness, and twice all and visible steps
    assert 'DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=""}' in promql
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!=""}[3600s]) * 100' in promql
    for label in ("pod", "exported_pod", "namespace", "exported_namespace", "Hostname", "hostname"):
        assert f'"$1", "{label}", "(.+)"' in promql
    assert "team-a" not in promql and "max by (gs_namespace, gs_pod, gs_host)" in promql
    # every series folds onto its device first: a GPU scraped twice is one device
    assert 'label_join(' in promql and '"gs_device", "/", "UUID", "gpu", "GPU_I_ID")' in promql
    assert "count by (gs_namespace, gs_pod, gs_host) (max by (gs_namespace, gs_pod, gs_host, gs_device) (" in promql


@pytest.mark.parametrize(("window", "step"), [(10800, 90), (3600, 30), (1200, 10), (600, 10), (60, 6), (5, 1)])
def test_coverage_step_is_finer_for_short_windows(window: int, step: int) -> None:
    assert utilisation.step_seconds(window, config=CONFIG.descheduler.reclaim) == step
    assert f"[{window}s:{step}s]" in query(window)


def test_with_a_threshold_only_util_comes_back_for_busy_pods() -> None:
    promql = query(3600, below_percent=7.5)
    keep = "and on (gs_namespace, gs_pod, gs_host) (max by (gs_namespace, gs_pod, gs_host) ("
    assert promql.count(keep) == 12  # the six other statistics of each of the two metrics; util itself not
    assert promql.count(") < 7.5)") == 12
    assert "and on" not in query(3600)


def util_only(value: float) -> list[dict[str, Any]]:
    """What a query with `below_percent` returns for a pod whose util is not below it."""
    return [row for row in rows(util=value) if row["metric"]["gs_stat"] == "gpu_util"]


@pytest.mark.parametrize(
    ("target", "result", "idle", "reason"),
    [
        pytest.param(pod(), rows(), True, "GPU utilisation 2.0% < 10% over 3600s", id="idle"),
        pytest.param(pod(), rows(util=10.0), False, "GPU utilisation 10.0% >= 10%", id="at-threshold-not-idle"),
        pytest.param(pod(), [], False, "no DCGM series for the pod over 3600s", id="no-series"),
        pytest.param(pod(), rows(gap=3.0), False, "coverage: ~180s without a sample within the 3600s window: "
                     "3.0x the observed scrape interval (~60s), at most 2x", id="coverage-gap"),
        pytest.param(pod(), rows(samples=10, lag=7.5), False, "coverage: first sample ~450s after the window's "
                     "start: 7.5x the observed scrape interval (~60s), at most 2x", id="coverage-late-start"),
        pytest.param(pod(), rows(gap=2.0, lag=2.0), True, "2.0% < 10%", id="coverage-at-the-bound"),
        pytest.param(pod(), rows(samples=2, lag=-1, gap=1), False, "2 samples over 3600s, need 3 to see a scrape "
                     "interval", id="too-few-samples"),
        pytest.param(pod(), rows(last=NOW - 600), False, "newest sample is 600s old (stale)", id="stale"),
        pytest.param(pod(), rows(util=math.nan), False, "incomplete or NaN statistics", id="nan-util"),
        pytest.param(pod(), rows(valid=0), False, "a device averages NaN", id="nan-device"),
        pytest.param(pod(full=2), rows(), False, "only 1 of 2 devices report", id="missing-gpu"),
        pytest.param(pod(full=2), rows(devices=1, valid=1), False, "only 1 of 2 devices report",
                     id="one-gpu-scraped-twice-is-one-device"),
        pytest.param(pod(), rows(host="n2"), False, "DCGM series come from n2, not the pod's node n1",
                     id="other-node"),
        pytest.param(pod(), rows(host="n1.cluster.local"), True, "2.0% < 10%", id="fqdn-host"),
        pytest.param(pod(), rows(host=""), True, "2.0% < 10%", id="no-host-label"),
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), rows(), False, "no DCGM_FI_PROF_GR_ENGINE_ACTIVE series",
                     id="mig-pod-needs-mig-metric"),
        pytest.param(pod(full=0, mig={"1g.10gb": 1}), rows("mig", util=3.0), True, "3.0% < 10%", id="mig"),
        pytest.param(pod(full=1, mig={"1g.10gb": 1}), rows() + rows("mig", util=30.0), False, "30.0% >= 10%",
                     id="both-kinds-busiest-wins"),
        pytest.param(pod(), util_only(55.0), False, "peak GPU utilisation 55.0% >= 10% over 3600s",
                     id="busy-util-alone-is-enough"),
        pytest.param(pod(), rows(util=55.0, samples=3), False, "55.0% >= 10%", id="busy-needs-no-coverage"),
        pytest.param(pod(), util_only(math.nan), False, "a device averages NaN over 3600s", id="nan-util-alone"),
        pytest.param(pod(), util_only(2.0), False, "no sample within Prometheus' lookback",
                     id="idle-util-alone-is-not-trusted"),
    ],
)
def test_assess(target: snapshot.Pod, result: list[dict[str, Any]], idle: bool, reason: str) -> None:
    found = utilisation.assess(target, readings=utilisation.parse(result), window_seconds=3600,
                               threshold_percent=10, config=CONFIG, now=NOW)
    assert found.idle == idle
    assert reason in found.reason


def test_parse_ignores_foreign_rows_and_merges_host_spellings() -> None:
    foreign = [{"metric": {"gs_stat": "gpu_util"}, "value": [NOW, "1"]}, {"metric": {}, "value": [NOW, "1"]}]
    readings = utilisation.parse(foreign + rows(host="") + rows(host="n1", util=7.0))
    assert set(readings) == {("team-a", "p")}
    found = utilisation.assess(pod(), readings=readings, window_seconds=3600, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert found.reason == "peak GPU utilisation 7.0% < 10% over 3600s"  # the busier spelling wins


@pytest.mark.parametrize("nan_first", [True, False], ids=["nan-spelling-first", "nan-spelling-last"])
def test_a_nan_under_one_host_spelling_is_never_merged_away(nan_first: bool) -> None:
    """With `below_percent`, a spelling whose util is NaN sends that row alone; merged with a clean idle
    spelling, the NaN must survive whichever comes first (max() and min() keep it only as first argument)."""
    clean = rows(host="n1")
    nan_only = [r for r in rows(host="", util=math.nan) if r["metric"]["gs_stat"] == "gpu_util"]
    readings = utilisation.parse(nan_only + clean if nan_first else clean + nan_only)
    found = utilisation.assess(pod(), readings=readings, window_seconds=3600, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert not found.idle
    assert "NaN" in found.reason
