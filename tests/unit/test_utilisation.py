"""The pure half of idle detection: the parts' PromQL, the kept parts across cycles, the fail-closed reading.

The store is simulated sample by sample as Prometheus 2.x answers (`Store`: ranges closed on both ends, a
5-minute lookback, `max by` ignoring NaN unless every copy is NaN), so that each row states samples and
store times, and the reading is derived by the code under test from the store's per-part answers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from common import dra, gpu, settings, settings_loader, snapshot, snapshot_build
from descheduler.reclaim import utilisation, utilisation_fold, utilisation_parts, utilisation_promql, utilisation_window
from tests import builders

P = 300
NOW = 1_800_000_000.0  # a multiple of 300: windows of whole parts start on the grid
CONFIG = settings_loader.load()
EMPTY_NODE = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[], priority_classes=[],
                                  names=CONFIG.names, taken_at=NOW).nodes["n1"]
WINDOW = 600
LOOKBACK = 300.0


def pod(*, full: int = 1, mig: dict[str, int] | None = None, node: str = "n1", name: str = "p") -> snapshot.Pod:
    return snapshot.Pod(
        "team-a", name, "uid", node, "Running", gpu.GpuRequest(full=full, mig=mig or {}), 0, "batch",
        "PreemptLowerPriority", {}, {}, None, None, "", (), False, "default-scheduler", {},
    )


@dataclasses.dataclass(frozen=True)
class Series:
    """One series: labels, samples (time, value), and when each sample reached the store (default: at once)."""

    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]
    arrives: Mapping[float, float] = dataclasses.field(default_factory=dict)  # sample time -> store time it arrives
    kind: str = "gpu"


def dcgm(gpu_index: str = "0", *, pod_name: str = "p", host: str = "n1", **extra: str) -> dict[str, str]:
    return {"namespace": "team-a", "pod": pod_name, "Hostname": host, "gpu": gpu_index,
            "UUID": f"GPU-{host}-{gpu_index}", **extra}


def scraped(every: float = 15.0, *, start: float = NOW - 4000, end: float = NOW - 5, value: float = 1.0,
            missing: tuple[float, float] | None = None, busy: Mapping[float, float] | None = None,
            ) -> list[tuple[float, float]]:
    """A sample every `every` s from `start` to `end` (store times), none in `missing` (from, to), and
    `busy`: times whose value is different."""
    out, at = [], end
    while at >= start:
        if missing is None or not missing[0] <= at <= missing[1]:
            out.append((at, (busy or {}).get(at, value)))
        at -= every
    return sorted(out)


class Store:
    """Answers the per-device statistics as Prometheus 2.x does at store time `now` (ranges closed on both
    ends; `last` within the lookback; copies with the same device labels aggregated as `max by`/`min by`)."""

    def __init__(self, series: Sequence[Series], *, now: float, left_closed: bool = True) -> None:
        self.series = series
        self.now = now
        self.left_closed = left_closed  # Prometheus 2.x; 3.x: False

    def _visible(self, one: Series) -> list[tuple[float, float]]:
        return [(t, v) for t, v in one.samples if one.arrives.get(t, t) <= self.now]

    def _stat(self, one: Series, stat: str, *, end: float, span: float) -> float | None:
        samples = self._visible(one)
        inside = [v for t, v in samples if (end - span <= t if self.left_closed else end - span < t) and t <= end]
        if stat == "last":
            times = [t for t, _ in samples if end - LOOKBACK <= t <= end]
            return max(times) if times else None
        if not inside:
            return None
        if stat in ("n", "n_min"):
            return float(len(inside))
        if stat == "sum":
            return sum(inside)
        numbers = [v for v in inside if not math.isnan(v)]
        return max(numbers) if numbers else math.nan

    def _rows(self, kind: str, stat: str, ends: Sequence[float], span: float, *, ranged: bool) -> list[dict[str, Any]]:
        groups: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        for one in self.series:
            if one.kind != kind:
                continue
            key = tuple(sorted((k, v) for k, v in one.labels.items() if k not in ("job", "instance")))
            for end in ends:
                value = self._stat(one, stat, end=end, span=span)
                if value is None:
                    continue
                found = groups.setdefault(key, {})
                old = found.get(end)
                if old is None or (stat == "n_min" and value < old) or (
                        stat != "n_min" and (math.isnan(old) or value > old)):
                    found[end] = value
        rows = []
        for key, values in groups.items():
            points = [[end, repr(value)] for end, value in sorted(values.items())]
            metric = dict(key)
            rows.append({"metric": metric, "values": points} if ranged else {"metric": metric, "value": points[0]})
        return rows

    def live(self, kind: str, grid: utilisation_parts.Grid, stats: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        span = self.now - grid.live_start(self.now)
        return {stat: self._rows(kind, stat, [self.now], span, ranged=False) for stat in stats}

    def parts(self, kind: str, first: int, last: int, stats: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        ends = [(j + 1) * P for j in range(first, last + 1)]
        return {stat: self._rows(kind, stat, ends, P, ranged=True) for stat in stats}


@dataclasses.dataclass
class Run:
    """Cycles at the given store times over one cache per kind; `reads`: the parts read per cycle."""

    caches: dict[str, utilisation_parts.Cache] = dataclasses.field(default_factory=dict)
    reads: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)  # whole-GPU parts read
    readings: utilisation.Readings = dataclasses.field(default_factory=dict)
    store_left_closed: bool = True  # the simulated store: Prometheus 2.x
    left_closed: bool | None = True  # what the reading is told the store does

    def cycle(self, series: Sequence[Series], *, now: float, window: float, config: settings.Settings,
              pods: Mapping[tuple[str, str], str], failing: bool = False,
              fails: Callable[[], bool] | None = None) -> None:
        """One cycle; `failing`: every range read fails (a timeout), `fails`: asked for each range read."""
        reclaim = config.descheduler.reclaim
        grid = utilisation_parts.Grid.of(reclaim)
        stats = utilisation_promql.STATS[reclaim.idle_statistic]
        store = Store(series, now=now, left_closed=self.store_left_closed)
        lives: dict[str, utilisation_parts.Part] = {}
        short: tuple[dict[str, utilisation_parts.Part], dict[str, utilisation_parts.Part]] = ({}, {})
        unread: dict[str, set[int]] = {}
        read: list[tuple[int, int]] = []
        for kind in utilisation.KINDS:
            cache = self.caches.setdefault(kind, utilisation_parts.Cache())
            cache.prune(grid.needed(window, now)[0])
            lives[kind] = cache.live(store.live(kind, grid, stats), labels=config.prometheus.labels)
            if grid.short(window, now):  # its own stretch, and the last sample before it
                inside = {stat: store._rows(kind, stat, [now], window, ranged=False) for stat in stats}
                before = {"last": store._rows(kind, "last", [now - window], window, ranged=False)}
                short[0][kind] = cache.live(inside, labels=config.prometheus.labels)
                short[1][kind] = cache.live(before, labels=config.prometheus.labels)
            unread[kind] = set()
            for first, last in cache.fetch(grid, window=window, now=now):
                if kind == "gpu":
                    read.append((first, last))
                if failing or (fails is not None and fails()):
                    unread[kind].update(range(first, last + 1))
                    continue
                cache.store(grid, store.parts(kind, first, last, stats), first=first, last=last, now=now,
                            live=lives[kind], labels=config.prometheus.labels, left_closed=self.left_closed)
        self.reads.append(read)
        judging = utilisation_window.Judging(window, now, grid, reclaim.idle_statistic == "average",
                                            reclaim.max_gap_intervals, self.left_closed)
        self.readings = utilisation_window.readings(self.caches, lives, pods=pods, judging=judging, unread=unread,
                                                   short=short if grid.short(window, now) else None,
                                                   short_name=config.prometheus.hostname_match == "short-name")


def judge(series: Sequence[Series], *, target: snapshot.Pod | None = None, window: int = WINDOW,
          cycles: Sequence[float] = (NOW,), config: settings.Settings = CONFIG, threshold: float = 10,
          run: Run | None = None) -> utilisation.Assessment:
    """The assessment after cycles at `cycles` (store times, the last one judged) over one cache."""
    target = target or pod()
    run = run or Run()
    pods = {(target.namespace, target.name): target.node_name or ""}
    for at in cycles:
        run.cycle(series, now=at, window=window, config=config, pods=pods)
    return utilisation.assess(target, readings=run.readings, window_seconds=window, threshold_percent=threshold,
                              config=config, now=cycles[-1])


def steady(**kwargs: Any) -> Series:
    return Series(dcgm(), scraped(**kwargs))


TWIN = pytest.mark.parametrize("twin", [pytest.param(False, id="one-copy"), pytest.param(True, id="twin")])


def twins(series: Sequence[Series], twin: bool) -> list[Series]:
    """With `twin`, each series of host n1 also under the other host label (`hostname`, newer exporters): the
    same device, folded part by part (not from the kept summary); the verdict must not change."""
    extra = [dataclasses.replace(one, labels={**one.labels, "Hostname": "", "hostname": "n1"})
             for one in series if twin and one.labels.get("Hostname") == "n1"]
    return [*series, *extra]


# --- the queries -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statistic", "functions"),
    [
        pytest.param("peak", ["count_over_time", "max_over_time", "timestamp"], id="peak"),
        pytest.param("average", ["count_over_time", "count_over_time", "sum_over_time", "timestamp"], id="average"),
    ],
)
def test_each_statistic_is_one_small_query_over_a_plain_range(statistic: str, functions: list[str]) -> None:
    asked = utilisation_promql.queries("300s", config=CONFIG.prometheus, statistic=statistic, kinds={"gpu"})
    assert [next(f for f in ("count_over_time", "max_over_time", "sum_over_time", "timestamp") if f in q)
            for q in asked.values()] == functions
    for promql in asked.values():
        assert ":" not in promql.split("[", 1)[-1] and "label_replace" not in promql and " or " not in promql
        assert "[300s]" in promql or "timestamp(" in promql


@pytest.mark.parametrize(
    ("seconds", "span"),
    [pytest.param(420.123, "420123ms", id="milliseconds"), pytest.param(0.0, "1ms", id="never-empty")],
)
def test_live_range_in_milliseconds(seconds: float, span: str) -> None:
    assert utilisation_promql.live_range(seconds) == span


def test_rows_keep_every_label_spelling_and_device_identity() -> None:
    by = utilisation_promql.device_labels(CONFIG.prometheus.labels)
    assert by == "namespace, exported_namespace, pod, exported_pod, Hostname, hostname, gpu, UUID, GPU_I_ID"


def test_only_the_kinds_asked_about() -> None:
    asked = utilisation_promql.queries("300s", config=CONFIG.prometheus, statistic="peak", kinds={"gpu"})
    assert set(asked) == {"gpu_n", "gpu_peak", "gpu_last"}
    assert all('GPU_I_PROFILE=""' in q for q in asked.values())


@pytest.mark.parametrize(
    ("metric", "unit", "scaled"),
    [
        pytest.param("DCGM_FI_DEV_GPU_UTIL", "auto", False, id="percent-metric"),
        pytest.param("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "auto", True, id="prof-metric-is-a-ratio"),
        pytest.param("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "percent", False, id="unit-set-by-hand"),
        pytest.param("my_recorded_ratio", "ratio", True, id="ratio-set-by-hand"),
    ],
)
def test_units(metric: str, unit: str, scaled: bool) -> None:
    prom = settings.Prometheus(gpu_util_metric=metric, gpu_util_unit=unit)
    for statistic in ("peak", "average"):
        asked = utilisation_promql.queries("300s", config=prom, statistic=statistic, kinds={"gpu"})
        value = asked["gpu_peak" if statistic == "peak" else "gpu_sum"]
        assert value.endswith(" * 100)") == scaled


# --- the grid ------------------------------------------------------------------------------------------


GRID = utilisation_parts.Grid.of(CONFIG.descheduler.reclaim)  # 300 s parts, settled 120 s after their end


@pytest.mark.parametrize(
    ("window", "now", "start", "first", "live"),
    [
        pytest.param(600, NOW, NOW - 600, NOW / P - 3, NOW - 300, id="on-the-grid"),
        pytest.param(600, NOW + 100, NOW - 600, NOW / P - 3, NOW - 300, id="start-inside-a-part-takes-it-whole"),
        pytest.param(600, NOW + 120, NOW - 600, NOW / P - 3, NOW, id="a-part-settles-120s-after-its-end"),
        pytest.param(600, NOW + 119, NOW - 600, NOW / P - 3, NOW - 300, id="not-settled-1s-before"),
        pytest.param(200, NOW, NOW - 300, NOW / P - 2, NOW - 300, id="short-window-starts-at-the-live-stretch"),
        pytest.param(10800, NOW + 1, NOW - 10800, NOW / P - 37, NOW - 300, id="3h-window"),
    ],
)
def test_grid(window: int, now: float, start: float, first: float, live: float) -> None:
    assert GRID.start(window, now) == start
    assert GRID.needed(window, now)[0] == first
    assert GRID.live_start(now) == live
    assert GRID.needed(window, now)[-1] == live / P - 1


def test_runs_are_consecutive_parts_newest_first() -> None:
    assert utilisation_parts.runs([3, 5, 4, 9, 1]) == [(9, 9), (3, 5), (1, 1)]
    assert utilisation_parts.runs([]) == []


# --- the verdict: coverage, freshness, values -------------------------------------------------------------


STRICT_AGE = settings_loader.load(overrides={"descheduler": {"reclaim": {"max_sample_age_seconds": 20}}})
AVERAGE = settings_loader.load(overrides={"descheduler": {"reclaim": {"idle_statistic": "average"}}})
MIG_POD = pod(full=0, mig={"1g.10gb": 1})
SHORT_NAME = settings_loader.load(overrides={"prometheus": {"hostname_match": "short-name"}})
SCOPED = settings_loader.load(overrides={"prometheus": {"scope_matchers": ['cluster="a"']}})


def no_uuid(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "UUID"}


def no_index(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "gpu"}


def mig_series(instance: str = "1", *, value: float = 0.02 * 100, **kwargs: Any) -> Series:
    return Series(dcgm("7", GPU_I_PROFILE="1g.10gb", GPU_I_ID=instance), scraped(value=value, **kwargs), kind="mig")


@pytest.mark.parametrize(
    ("series", "target", "window", "now", "config", "idle", "reason"),
    [
        pytest.param([steady()], None, WINDOW, NOW, CONFIG, True, "peak GPU utilisation 1.0% < 10% over 600s",
                     id="idle"),
        pytest.param([steady(value=10.0)], None, WINDOW, NOW, CONFIG, False, "10.0% >= 10%", id="at-threshold"),
        pytest.param([steady(value=9.99)], None, WINDOW, NOW, CONFIG, True, "10.0% < 10%", id="below-threshold"),
        pytest.param([], None, WINDOW, NOW, CONFIG, False, "no DCGM series for the pod over 600s", id="no-series"),
        pytest.param([steady(every=60)], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%", id="covered-at-60s"),
        pytest.param([steady(every=10, end=NOW - 9)], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="covered-at-10s"),
        # one stretch of 2 intervals (one missed scrape) is the bound; 3 is past it
        pytest.param([steady(missing=(NOW - 200, NOW - 200))], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="gap-of-2-intervals-at-the-bound"),
        pytest.param([steady(missing=(NOW - 215, NOW - 200))], None, WINDOW, NOW, CONFIG, False,
                     "longer than 2x the observed scrape interval (~15s)", id="gap-of-3-intervals"),
        pytest.param([steady(missing=(NOW - 320, NOW - 290))], None, WINDOW, NOW, CONFIG, False,
                     "longer than 2x", id="gap-across-a-part-boundary"),
        pytest.param([steady(missing=(NOW - 305, NOW - 305))], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="one-missed-scrape-on-a-part-boundary"),
        # a part with no sample of its own is a stretch of at least its length (the interval is not read from
        # the one part holding every sample)
        pytest.param([steady(start=NOW - 150)], None, WINDOW, NOW, CONFIG, False,
                     "or from its start to the first) is longer than 2x", id="a-part-without-a-sample"),
        pytest.param([steady(every=60, start=NOW - 150)], None, WINDOW, NOW, CONFIG, False, "longer than 2x",
                     id="a-part-without-a-sample-at-60s"),
        # a window shorter than the live stretch is its own stretch, from exactly its start
        pytest.param([steady(start=NOW - 60)], None, 30, NOW, CONFIG, True, "1.0% < 10% over 30s",
                     id="short-window-needs-no-more-history"),
        pytest.param([steady(start=NOW - 25, end=NOW - 1)], None, 30, NOW, CONFIG, True, "1.0% < 10% over 30s",
                     id="short-window-first-sample-5s-after-start"),
        pytest.param([steady(start=NOW - 160, busy={NOW - 125: 70.0})], None, 120, NOW, CONFIG, True,
                     "1.0% < 10% over 120s", id="short-window-busy-before-it"),
        pytest.param([steady(start=NOW - 160, busy={NOW - 110: 70.0})], None, 120, NOW, CONFIG, False,
                     "70.0% >= 10% over 120s", id="short-window-busy-inside"),
        # the first sample after the window's start on the grid
        pytest.param([steady(start=NOW - 575)], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="first-sample-25s-after-start"),
        pytest.param([steady(start=NOW - 560)], None, WINDOW, NOW, CONFIG, False, "or from its start to the first",
                     id="first-sample-40s-after-start"),
        # a window starting inside a part takes the whole part: stricter, never laxer
        pytest.param([steady(start=NOW + 100 - 575, end=NOW + 95)], None, WINDOW, NOW + 100, CONFIG, False,
                     "or from its start to the first", id="straddled-part-its-start-counts"),
        pytest.param([steady(busy={NOW - 580: 80.0}, end=NOW + 95)], None, WINDOW, NOW + 100, CONFIG, False,
                     "80.0% >= 10%", id="straddled-part-its-peak-counts"),
        pytest.param([steady(busy={NOW - 610: 80.0}, end=NOW + 95)], None, WINDOW, NOW + 100, CONFIG, True,
                     "1.0% < 10%", id="the-part-before-only-gives-its-last-sample"),
        # freshness at the store's time: at most 2 observed intervals, at most max_sample_age_seconds
        pytest.param([steady(end=NOW - 30)], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%", id="fresh-at-the-bound"),
        pytest.param([steady(end=NOW - 31)], None, WINDOW, NOW, CONFIG, False,
                     "newest sample is 31s old at the store's time, more than 30s", id="stale-past-2-intervals"),
        pytest.param([steady(end=NOW - 21)], None, WINDOW, NOW, STRICT_AGE, False, "more than 20s",
                     id="max-sample-age-caps"),
        pytest.param([steady(end=NOW - 20)], None, WINDOW, NOW, STRICT_AGE, True, "1.0% < 10%",
                     id="max-sample-age-boundary"),
        pytest.param([steady(end=NOW - 400)], None, WINDOW, NOW, CONFIG, False,
                     "no sample within Prometheus' lookback (stale)", id="no-newest-sample"),
        pytest.param([Series(dcgm(), scraped(every=900))], None, 3600, NOW, CONFIG, False,
                     "sparser than the longest scrape interval believed (60s)", id="sparse-samples-are-no-slow-scrape"),
        pytest.param([Series(dcgm(), scraped(every=30, end=NOW - 305) + scraped(start=NOW - 290))], None, WINDOW,
                     NOW, CONFIG, False, "observed scrape interval (~15s)", id="interval-change-judged-at-the-faster"),
        # values
        pytest.param([steady(busy={NOW - 200: math.nan})], None, WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="a-nan-sample-among-numbers-peak-ignores-it"),
        pytest.param([Series(dcgm(), scraped(value=math.nan))], None, WINDOW, NOW, CONFIG, False, "reads NaN",
                     id="all-nan"),
        pytest.param([steady(busy={NOW - 200: math.nan})], None, WINDOW, NOW, AVERAGE, False, "reads NaN",
                     id="average-any-nan"),
        pytest.param([steady(busy={NOW - 200: 60.0})], None, WINDOW, NOW, AVERAGE, True,
                     "average GPU utilisation 2.5% < 10% over 600s", id="average-hides-a-burst"),
        pytest.param([steady(value=100.5)], None, WINDOW, NOW, CONFIG, False, "100.5% >= 10%",
                     id="percent-ceiling-boundary"),
        pytest.param([steady(value=100.6)], None, WINDOW, NOW, CONFIG, False, "DCGM_FI_DEV_GPU_UTIL reads 100.6% "
                     "(> 100 %): its unit is not what prometheus.gpu_util_unit (auto) says; set it to percent",
                     id="unit-error"),
        # devices, not series
        pytest.param([steady()], pod(full=2), WINDOW, NOW, CONFIG, False, "only 1 of 2 devices report",
                     id="missing-gpu"),
        pytest.param([steady()], dataclasses.replace(pod(full=2), dra=dra.PodGpus(count=1, devices=(
                         dra.DeviceId("gpu.nvidia.com", "n1", "gpu-1"),))), WINDOW, NOW, CONFIG, False,
                     "only 1 of 2 devices report (its DRA GPUs: gpu.nvidia.com/n1/gpu-1; a DRA GPU without a "
                     "pod-attributed series is not seen)", id="dra-gpu-without-a-pod-series-is-not-idle"),
        pytest.param([steady(), Series(dcgm("1", dra_claim_name="p-gpus", dra_device_name="gpu-1"), scraped())],
                     dataclasses.replace(pod(full=2), dra=dra.PodGpus(count=1, devices=(
                         dra.DeviceId("gpu.nvidia.com", "n1", "gpu-1"),))), WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="dra-gpu-with-a-pod-series-is-measured"),
        pytest.param([steady(), Series(dcgm("1"), scraped())], pod(full=2), WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="both-gpus-report"),
        pytest.param([steady(), Series(dcgm("1"), scraped(missing=(NOW - 215, NOW - 200)))], pod(full=2), WINDOW,
                     NOW, CONFIG, False, "coverage", id="worst-device-decides"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()), Series({**dcgm(), "job": "b", "UUID": ""},
                                                                        scraped())],
                     pod(full=2), WINDOW, NOW, CONFIG, False, "only 1 of 2 devices report",
                     id="gpu-scraped-twice-one-copy-without-uuid-is-one-device"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()), Series({**dcgm(), "job": "b", "UUID": ""},
                                                                        scraped(start=NOW - 100))],
                     None, WINDOW, NOW, CONFIG, True, "1.0% < 10%", id="one-full-copy-covers-the-device"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()),
                      Series({**dcgm(), "job": "b", "UUID": ""}, scraped(busy={NOW - 95: 70.0}))],
                     None, WINDOW, NOW, CONFIG, False, "70.0% >= 10%", id="the-busier-copy-wins"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()),
                      Series({**dcgm(), "job": "b", "UUID": ""}, scraped(every=30, value=30.0))],
                     None, WINDOW, NOW, AVERAGE, False, "30.0% >= 10%", id="average-bounds-every-copy"),
        # what is measured: the GPUs the running containers hold, not an init container's larger request
        pytest.param([steady()], dataclasses.replace(pod(full=2), running=gpu.GpuRequest(full=1)), WINDOW, NOW,
                     CONFIG, True, "1.0% < 10%", id="init-container-asked-more-measured-on-the-running-one"),
        pytest.param([steady()], dataclasses.replace(pod(full=3), running=gpu.GpuRequest(full=2)), WINDOW, NOW,
                     CONFIG, False, "only 1 of 2 devices report", id="init-larger-running-two-one-silent"),
        pytest.param([steady()], dataclasses.replace(pod(full=1), running=gpu.GpuRequest()), WINDOW, NOW, CONFIG,
                     False, "no running container holds a GPU (its 1 GPU were asked by init containers only)",
                     id="gpus-in-init-containers-only-nothing-to-measure"),
        # where
        pytest.param([Series(dcgm(host="n2"), scraped())], None, WINDOW, NOW, CONFIG, False,
                     "DCGM series come from n2, not the pod's node n1", id="other-node"),
        pytest.param([steady(), Series({**dcgm(host="n1.cluster.local"), "UUID": "GPU-n1-0"},
                                       scraped(start=NOW - 200))], None, WINDOW, NOW,
                     SHORT_NAME, True, "1.0% < 10%", id="second-host-spelling-silent-in-a-part-folds-to-the-fuller"),
        pytest.param([Series(dcgm(host="n1.cluster.local"), scraped())], None, WINDOW, NOW, SHORT_NAME, True,
                     "1.0% < 10%", id="fqdn-host-short-name"),
        pytest.param([Series(dcgm(host="n1.cluster.local"), scraped())], None, WINDOW, NOW, CONFIG, False,
                     "DCGM series come from n1.cluster.local, not the pod's node n1", id="fqdn-host-exact"),
        # hosts are whole names: gpu-01.a.example is not gpu-01.b.example (two clusters, one store)
        pytest.param([Series(dcgm(host="gpu-01.b.example"), scraped())], pod(node="gpu-01.a.example"), WINDOW, NOW,
                     CONFIG, False, "come from gpu-01.b.example, not the pod's node gpu-01.a.example",
                     id="same-short-name-other-domain-is-another-host"),
        pytest.param([Series(dcgm(host="gpu-01.a.example"), scraped()),
                      Series({**dcgm(host="gpu-01.b.example"), "UUID": "GPU-b"}, scraped(end=NOW - 900))],
                     pod(node="gpu-01.a.example"), WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="other-domains-series-are-not-the-pods"),
        pytest.param([Series(dcgm(host="gpu-01.b.example"), scraped())], pod(node="gpu-01.a.example"), WINDOW, NOW,
                     SHORT_NAME, True, "1.0% < 10%", id="short-name-folds-domains-when-the-operator-says-so"),
        # a series without a host is taken for the pod's wherever it comes from: in a shared store it may be another
        # cluster's same-named pod (ours silent), so unscoped it never makes a pod idle; scoped it is judged
        pytest.param([Series(dcgm(host=""), scraped())], None, WINDOW, NOW, CONFIG, False,
                     "idle, but read partly from series without a Hostname label, which a store shared by several "
                     "clusters cannot tell from another cluster's same-named pod; set prometheus.scope_matchers",
                     id="unscoped-no-host-label-idle-fails-closed"),
        pytest.param([Series(dcgm(host=""), scraped())], None, WINDOW, NOW, SCOPED, True, "1.0% < 10%",
                     id="scoped-no-host-label-is-judged"),
        pytest.param([Series(dcgm(host=""), scraped(value=60.0))], None, WINDOW, NOW, CONFIG, False, "60.0% >= 10%",
                     id="unscoped-no-host-label-busy-is-busy"),
        pytest.param([Series(dcgm(host=""), scraped(value=10.0))], None, WINDOW, NOW, CONFIG, False, "10.0% >= 10%",
                     id="unscoped-no-host-label-at-the-threshold-is-busy-boundary"),
        pytest.param([steady(), Series({**dcgm(host=""), "UUID": "GPU-n1-0", "job": "b"}, scraped())], None, WINDOW,
                     NOW, CONFIG, False, "read partly from series without a Hostname label",
                     id="unscoped-one-copy-without-host-fails-closed"),
        pytest.param([Series({**dcgm(host=""), "hostname": "n1", "UUID": "GPU-n1-0"}, scraped(busy={NOW - 20: 50.0})),
                      Series(dcgm(), scraped())], pod(full=1), WINDOW, NOW, CONFIG, False, "50.0% >= 10%",
                     id="host-spellings-of-one-node-are-one-device-the-busier-wins"),
        pytest.param([Series({**dcgm(host=""), "hostname": "n1", "UUID": "GPU-n1-0"}, scraped()),
                      Series(dcgm(), scraped())], pod(full=2), WINDOW, NOW, CONFIG, False, "only 1 of 2 devices report",
                     id="host-spellings-of-one-gpu-are-not-two-gpus"),
        pytest.param([Series({**dcgm(), "exported_pod": "p", "pod": "dcgm-exporter-x"}, scraped())], None, WINDOW,
                     NOW, CONFIG, True, "1.0% < 10%", id="exported-pod-label-wins"),
        # identity: the UUID first; one GPU is one device whatever the scrape paths
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()), Series({**no_index(dcgm()), "job": "b"}, scraped())],
                     pod(full=2), WINDOW, NOW, CONFIG, False, "only 1 of 2 devices report",
                     id="issue-a-copy-with-uuid-and-no-index-is-the-indexed-gpu-not-a-second-one"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()),
                      Series({**no_index(dcgm()), "job": "b"}, scraped(busy={NOW - 95: 70.0}))],
                     None, WINDOW, NOW, CONFIG, False, "70.0% >= 10%", id="the-busier-uuid-only-copy-wins"),
        pytest.param([Series(no_index(dcgm()), scraped())], None, WINDOW, NOW, CONFIG, True, "1.0% < 10% over 600s",
                     id="uuid-alone-identifies-a-gpu"),
        pytest.param([Series({**dcgm(), "job": "a"}, scraped()), Series({**no_uuid(dcgm()), "job": "b"}, scraped()),
                      Series({**no_index(dcgm()), "job": "c"}, scraped())],
                     pod(full=1), WINDOW, NOW, CONFIG, True, "1.0% < 10% over 600s",
                     id="three-scrape-paths-of-one-gpu-are-one-device"),
        pytest.param([Series(no_uuid(dcgm()), scraped())], None, WINDOW, NOW, CONFIG, True,
                     "; identified by host and index, no UUID label: GPU 0 on n1", id="index-fallback-is-said"),
        pytest.param([steady()], None, WINDOW, NOW, CONFIG, True, "1.0% < 10% over 600s",
                     id="uuid-identified-says-no-fallback"),
        # the same host and index under two UUIDs: two GPUs (another cluster's node of the same name)
        pytest.param([steady(), Series({**dcgm(), "UUID": "GPU-other"}, scraped())], None, WINDOW, NOW, CONFIG,
                     False, "the pod's series show 2 distinct GPUs, it holds 1 (another cluster's series in the same "
                     "store? set prometheus.scope_matchers)", id="unscoped-more-gpus-than-held-fails-closed"),
        pytest.param([steady(), Series({**dcgm(), "UUID": "GPU-other"}, scraped())], None, WINDOW, NOW, SCOPED,
                     True, "1.0% < 10%", id="scoped-store-more-gpus-than-held-is-judged"),
        pytest.param([steady(), Series(dcgm("1"), scraped())], pod(full=2), WINDOW, NOW, CONFIG, True, "1.0% < 10%",
                     id="as-many-gpus-as-held-boundary"),
        pytest.param([steady(), Series({**dcgm(), "UUID": "GPU-other"}, scraped(value=95.0))], None, WINDOW, NOW,
                     CONFIG, False, "95.0% >= 10%", id="the-other-uuids-busy-reading-is-busy"),
        pytest.param([steady(), Series({**dcgm(), "UUID": "GPU-other"}, scraped()),
                      Series({**no_uuid(dcgm()), "job": "b"}, scraped())], pod(full=2), WINDOW, NOW, CONFIG, False,
                     "show 3 distinct GPUs, it holds 2", id="a-uuid-less-copy-between-two-uuids-is-not-guessed"),
        # MIG
        pytest.param([steady()], MIG_POD, WINDOW, NOW, CONFIG, False, "no DCGM_FI_PROF_GR_ENGINE_ACTIVE series",
                     id="mig-pod-needs-mig-metric"),
        pytest.param([mig_series()], MIG_POD, WINDOW, NOW, CONFIG, True, "2.0% < 10%", id="mig"),
        pytest.param([mig_series("1"), mig_series("2")], pod(full=0, mig={"1g.10gb": 2}), WINDOW, NOW, CONFIG, True,
                     "2.0% < 10%", id="mig-instances-of-one-gpu-are-two-devices"),
        pytest.param([mig_series()], pod(), WINDOW, NOW, CONFIG, True, "2.0% < 10%", id="mig-single-strategy"),
        pytest.param([mig_series(value=30.0)], pod(), WINDOW, NOW, CONFIG, False, "30.0% >= 10%",
                     id="mig-single-busy"),
        pytest.param([steady(value=40.0), mig_series()], pod(), WINDOW, NOW, CONFIG, False, "40.0% >= 10%",
                     id="whole-gpu-series-first"),
        pytest.param([mig_series()], pod(full=1, mig={"1g.10gb": 1}), WINDOW, NOW, CONFIG, False,
                     "no DCGM_FI_DEV_GPU_UTIL series", id="mixed-pod-is-no-single-strategy"),
        # busy needs nothing else
        pytest.param([steady(value=55.0, start=NOW - 100)], None, WINDOW, NOW, CONFIG, False,
                     "peak GPU utilisation 55.0% >= 10% over 600s", id="busy-needs-no-coverage"),
    ],
)
@TWIN
def test_verdict(series: list[Series], target: snapshot.Pod | None, window: int, now: float,
                 config: settings.Settings, idle: bool, reason: str, twin: bool) -> None:
    found = judge(twins(series, twin), target=target, window=window, cycles=(now,), config=config)
    assert (found.idle, reason in found.reason) == (idle, True), found.reason


ON_GRID = scraped(end=NOW)  # a sample every 15 s, one on every part boundary
HOLED = [(t, v) for t, v in ON_GRID if not NOW - 165 <= t <= NOW - 150]  # 45 s without a sample
MISSED = [(t, v) for t, v in ON_GRID if t != NOW - 150]  # one missed scrape: 30 s


@pytest.mark.parametrize(
    ("samples", "store_left_closed", "told", "idle", "reason"),
    [
        pytest.param(ON_GRID, True, True, True, "1.0% < 10%", id="prometheus-2-counted-once"),
        pytest.param(MISSED, True, True, True, "1.0% < 10%", id="prometheus-2-one-missed-scrape-at-the-bound"),
        pytest.param(HOLED, True, True, False, "longer than 2x", id="prometheus-2-hole-past-the-bound"),
        pytest.param(ON_GRID, False, False, True, "1.0% < 10%", id="prometheus-3-left-open"),
        pytest.param(HOLED, False, False, False, "longer than 2x", id="prometheus-3-hole-past-the-bound"),
        pytest.param(MISSED, True, None, False, "longer than 2x", id="not-known-yet-one-missed-scrape-fails-closed"),
        pytest.param(scraped(), True, None, True, "1.0% < 10%", id="not-known-yet-off-the-grid-is-exact"),
    ],
)
@TWIN
def test_samples_on_part_boundaries(samples: list[tuple[float, float]], store_left_closed: bool,
                                    told: bool | None, idle: bool, reason: str, twin: bool) -> None:
    """Prometheus 2.x ranges include their left end: a 15 s series with samples exactly on the grid has 21 in
    each part's range. Told which the store does (the shell asks it once), it is counted once; until then a
    part's count is between n - 1 and n, and such a series fails closed (stricter)."""
    run = Run(store_left_closed=store_left_closed, left_closed=told)
    found = judge(twins([Series(dcgm(), samples)], twin), run=run)
    assert (found.idle, reason in found.reason) == (idle, True), found.reason


def test_a_part_whose_last_sample_is_beyond_the_lookback_fails_closed() -> None:
    """The store's lookback shorter than a part: a part's samples without its last sample is no reading."""
    numbers = [(0.0, math.inf, math.nan, NOW - 600.0), (20.0, 20.0, 1.0, math.nan), (20.0, 20.0, 1.0, NOW - 5)]
    device = utilisation_fold.device_reading(numbers, [NOW - 600, NOW - 300], average=False)
    reason, _ = utilisation.coverage(device, window_seconds=600, config=CONFIG.descheduler.reclaim)
    assert reason is not None and "no last sample within the store's lookback" in reason


# --- the kept parts across cycles ----------------------------------------------------------------------


def test_settled_parts_are_read_once_and_the_rest_every_cycle() -> None:
    """Cycles a minute apart: a part is read by range query once it has settled (120 s after its end), once;
    everything newer is the live stretch, asked every cycle."""
    run = Run()
    series = [Series(dcgm(), scraped(end=NOW + 1200))]
    for minute in range(8):
        run.cycle(series, now=NOW + 60 * minute, window=WINDOW, config=CONFIG, pods={("team-a", "p"): "n1"})
    first = int(NOW) // P
    assert run.reads == [[(first - 3, first - 2)], [], [(first - 1, first - 1)], [], [], [], [], [(first, first)]]


@pytest.mark.parametrize(
    ("arrives_after", "cycles", "idle", "reason"),
    [
        pytest.param(200.0, 4, False, "80.0% >= 10%", id="late-sample-in-a-short-part-is-read-again"),
        pytest.param(700.0, 8, True, "1.0% < 10%", id="later-than-late-seconds-is-a-gap"),
        pytest.param(None, 4, False, "80.0% >= 10%", id="on-time-the-control"),
    ],
)
def test_late_samples(arrives_after: float | None, cycles: int, idle: bool, reason: str) -> None:
    """A busy sample of the part ending at NOW reaches the store `arrives_after` s after its time (remote write):
    when the part is kept (NOW + 120) it is missing, the part looks short and is read again every cycle until
    complete or `late_seconds` (600) old; past that it stays a gap (one missed scrape: within the bound)."""
    late = NOW - 30
    samples = scraped(end=NOW + 1200, busy={late: 80.0})
    arrives = {late: late + arrives_after} if arrives_after is not None else {}
    series = [Series(dcgm(), samples, arrives)]
    found = judge(series, cycles=[NOW + 120 + 60 * k for k in range(cycles)], window=900)
    assert (found.idle, reason in found.reason) == (idle, True), found.reason


def test_a_complete_part_is_final_at_once_and_a_short_one_until_late_seconds() -> None:
    run = Run()
    pods = {("team-a", "p"): "n1"}
    full = [Series(dcgm(), scraped(end=NOW + 1200))]
    run.cycle(full, now=NOW + 120, window=WINDOW, config=CONFIG, pods=pods)
    assert run.caches["gpu"].parts[int(NOW) // P - 1].final
    gappy = [Series(dcgm(), scraped(end=NOW + 1200, missing=(NOW - 30, NOW - 30)))]
    run = Run()
    run.cycle(gappy, now=NOW + 120, window=WINDOW, config=CONFIG, pods=pods)
    assert not run.caches["gpu"].parts[int(NOW) // P - 1].final
    run.cycle(gappy, now=NOW + 600, window=WINDOW, config=CONFIG, pods=pods)
    assert run.caches["gpu"].parts[int(NOW) // P - 1].final  # its end 600 s old: final, the gap stays a gap
    assert run.reads[-1] == [(int(NOW) // P - 1, int(NOW) // P)]  # read again with the part settled since


@pytest.mark.parametrize(
    ("cycles", "idle", "reason"),
    [
        pytest.param(1, False, "24 of the 36 parts of 300s the window needs are not read from the store yet",
                     id="restart-cold-cache-fails-closed"),
        pytest.param(2, False, "12 of the 36 parts", id="still-rebuilding"),
        pytest.param(3, False, "1 of the 37 parts", id="the-window-grew-by-a-part-meanwhile"),
        pytest.param(4, True, "1.0% < 10% over 10800s", id="rebuilt"),
    ],
)
def test_restart_with_an_empty_cache_rebuilds_newest_first(cycles: int, idle: bool, reason: str) -> None:
    """After a start or a leader change the 3 h window's 35 kept parts (and the one before) are read back, 12 a
    cycle (rebuild_parts_per_cycle); until then its pods are not idle."""
    series = [Series(dcgm(), scraped(start=NOW - 12000, end=NOW + 1200))]
    found = judge(series, window=10800, cycles=[NOW + 60 * k for k in range(cycles)])
    assert (found.idle, reason in found.reason) == (idle, True), found.reason


def test_a_busy_part_decides_before_the_rebuild_ends() -> None:
    series = [Series(dcgm(), scraped(start=NOW - 12000, end=NOW + 1200, busy={NOW - 105: 90.0}))]
    assert judge(series, window=10800).reason == "peak GPU utilisation 90.0% >= 10% over 10800s"


def test_a_failed_read_leaves_its_parts_unknown() -> None:
    run = Run()
    pods = {("team-a", "p"): "n1"}
    run.cycle([steady()], now=NOW, window=WINDOW, config=CONFIG, pods=pods, failing=True)
    found = utilisation.assess(pod(), readings=run.readings, window_seconds=WINDOW, threshold_percent=10,
                               config=CONFIG, now=NOW)
    assert (found.idle, "or their read failed this cycle" in found.reason) == (False, True)


def test_a_gpu_that_changes_pod_is_a_new_device_measured_from_its_own_start() -> None:
    """GPU 0 of n1 held by pod a until NOW - 400, then by pod b: b's window is not covered from its start; a's
    series ends (stale)."""
    series = [Series(dcgm(pod_name="a"), scraped(end=NOW - 400)),
              Series(dcgm(pod_name="b"), scraped(start=NOW - 390, busy={NOW - 390: 1.0}))]
    run = Run()
    pods = {("team-a", "a"): "n1", ("team-a", "b"): "n1"}
    run.cycle(series, now=NOW, window=WINDOW, config=CONFIG, pods=pods)
    verdicts = {name: utilisation.assess(pod(name=name), readings=run.readings, window_seconds=WINDOW,
                                         threshold_percent=10, config=CONFIG, now=NOW).reason for name in ("a", "b")}
    assert "stale" in verdicts["a"]
    assert "or from its start to the first" in verdicts["b"]


def _three_pods_of_600_gpus() -> utilisation_parts.Cache:
    """Parts 0-2, each of another pod's 600 GPUs: prune(2) keeps a third of the devices, renumbered."""
    cache = utilisation_parts.Cache()
    for j in range(3):
        rows = {"n": [{"metric": dcgm(str(i), pod_name=f"p{j}"), "values": [[(j + 1) * P, "20"]]} for i in range(600)]}
        cache.store(GRID, rows, first=j, last=j, now=1e9, live=utilisation_parts.Part({}),
                    labels=CONFIG.prometheus.labels)
    return cache


def test_prune_drops_old_parts_and_compacts_the_device_index() -> None:
    cache = _three_pods_of_600_gpus()
    assert len(cache.keys) == 1800
    cache.prune(2)
    assert sorted(cache.parts) == [2] and len(cache.keys) == 600
    assert set(cache.pods) == {("team-a", "p2")}
    assert cache.parts[2].get(cache.index[("team-a", "p2", "n1", "5", "GPU-n1-5", "")])[0] == 20.0


def test_memory_of_10000_gpus_over_3h_is_a_few_mb() -> None:
    """37 parts x 10,000 devices in four float64 columns: ~12 MB of columns (the 500 MB goal is the process)."""
    part = utilisation_parts.Part({i: (20.0, 20.0, 1.0, NOW) for i in range(10000)})
    assert 4 * part.n.itemsize * len(part.n) * 37 < 13_000_000


def test_evaluated_at_is_the_time_answer() -> None:
    assert utilisation.evaluated_at([{"metric": {}, "value": [NOW, str(NOW)]}]) == NOW
    assert utilisation.evaluated_at([]) is None
    assert utilisation.evaluated_at([{"metric": {}, "value": [NOW]}]) is None


def test_kinds_needed() -> None:
    def node(strategy: str | None) -> snapshot.Node:
        return dataclasses.replace(EMPTY_NODE, topology=dataclasses.replace(
            EMPTY_NODE.topology, mig_strategy=strategy))

    nodes = {"n1": node(None), "n2": node("single")}
    assert utilisation.kinds_needed([pod()], nodes) == {"gpu"}
    assert utilisation.kinds_needed([pod(node="n2")], nodes) == {"gpu", "mig"}
    assert utilisation.kinds_needed([pod(full=0, mig={"1g.10gb": 1})], nodes) == {"mig"}
    assert utilisation.kinds_needed([], nodes) == set()


@pytest.mark.parametrize("seed", range(6))
def test_a_kept_summary_extended_over_cycles_reads_as_one_folded_afresh(seed: int) -> None:
    """The window's final parts are folded once and extended as parts turn final (`Cache.summaries`): cycle after
    cycle the reading is the one a fresh cache folds at that time, on random gaps, busy samples and NaNs."""
    rng = __import__("random").Random(seed)
    samples = [(t, rng.choice([1.0, 1.0, 1.0, 2.0, 30.0, math.nan]) if rng.random() < 0.05 else 1.0)
               for t, _ in scraped(start=NOW - 12000, end=NOW + 1500) if rng.random() > 0.03]
    series = [Series(dcgm(), samples)]
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"rebuild_parts_per_cycle": 100}}})
    kept = Run()
    for minute in range(0, 20, 3):
        at = NOW + 60 * minute
        fresh = Run()
        warm = judge(series, window=3600, cycles=[at], config=config, threshold=25, run=kept)
        cold = judge(series, window=3600, cycles=[at], config=config, threshold=25, run=fresh)
        assert (warm, kept.readings) == (cold, fresh.readings)


@pytest.mark.parametrize(
    ("seed", "devices", "window"),
    [
        *(pytest.param(seed, 2, window, id=f"seed-{seed}-{window}s")
          for seed, window in enumerate([600, 3600, 10800] * 4)),
        pytest.param(0, 1200, 600, id="index-compacted-after-a-cycle-of-failed-reads"),
    ],
)
def test_cycles_whose_reads_failed_leave_no_trace(seed: int, devices: int, window: int) -> None:
    """Cold cycles whose range reads fail, all (the first one) or some, while the store's left end is not known
    yet; then normal cycles: once a window's parts are read, every reading is the one a cold cache reads at that
    time (on random gaps and busy samples; 1,200 devices: prune compacts the index after the failed cycle)."""
    rng = __import__("random").Random(seed)
    end, every = NOW + 2400, (15.0 if devices < 1000 else 60.0)
    start = NOW - 12000 if devices < 1000 else NOW - 2400
    samples = [(t, rng.choice([1.0, 2.0, 30.0]) if rng.random() < 0.01 else 1.0)
               for t, _ in scraped(every, start=start, end=end) if rng.random() > 0.01]
    series = [Series(dcgm(), samples), *(Series(dcgm(str(i % 8), pod_name=f"p{i // 8}", host=f"n{i // 8}"),
                                                scraped(every, start=start, end=end)) for i in range(1, devices))]
    pods = {("team-a", "p"): "n1", **{("team-a", f"p{k}"): f"n{k}" for k in range(1, devices // 8)}}
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"rebuild_parts_per_cycle": 4}}})
    everything = settings_loader.load(overrides={"descheduler": {"reclaim": {"rebuild_parts_per_cycle": 100}}})
    kept, failing, known = Run(left_closed=None), rng.random(), rng.randrange(1, 5)
    compared = 0
    for minute in range(25 if devices < 1000 else 8):
        at = NOW + 60 * minute
        kept.left_closed = True if minute >= known else None  # the probe failed until then
        kept.cycle(series, now=at, window=window, config=config, pods=pods, failing=minute == 0,
                   fails=(lambda: rng.random() < failing) if minute < 5 else None)
        missing = kept.caches["gpu"].fetch(GRID, window=window, now=at)
        if minute < 5 or missing:
            continue
        cold = Run()
        cold.cycle(series, now=at, window=window, config=everything, pods=pods)
        assert (minute, kept.readings) == (minute, cold.readings)
        compared += 1
    assert compared >= 2


def test_a_device_that_appears_after_the_summary_was_kept_reads_as_folded_afresh() -> None:
    """A pod's GPU first seen after its 3 h window's kept summary was made (a new pod): cycle after cycle every
    reading is the one a fresh cache folds at that time, for it and for the pod seen from the start (this reaches
    `_summary()`'s fold of the kept parts for devices seen since)."""
    window = 10800
    series = [Series(dcgm(), scraped(start=NOW - 12000, end=NOW + 1500)),
              Series(dcgm("1", pod_name="late"), scraped(start=NOW + 60, end=NOW + 1500, busy={NOW + 400: 3.0}))]
    pods = {("team-a", "p"): "n1", ("team-a", "late"): "n1"}
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"rebuild_parts_per_cycle": 100}}})
    kept = Run()
    for minute in range(0, 25, 2):
        at = NOW + 60 * minute + 7
        fresh = Run()
        kept.cycle(series, now=at, window=window, config=config, pods=pods)
        fresh.cycle(series, now=at, window=window, config=config, pods=pods)
        assert (minute, kept.readings) == (minute, fresh.readings)


# --- the late-sample rule, a part's stretches and host spellings as direct tables (mutation-run survivors) ----

E = NOW  # a part's end; the part is (E - 300, E]


def numbers(n: float, last: float) -> utilisation_fold.Numbers:
    return (n, n, 1.0, last)


@pytest.mark.parametrize(
    ("found", "before", "after", "left_closed", "expected"),
    [
        pytest.param(numbers(20, E - 5), E - 305, 15.0, True, False, id="complete-at-15s"),
        pytest.param(numbers(19, E - 5), E - 305, 15.0, True, True, id="one-sample-fewer-than-its-spacing"),
        pytest.param(numbers(19, E - 20), E - 305, 15.0, True, True, id="none-within-a-spacing-of-the-end"),
        pytest.param(numbers(19, E - 15), E - 301, 15.0, True, True, id="newest-exactly-a-spacing-before-the-end"),
        pytest.param(numbers(20, E - 16), E - 316, 20.0, True, True, id="its-own-spacing-when-the-next-is-slower"),
        pytest.param(numbers(0, math.nan), math.nan, math.nan, True, False, id="no-sample-yet-started-later"),
        pytest.param(numbers(0, E - 305), E - 305, 15.0, True, True, id="silent-part-of-a-reporting-gpu"),
        pytest.param(numbers(1, E - 5), math.nan, math.nan, True, True, id="one-sample-nothing-to-read-a-spacing"),
        pytest.param(numbers(1, E - 5), E - 20, math.nan, True, False, id="one-sample-its-own-spacing"),
        pytest.param(numbers(20, E), E - 300, 15.0, False, False, id="prometheus-3-sample-on-the-start-is-not-its"),
        pytest.param(numbers(21, E), E - 300, 15.0, True, False, id="prometheus-2-sample-on-the-start-counted-once"),
        pytest.param(numbers(20, E), E - 300, 15.0, True, True, id="prometheus-2-one-short-once-the-start-is-off"),
    ],
)
def test_short_of_samples(found: utilisation_fold.Numbers, before: float, after: float, left_closed: bool | None,
                          expected: bool) -> None:
    """A kept part is read again while a GPU that reports later looks short of samples in it (late samples)."""
    previous = (1.0, 1.0, 1.0, before)
    assert utilisation_parts.short(found, previous, end=E, part=P, after=after, left_closed=left_closed) is expected


@pytest.mark.parametrize(
    ("previous", "start", "n", "left_closed", "expected"),
    [
        pytest.param(E, E, 1, True, 1, id="one-sample-on-the-start-prometheus-2"),
        pytest.param(E, E, 0, True, 0, id="no-sample-counted"),
        pytest.param(E, E, 5, None, 1, id="not-known-yet-may-hold-it"),
        pytest.param(E, E, 5, False, 0, id="prometheus-3-never"),
        pytest.param(0.0, 0.001, 5, True, 1, id="a-millisecond-off-is-on-it"),
        pytest.param(E - 15, E, 5, True, 0, id="off-the-start"),
    ],
)
def test_on_start(previous: float, start: float, n: float, left_closed: bool | None, expected: int) -> None:
    assert utilisation_parts._on_start(previous, start, n, left_closed) == expected


J = int(E) // P - 1  # the part ending at E


@pytest.mark.parametrize(
    ("mine", "following", "kept", "live", "left_closed", "expected"),
    [
        pytest.param(E - 5, [20.0, None, 1.0, E + 295], None, None, True, 15.0, id="next-part-in-the-same-read"),
        pytest.param(E - 5, None, (20.0, 20.0, 1.0, E + 295), None, True, 15.0, id="next-part-kept"),
        pytest.param(E - 5, None, None, (8.0, 8.0, 1.0, E + 115), True, 15.0, id="the-live-stretch"),
        pytest.param(E, [21.0, None, 1.0, E + 300], None, None, True, 15.0, id="prometheus-2-its-start-once"),
        pytest.param(E, [20.0, None, 1.0, E + 300], None, None, False, 15.0, id="prometheus-3"),
        pytest.param(E - 5, [1.0, None, 1.0, E + 10], None, None, True, 15.0, id="one-sample"),
        pytest.param(E - 5, [0.0, None, math.nan, E - 5], None, (0.0, math.inf, math.nan, E - 5), True, math.nan,
                     id="no-sample-after"),
        pytest.param(E - 5, [20.0, None, 1.0, None], None, (8.0, 8.0, 1.0, E + 115), True, 15.0,
                     id="next-part-without-a-last-falls-back"),
    ],
)
def test_spacing_in_the_part_after(mine: float, following: list[float | None] | None,
                                   kept: utilisation_fold.Numbers | None, live: utilisation_fold.Numbers | None,
                                   left_closed: bool | None, expected: float) -> None:
    """`Cache._after`: a GPU's spacing in the part after the one ending at E (its last sample `mine`): from this
    read, else the kept part, else the live stretch."""
    cache = utilisation_parts.Cache()
    if kept is not None:
        cache.parts[J + 1] = utilisation_parts.Part({0: kept})
    rows = {J: {0: [20.0, None, 1.0, mine]}, **({J + 1: {0: following}} if following is not None else {})}
    after = cache._after(0, J, rows, utilisation_parts.Part({0: live} if live is not None else {}), part=P,
                         left_closed=left_closed)
    assert (math.isnan(after), 0.0 if math.isnan(after) else after) == (
        math.isnan(expected), 0.0 if math.isnan(expected) else expected)


@pytest.mark.parametrize(
    ("total", "counted", "expected"),
    [pytest.param(5.0, 1.0, 5.0, id="one-sample"), pytest.param(9.0, 3.0, 3.0, id="three-samples"),
     pytest.param(5.0, 0.0, math.nan, id="only-the-sample-on-the-start-counted-once-is-no-average")],
)
def test_average_reading(total: float, counted: float, expected: float) -> None:
    acc = utilisation_fold.Acc(NOW, True)
    acc.samples, acc.total, acc.counted = True, total, counted
    value = acc.reading(NOW, average=True).value
    assert value is not None and (math.isnan(value), 0.0 if math.isnan(value) else value) == (
        math.isnan(expected), 0.0 if math.isnan(expected) else expected)


@pytest.mark.parametrize(
    ("previous", "parts", "left_closed", "bound", "average", "expected"),
    [
        # (observed, worst, lost, counted) after the parts: (numbers, start, length)
        pytest.param(E, [((1.0, 1.0, 1.0, E + 15), E, 300.0)], True, 2.0, False, (math.inf, 150.0, 0, 0.0),
                     id="only-the-sample-on-the-start-prometheus-2-a-part-without-its-own"),
        pytest.param(E, [((1.0, 1.0, 1.0, E + 15), E, 300.0)], True, 1.0, False, (math.inf, math.inf, 0, 0.0),
                     id="no-room-for-a-stretch-at-bound-1"),
        pytest.param(0.0, [((3.0, 3.0, 1.0, 30.001), 0.001, 300.0)], True, 2.0, False, (15.0005, 10.000333333333334,
                     0, 0.0), id="a-millisecond-off-the-start-is-on-it"),
        pytest.param(E - 15, [((1.0, 1.0, 1.0, E + 15), E, 300.0)], True, 2.0, False, (30.0, 15.0, 0, 0.0),
                     id="one-own-sample"),
        pytest.param(E, [((2.0, 2.0, 1.0, math.nan), E + 1, 300.0), ((2.0, 2.0, 1.0, math.nan), E + 301, 300.0)],
                     True, 2.0, False, (math.inf, 0.0, 2, 0.0), id="two-parts-without-a-last-sample"),
        pytest.param(E, [((21.0, 21.0, 21.0, E + 300), E, 300.0)], True, 2.0, True, (15.0, 300 / 21, 0, 20.0),
                     id="average-counts-the-sample-on-the-start-once"),
    ],
)
def test_a_part_added_to_a_devices_stretches(previous: float, parts: list[tuple[utilisation_fold.Numbers, float,
                                                                                   float]],
                                             left_closed: bool | None, bound: float, average: bool,
                                             expected: tuple[float, float, int, float]) -> None:
    """`Acc.add`: a part's samples split its stretch from the last sample before it (counted once when it sits
    on the part's start and the store's ranges include their left end)."""
    acc = utilisation_fold.Acc(previous, True)
    for found, start, length in parts:
        acc.add(found, start, average=average, left_closed=left_closed, bound=bound, length=length)
    assert (acc.observed, acc.worst, acc.lost, acc.counted) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("host", "node", "short_name", "same"),
    [pytest.param("gpu-01.a.example", "gpu-01.b.example", False, False, id="issue-other-domain-is-another-host"),
     pytest.param("gpu-01.a.example", "gpu-01.b.example", True, True, id="short-name-folds-domains"),
     pytest.param("n1", "n1", False, True, id="same"),
     pytest.param("n1", "n1.cluster.local", False, False, id="short-and-fqdn-exact"),
     pytest.param("n1", "n1.cluster.local", True, True, id="short-and-fqdn-short-name"),
     pytest.param("n1.cluster.local", "n1", True, True, id="fqdn-and-short-short-name"),
     pytest.param("", "n1", False, True, id="no-host"),
     pytest.param("n2", "n1.cluster.local", True, False, id="another-node"),
     pytest.param("n10", "n1", True, False, id="a-prefix-is-not-the-name")],
)
def test_same_host(host: str, node: str, short_name: bool, same: bool) -> None:
    assert utilisation_parts.same_host(host, node, short_name=short_name) is same


@pytest.mark.parametrize(
    ("copies", "expected"),
    [
        pytest.param({0: ("n1", "0", "GPU-a", ""), 1: ("n1", "", "GPU-a", "")}, [("GPU-a", (0, 1), False)],
                     id="issue-uuid-only-copy-joins-the-indexed-one"),
        pytest.param({0: ("n1", "0", "GPU-a", ""), 1: ("n1", "0", "", "")}, [("GPU-a", (0, 1), False)],
                     id="index-only-copy-joins-the-one-uuid-there"),
        pytest.param({0: ("n1", "0", "GPU-a", ""), 1: ("n1", "0", "GPU-b", ""), 2: ("n1", "0", "", "")},
                     [("GPU 0 on n1", (2,), True), ("GPU-a", (0,), False), ("GPU-b", (1,), False)],
                     id="index-only-copy-between-two-uuids-stays-apart"),
        pytest.param({0: ("n1", "0", "GPU-a", ""), 1: ("n1", "1", "", "")},
                     [("GPU 1 on n1", (1,), True), ("GPU-a", (0,), False)], id="another-index-is-another-gpu"),
        pytest.param({0: ("n1", "0", "GPU-a", ""), 1: ("n1.x", "0", "", "")},
                     [("GPU 0 on n1.x", (1,), True), ("GPU-a", (0,), False)], id="another-host-spelling-needs-uuid"),
        pytest.param({0: ("n1", "0", "", ""), 1: ("", "0", "", "")},
                     [("GPU 0 on no host", (1,), True), ("GPU 0 on n1", (0,), True)], id="index-needs-the-same-host"),
        pytest.param({0: ("n1", "7", "GPU-a", "1"), 1: ("n1", "7", "GPU-a", "2")},
                     [("GPU-a MIG instance 1", (0,), False), ("GPU-a MIG instance 2", (1,), False)],
                     id="mig-instances-of-one-gpu-are-two-devices"),
        pytest.param({0: ("n1", "", "", ""), 1: ("n1", "", "", "")},
                     [("series 0 (no UUID, no GPU index)", (0,), True),
                      ("series 1 (no UUID, no GPU index)", (1,), True)],
                     id="no-identity-each-series-its-own-device"),
    ],
)
def test_gpus(copies: dict[int, tuple[str, str, str, str]], expected: list[tuple[str, tuple[int, ...], bool]]) -> None:
    assert [(g.name, g.copies, g.by_index) for g in utilisation_parts.gpus(copies)] == expected


def _fresh_devices(cache: utilisation_parts.Cache, pod: tuple[str, str], node: str,
                   short_name: bool) -> tuple[set[str], list[tuple[str, tuple[int, ...], bool]]]:
    """`Cache.devices` worked out from scratch (the path it keeps)."""
    identities = {i: cache.keys[i][2:] for i in cache.pods.get(pod, ())
                  if utilisation_parts.same_host(cache.keys[i][2], node, short_name=short_name)}
    return ({cache.keys[i][2] for i in cache.pods.get(pod, ())},
            [(g.name, g.copies, g.by_index) for g in utilisation_parts.gpus(identities)] if identities else [])


@pytest.mark.parametrize(
    ("steps", "node", "short_name"),
    [
        # adversarial: a second scrape path of the pod's GPU shows up after its devices were worked out
        pytest.param([[("n1", "0", "GPU-a")], [("n1", "", "GPU-a")]], "n1", False, id="copy-added-later-joins"),
        pytest.param([[("n1", "0", "GPU-a")], [("n1", "1", "")]], "n1", False, id="device-added-later-counts"),
        pytest.param([[("n1", "0", "GPU-a")], [("n1.b", "0", "GPU-b")]], "n1", False,
                     id="other-host-added-later-is-a-spelling-not-a-device"),
        pytest.param([[("n1", "0", "GPU-a")], [("n1.b", "0", "GPU-b")]], "n1", True, id="short-name-takes-it"),
        pytest.param([[], [("n1", "0", "GPU-a")]], "n1", False, id="first-series-after-none"),
        pytest.param([[("n1", "0", "GPU-a")], []], "n1", False, id="nothing-new-same-answer"),
    ],
)
def test_kept_devices_are_those_worked_out_from_scratch(steps: list[list[tuple[str, str, str]]], node: str,
                                                         short_name: bool) -> None:
    cache = utilisation_parts.Cache()
    pod = ("team-a", "p")
    cache._at(("team-a", "other", "n1", "0", "GPU-z", ""))  # another pod's series: never the pod's device
    for step in steps:
        for host, index, uuid in step:
            cache._at(("team-a", "p", host, index, uuid, ""))
        hosts, found = cache.devices(pod, node, short_name=short_name)
        assert (set(hosts), [(g.name, g.copies, g.by_index) for g in found]) == _fresh_devices(
            cache, pod, node, short_name)
    # the same pod judged on another node (a memo per node): its series from n1 are no devices there
    assert cache.devices(pod, "n2", short_name=short_name)[1] == ()


def test_kept_devices_follow_the_renumbering_of_prune() -> None:
    cache = _three_pods_of_600_gpus()
    before = cache.devices(("team-a", "p2"), "n1", short_name=False)[1]
    assert before[0].copies[0] >= 1200
    cache.prune(2)
    after = cache.devices(("team-a", "p2"), "n1", short_name=False)[1]
    assert [g.name for g in after] == [g.name for g in before]
    assert [(g.name, g.copies) for g in after] == [(g.name, g.copies) for g in utilisation_parts.gpus(
        {i: cache.keys[i][2:] for i in cache.pods[("team-a", "p2")]})]
    assert after[0].copies[0] < 600
