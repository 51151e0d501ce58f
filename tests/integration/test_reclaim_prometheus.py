"""Idle detection against a real Prometheus holding DCGM-shaped history (backfilled with promtool).

Servers whose rows depend on where a window starts are written against a `now` on the part grid (a multiple of
300 s): a window of whole parts then starts exactly where it asks (descheduler.reclaim.utilisation_parts)."""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import prometheus_client
import pytest
from aiohttp import web

from common import prometheus, settings, settings_loader, snapshot, snapshot_build, source
from descheduler import evictor, policy
from descheduler.reclaim import loop as reclaim_loop
from descheduler.reclaim import measurement, utilisation, utilisation_promql
from tests import builders
from tests.support.prometheus import PrometheusServer, Series, StartPrometheus, free_port, judge, start_prometheus

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
MIG = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
P = policy.PREFIX
HOUR = 3600


def every_minute(value: float, *, start: int = HOUR + 330, end: int = 30) -> list[tuple[float, float]]:
    """One sample a minute from `start` to `end` seconds ago (the default fills the hour and the part before
    it: a window starting inside a part takes the whole part)."""
    return [(float(ago), value) for ago in range(start, end - 1, -60)]


def dcgm(gpu: str, *, pod: str, host: str = "n1", host_label: str = "Hostname", **extra: str) -> dict[str, str]:
    return {"gpu": gpu, "UUID": f"GPU-{host}-{gpu}", "device": f"nvidia{gpu}", "modelName": "NVIDIA A100",
            host_label: host, "namespace": "team-a", "pod": pod, "container": "main", **extra}


HISTORY = [
    Series(UTIL, dcgm("0", pod="idle"), every_minute(2.0)),
    Series(UTIL, dcgm("1", pod="busy"), every_minute(55.0)),
    # Prometheus renamed the clashing labels: pod/namespace are dcgm-exporter's own, exported_* the workload's
    Series(UTIL, {**dcgm("2", pod="nvidia-dcgm-exporter-x", host_label="hostname"), "namespace": "gpu-operator",
                  "exported_pod": "renamed", "exported_namespace": "team-a"}, every_minute(3.0)),
    Series(UTIL, dcgm("3", pod="multi"), every_minute(1.0)),
    Series(UTIL, dcgm("4", pod="multi"), every_minute(80.0)),
    Series(UTIL, dcgm("5", pod="multi-idle"), every_minute(1.0)),
    Series(UTIL, dcgm("6", pod="multi-idle"), every_minute(4.0)),
    Series(MIG, dcgm("7", pod="mig-idle", GPU_I_PROFILE="1g.10gb", GPU_I_ID="1"), every_minute(0.02)),
    Series(MIG, dcgm("7", pod="mig-busy", GPU_I_PROFILE="1g.10gb", GPU_I_ID="2"), every_minute(0.5)),
    Series(UTIL, dcgm("0", pod="gappy", host="n2"), every_minute(1.0, start=1770)),
    Series(UTIL, dcgm("1", pod="stale", host="n2"), every_minute(1.0, end=900)),
    Series(UTIL, dcgm("2", pod="elsewhere", host="n9"), every_minute(1.0)),
    Series(UTIL, dcgm("3", pod="half-reporting", host="n2"), every_minute(1.0)),
    Series(UTIL, dcgm("4", pod="nan", host="n2"), every_minute(float("nan"))),
    # Idle but for one minute of serving at 60 %: the window's average (2 %) hides what its peak shows.
    Series(UTIL, dcgm("5", pod="bursty", host="n2"),
           [(ago, 60.0 if ago == 1830 else value) for ago, value in every_minute(1.0)]),
]


def cluster_pods() -> list[dict[str, Any]]:
    def running(name: str, *, node: str = "n1", gpus: int = 1, mig: dict[str, int] | None = None,
                cls: str = "hourly") -> dict[str, Any]:
        def mutate(body: dict[str, Any]) -> None:
            body["spec"].update(priorityClassName=cls, priority=1000)
            body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": name, "controller": True}]

        return builders.pod(name, namespace="team-a", gpus=gpus, mig=mig, node=node, phase="Running",
                            created="2020-01-01T00:00:00Z", mutate=mutate)

    return [
        running("idle"), running("busy"), running("renamed"), running("multi", gpus=2),
        running("multi-idle", gpus=2), running("mig-idle", gpus=0, mig={"1g.10gb": 1}),
        running("mig-busy", gpus=0, mig={"1g.10gb": 1}), running("gappy", node="n2"),
        running("stale", node="n2"), running("elsewhere"), running("half-reporting", node="n2", gpus=2),
        running("nan", node="n2"), running("missing"), running("half-hour", cls="half-hourly"),
        running("bursty", node="n2"),
    ]


CLASSES = [
    builders.priority_class("hourly", 1000, annotations={
        f"{P}resource-idle-seconds": str(HOUR), f"{P}resource-idle-usage-threshold": "10"}),
    builders.priority_class("half-hourly", 1000, annotations={
        f"{P}gpu-idle-seconds": "1800", f"{P}gpu-idle-usage-threshold": "10"}),
]


def build(config: settings.Settings, now: float) -> snapshot.Snapshot:
    nodes = [builders.gpu_node("n1", gpus=8), builders.gpu_node("n2", gpus=8)]
    return snapshot_build.build(nodes=nodes, pods=cluster_pods(), priority_classes=CLASSES, names=config.names,
                                taken_at=now)


def on_grid() -> float:
    """The newest multiple of 300 s: windows of whole parts start on the grid."""
    return 300.0 * math.floor(time.time() / 300)


async def judged(server: PrometheusServer, cluster: snapshot.Snapshot, pods: Sequence[str], *, window: int,
                 config: settings.Settings, threshold_percent: float = 10) -> dict[str, utilisation.Assessment]:
    """`pods` (names in team-a) judged over a window at the server's `now`, as a cycle judges them from a cold
    part cache."""
    found = await judge(server.url, cluster, [f"team-a/{name}" for name in pods], window=window,
                        threshold_percent=threshold_percent, config=config, now=server.now)
    return {key.removeprefix("team-a/"): assessment for key, assessment in found.items()}


@pytest.fixture(scope="module")
def config() -> settings.Settings:
    return settings_loader.load()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One real Prometheus with the whole history for this module (starting one takes ~1 s)."""
    started = start_prometheus(tmp_path_factory.mktemp("prometheus"), HISTORY)
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize(
    ("pod", "idle", "reason"),
    [
        pytest.param("idle", True, "GPU utilisation 2.0% < 10% over 3600s", id="idle"),
        pytest.param("busy", False, "GPU utilisation 55.0% >= 10% over 3600s", id="busy"),
        pytest.param("renamed", True, "GPU utilisation 3.0% < 10%", id="exported-labels-lowercase-hostname"),
        pytest.param("multi", False, "GPU utilisation 80.0% >= 10%", id="multi-gpu-one-busy"),
        pytest.param("multi-idle", True, "GPU utilisation 4.0% < 10%", id="multi-gpu-all-idle-max"),
        pytest.param("mig-idle", True, "GPU utilisation 2.0% < 10%", id="mig-ratio-times-100"),
        pytest.param("mig-busy", False, "GPU utilisation 50.0% >= 10%", id="mig-busy"),
        pytest.param("gappy", False, "DCGM_FI_DEV_GPU_UTIL: coverage: a stretch of the 3600s window without a "
                     "sample (or from its start to the first) is longer than 2x", id="coverage-gap"),
        pytest.param("stale", False, "no sample within Prometheus' lookback (stale)", id="stale"),
        pytest.param("elsewhere", False, "DCGM series come from n9, not the pod's node n1", id="other-host"),
        pytest.param("half-reporting", False, "only 1 of 2 devices report", id="one-of-two-gpus-reports"),
        pytest.param("nan", False, "a device reads NaN", id="nan"),
        pytest.param("missing", False, "no DCGM series for the pod over 3600s", id="no-series"),
    ],
)
async def test_assess_against_real_prometheus(
    server: PrometheusServer, config: settings.Settings, pod: str, idle: bool, reason: str,
) -> None:
    result = (await judged(server, build(config, server.now), [pod], window=HOUR, config=config))[pod]
    assert result.idle == idle
    assert reason in result.reason


@pytest.mark.parametrize(
    ("statistic", "idle", "reason"),
    [
        pytest.param("peak", False, "peak GPU utilisation 60.0% >= 10% over 3600s", id="peak-sees-the-burst"),
        # 60-65 samples (the window takes the part it starts in whole): 1.9-2.0 %
        pytest.param("average", True, "% < 10% over 3600s", id="average-hides-it"),
    ],
)
async def test_window_statistic_on_a_bursty_pod(server: PrometheusServer, statistic: str, idle: bool,
                                                reason: str) -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"idle_statistic": statistic}}})
    result = (await judged(server, build(config, server.now), ["bursty"], window=HOUR, config=config))["bursty"]
    assert (result.idle, reason in result.reason, result.reason.split()[0]) == (idle, True, statistic)


class Counting:
    """The real client, counting queries; with `clock`, the store's time is that clock (the history is written
    ahead of the wall clock: cycles a minute apart replay in seconds)."""

    def __init__(self, client: prometheus.Client, clock: Callable[[], float] | None = None) -> None:
        self.client = client
        self.clock = clock
        self.promql: list[str] = []
        self.ranges: list[tuple[float, float]] = []  # (start, end) of each range query

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        self.promql.append(promql)
        if promql == utilisation_promql.TIME_QUERY and self.clock is not None:
            return prometheus.Answer([{"metric": {}, "value": [self.clock(), repr(self.clock())]}])
        return await self.client.instant(promql, time=time)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        self.promql.append(promql)
        self.ranges.append((start, end))
        return await self.client.query_range(promql, start=start, end=end, step=step)


def _loop(config: settings.Settings, querier: Any, now: float, pending: Sequence[dict[str, Any]] = (),
          clock: Callable[[], float] = time.time) -> reclaim_loop.ReclaimLoop:
    cluster = build(config, now)
    raw = [p.raw for p in cluster.pods.values()] + list(pending)
    nodes = [builders.gpu_node("n1", gpus=8), builders.gpu_node("n2", gpus=8)]
    fixed = snapshot_build.build(nodes=nodes, pods=raw, priority_classes=CLASSES, names=config.names, taken_at=now)
    return reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(fixed), prometheus=querier,
                                    evictions=evictor.DryRunClient(), api=None, clock=clock)


async def test_cycle_reads_the_newest_minutes_and_the_parts_and_plans(server: PrometheusServer) -> None:
    limits = {"per_cycle": 100, "per_node": 100, "per_namespace": 100}
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {
        "mode": "always", "limits": limits, "rebuild_parts_per_cycle": 24}}})  # the hour's 13 parts in one cycle
    querier = Counting(prometheus.Client(settings.Prometheus(url=server.url)))
    try:
        cycle = await _loop(config, querier, server.now).cycle()
    finally:
        querier.client.close()
    # The store's time; per kind (MIG pods ask for MIG instances too) the live stretch's three statistics and,
    # the part cache being cold, its parts as range queries (at most 12 parts each); once, whether the store's
    # ranges include their left end. No query reads more than a part or the live stretch, whatever the window.
    # Then, right before the evictions, one re-check of each victim's newest samples.
    rechecks = [q for q in querier.promql if utilisation_promql.RECHECK in q]
    measured = [q for q in querier.promql if utilisation_promql.RECHECK not in q]
    assert cycle.queries == len(measured) == 1 + 6 + 1 + len(querier.ranges)
    assert len(rechecks) == len(cycle.plan.evictions) == 4
    assert querier.promql[0] == utilisation_promql.TIME_QUERY
    assert len([q for q in querier.promql if "[1ms]" in q]) == 1
    live = [q.split("[")[1].split("ms]")[0] for q in querier.promql if "ms]" in q and "[1ms]" not in q]
    assert len(live) == 4 and all(int(span) < 420_000 for span in live)  # count, peak: the newest 2-7 minutes
    assert all("[300s]" in q or "timestamp(" in q for q in querier.promql[1:] if "ms]" not in q)
    assert all(end - start <= 23 * 300 for start, end in querier.ranges)  # rebuild_parts_per_cycle
    assert cycle.prometheus_errors == ()
    evicted = {e["pod"] for e in cycle.plan.as_json()["evictions"]}
    assert evicted == {"team-a/idle", "team-a/renamed", "team-a/multi-idle", "team-a/mig-idle"}
    spared = {s.pod: s.reason for s in cycle.plan.spared}
    assert spared["team-a/half-hour"] == "not idle: no DCGM series for the pod over 1800s"
    assert spared["team-a/multi"] == "not idle: peak GPU utilisation 80.0% >= 10% over 3600s"
    assert spared["team-a/bursty"] == "not idle: peak GPU utilisation 60.0% >= 10% over 3600s"
    assert all(o.result is evictor.Result.WOULD_EVICT for o in cycle.outcomes)


AHEAD = 1200  # seconds of history written past the first cycle's store time


@pytest.fixture(scope="module")
def ahead_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, float]]:
    """Every 15 s from 4,000 s before the first cycle's store time (on the grid) to AHEAD after it: an idle pod,
    a busy one, and one busy for a single scrape 5 minutes into the cycles (then idle again)."""
    first = on_grid()
    burst = first + 300  # the busy scrape: one settled part later
    history = [
        Series(UTIL, dcgm("0", pod="idle"), scraped(15, start=4000 + AHEAD, end=0)),
        Series(UTIL, dcgm("1", pod="busy"), scraped(15, start=4000 + AHEAD, end=0, value=55.0)),
        Series(UTIL, dcgm("2", pod="bursty"),
               [(ago, 90.0 if abs(first + AHEAD - ago - burst) < 1 else value)
                for ago, value in scraped(15, start=4000 + AHEAD, end=0)]),
    ]
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-ahead"), history, now=first + AHEAD)
    try:
        yield started, first
    finally:
        started.stop()


def _verdicts(cycle: reclaim_loop.Cycle) -> dict[str, str]:
    out = {e["pod"]: "evict" for e in cycle.plan.as_json()["evictions"]}
    return {**out, **{s.pod: s.reason for s in cycle.plan.spared}}


def _ahead_loop(config: settings.Settings, querier: Any, kept: measurement.Parts, *, first: float,
                now: Callable[[], float]) -> reclaim_loop.ReclaimLoop:
    """A loop a cycle over ahead_server's pods, in the hourly tier (dry-run cooldowns would hide the verdicts),
    keeping `kept` across them."""
    def hourly(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="hourly", priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": body["metadata"]["name"], "controller": True}]

    pods = [builders.pod(name, namespace="team-a", gpus=1, node="n1", phase="Running", created="2020-01-01T00:00:00Z",
                         mutate=hourly) for name in ("idle", "busy", "bursty")]
    fixed = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=pods, priority_classes=CLASSES,
                                 names=config.names, taken_at=first)
    loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(fixed), prometheus=querier,
                                    evictions=evictor.DryRunClient(), api=None, clock=now)
    loop.parts = kept
    return loop


async def test_cycles_over_advancing_store_time_read_each_part_once_and_a_restart_reads_them_back(
    ahead_server: tuple[PrometheusServer, float],
) -> None:
    """Cycles a minute apart over backfilled history: the first reads the hour's parts back (6 a cycle: the
    pods stay not idle until all are read), later ones only the live stretch and, as each part settles, that
    part once; a busy scrape that settles into a kept part keeps its pod busy for the whole window after it.
    A new loop (a restart, a new leader) starts empty and reads them back again."""
    server, first = ahead_server
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {
        "mode": "always", "rebuild_parts_per_cycle": 6,
        "limits": {"per_cycle": 100, "per_node": 100, "per_namespace": 100}}}})
    now = [first]
    querier = Counting(prometheus.Client(settings.Prometheus(url=server.url)), clock=lambda: now[0])

    def new_loop(kept: measurement.Parts) -> reclaim_loop.ReclaimLoop:
        return _ahead_loop(config, querier, kept, first=first, now=lambda: now[0])

    kept = measurement.Parts()
    verdicts, reads = [], []
    try:
        for minute in range(10):
            now[0] = first + 60 * minute
            cycle = await new_loop(kept).cycle()
            assert cycle.prometheus_errors == ()
            verdicts.append(_verdicts(cycle))
            reads.append(sum(kept.read))
        cold = _verdicts(await new_loop(measurement.Parts()).cycle())
    finally:
        querier.client.close()
    # 12 parts for the hour (11 and the one before it): 6 + 6 read back; then each part once, 120 s after its end
    assert reads == [6, 6, 1, 0, 0, 0, 0, 1, 0, 0]
    assert "parts of 300s the window needs are not read from the store yet" in verdicts[0]["team-a/idle"]
    assert verdicts[3]["team-a/idle"] == "evict"
    assert verdicts[3]["team-a/busy"] == "not idle: peak GPU utilisation 55.0% >= 10% over 3600s"
    assert verdicts[3]["team-a/bursty"] == "evict"  # the burst is still to come
    assert verdicts[6]["team-a/bursty"] == "not idle: peak GPU utilisation 90.0% >= 10% over 3600s"
    assert verdicts[9]["team-a/bursty"] == verdicts[6]["team-a/bursty"]  # kept, read once
    assert "not read from the store yet" in cold["team-a/idle"]
    assert cold["team-a/busy"] == "not idle: peak GPU utilisation 55.0% >= 10% over 3600s"  # busy needs no parts


async def test_prometheus_down_evicts_nothing_and_says_so() -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always"}}})
    now = datetime.datetime.now(datetime.UTC).timestamp()
    down = prometheus.Client(settings.Prometheus(url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2))
    try:
        cycle = await _loop(config, down, now).cycle()
    finally:
        down.close()
    assert cycle.plan.evictions == ()
    assert len(cycle.prometheus_errors) == 1  # the store's time: nothing else is asked
    assert all("cannot reach" in e for e in cycle.prometheus_errors)
    assert {s.reason.split(":")[0] for s in cycle.plan.spared} == {"not idle"}
    assert {s.pod: s.reason for s in cycle.plan.spared}["team-a/idle"] == (
        "not idle: Prometheus query for the store's time failed (logged once per cycle)")


# --- Coverage by time, at the scrape intervals dcgm-exporter is run with -------------------------------

TEN_MINUTES = 600
MIG_SINGLE = "n6"  # the coverage node labelled with the `single` MIG strategy


def scraped(every: float, *, start: float = 900, end: float = 5, value: float = 1.0,
            missing: tuple[float, float] | None = None) -> list[tuple[float, float]]:
    """A sample every `every` seconds from `start` to `end` seconds ago, none in `missing` (from, to ago)."""
    samples = []
    ago = end
    while ago <= start:
        if missing is None or not missing[1] <= ago <= missing[0]:
            samples.append((ago, value))
        ago += every
    return samples


def copy(job: str) -> dict[str, str]:
    """Labels of a second scrape of the same exporter (another job): another series, the same device."""
    return {"job": job, "instance": f"{job}:9400"}


COVERAGE_HISTORY = [
    *(Series(UTIL, dcgm("0", pod=f"steady-{every}", host="n3"), scraped(every)) for every in (10, 15, 30, 60)),
    # The case: scraped every 15 s but measured only for the last 150 s of the window.
    Series(UTIL, dcgm("1", pod="late-15", host="n3"), scraped(15, start=150)),
    Series(UTIL, dcgm("2", pod="late-60", host="n3"), scraped(60, start=150)),
    Series(UTIL, dcgm("3", pod="hole-15", host="n3"), scraped(15, missing=(400, 160))),
    Series(UTIL, dcgm("4", pod="hole-30", host="n3"), scraped(30, missing=(300, 200))),
    Series(UTIL, dcgm("5", pod="missed-one-60", host="n3"), scraped(60, missing=(250, 200))),
    Series(UTIL, dcgm("6", pod="long-hole-60", host="n3"), scraped(60, start=4000, missing=(2400, 1200))),
    # Six samples spread over the hour: not a 10-minute scrape to trust, a series with 10-minute holes.
    Series(UTIL, dcgm("7", pod="sparse", host="n3"), scraped(600, start=3590)),
    # dcgm-exporter scraped by two jobs: every device has two series.
    Series(UTIL, {**dcgm("0", pod="twice-one-gpu", host="n4"), **copy("a")}, scraped(15)),
    Series(UTIL, {**dcgm("0", pod="twice-one-gpu", host="n4"), **copy("b")}, scraped(15)),
    *(Series(UTIL, {**dcgm(gpu, pod="twice-both-gpus", host="n4"), **copy(job)}, scraped(15))
      for gpu in ("1", "2") for job in ("a", "b")),
    Series(UTIL, {**dcgm("3", pod="twice-one-copy-late", host="n4"), **copy("a")}, scraped(15)),
    Series(UTIL, {**dcgm("3", pod="twice-one-copy-late", host="n4"), **copy("b")}, scraped(15, start=100)),
    # No UUID label (older exporters): the GPU index on the host is the device.
    Series(UTIL, {**{k: v for k, v in dcgm("4", pod="no-uuid", host="n4").items() if k != "UUID"}, **copy("a")},
           scraped(30)),
    Series(UTIL, {**{k: v for k, v in dcgm("4", pod="no-uuid", host="n4").items() if k != "UUID"}, **copy("b")},
           scraped(30)),
    Series(UTIL, dcgm("5", pod="busy-late", host="n4"), scraped(15, start=150, value=70.0)),
    # The case: one GPU of a 2-GPU pod reported by two jobs, one of which drops UUID; the other GPU
    # reports nothing. Joined on UUID the two copies were two devices.
    Series(UTIL, {**dcgm("6", pod="twice-no-uuid", host="n4"), **copy("a")}, scraped(15)),
    Series(UTIL, {**{k: v for k, v in dcgm("6", pod="twice-no-uuid", host="n4").items() if k != "UUID"},
                  **copy("b")}, scraped(15)),
    # Late starts inside the window's oldest part (600 s window: two parts of 300 s), either side of 2x 15 s.
    Series(UTIL, dcgm("0", pod="late-25s", host="n5"), scraped(15, start=575)),
    Series(UTIL, dcgm("1", pod="late-40s", host="n5"), scraped(15, start=560)),
    Series(UTIL, dcgm("2", pod="late-200s", host="n5"), scraped(15, start=400)),
    # One hole in the middle, either side of the bound: 30 s (one missed scrape) and 45 s without a sample.
    Series(UTIL, dcgm("3", pod="hole-30s-at-15", host="n5"), scraped(15, missing=(200, 186))),
    Series(UTIL, dcgm("4", pod="hole-45s-at-15", host="n5"), scraped(15, missing=(215, 186))),
    # The scrape interval went from 30 s to 15 s halfway through the window.
    Series(UTIL, dcgm("5", pod="interval-change", host="n5"), scraped(30, end=305) + scraped(15, start=290)),
    # MIG `single` strategy (node n6 says so): the pod requests nvidia.com/gpu, its series carry GPU_I_PROFILE.
    Series(MIG, dcgm("6", pod="mig-single", host=MIG_SINGLE, GPU_I_PROFILE="1g.10gb", GPU_I_ID="3"),
           scraped(15, value=0.02)),
]


@pytest.fixture(scope="module")
def coverage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-coverage"), COVERAGE_HISTORY, now=on_grid())
    try:
        yield started
    finally:
        started.stop()


def coverage_cluster(pods: Mapping[str, str], *, gpus: int = 1) -> snapshot.Snapshot:
    """Running pods in team-a (name -> node), each holding `gpus`, on 8-GPU nodes (MIG_SINGLE with the `single`
    MIG strategy)."""
    raws = [builders.pod(name, namespace="team-a", gpus=gpus, node=node, phase="Running")
            for name, node in pods.items()]
    nodes = [builders.gpu_node(node, gpus=8, labels={"nvidia.com/mig.strategy": "single"} if node == MIG_SINGLE else {})
             for node in sorted(set(pods.values()))]
    return snapshot_build.build(nodes=nodes, pods=raws, priority_classes=[], names=settings_loader.load().names,
                                taken_at=0)


@pytest.mark.parametrize(
    ("pod", "node", "gpus", "window", "idle", "reason"),
    [
        *(pytest.param(f"steady-{every}", "n3", 1, TEN_MINUTES, True, "peak GPU utilisation 1.0% < 10% over 600s",
                       id=f"covered-at-{every}s-scrape") for every in (10, 15, 30, 60)),
        pytest.param("late-15", "n3", 1, TEN_MINUTES, False, "(or from its start to the first) is longer than 2x",
                     id="issue-15s-last-150s"),
        pytest.param("late-60", "n3", 1, TEN_MINUTES, False, "(or from its start to the first) is longer than 2x",
                     id="60s-last-150s"),
        pytest.param("hole-15", "n3", 1, TEN_MINUTES, False, "longer than 2x the observed scrape interval (~15s)",
                     id="15s-scrape-4-minute-hole"),
        pytest.param("hole-30", "n3", 1, TEN_MINUTES, False, "longer than 2x the observed scrape interval (~30s)",
                     id="30s-scrape-3-missed"),
        pytest.param("missed-one-60", "n3", 1, TEN_MINUTES, True, "1.0% < 10%", id="60s-scrape-one-missed-is-fine"),
        pytest.param("long-hole-60", "n3", 1, HOUR, False, "longer than 2x the observed scrape interval (~60s)",
                     id="hole-longer-than-prometheus-lookback"),
        pytest.param("sparse", "n3", 1, HOUR, False, "DCGM_FI_DEV_GPU_UTIL: coverage: ",
                     id="sparse-samples-are-no-slow-scrape"),
        pytest.param("twice-one-gpu", "n4", 2, TEN_MINUTES, False, "only 1 of 2 devices report",
                     id="2-gpu-pod-one-gpu-scraped-twice-is-not-2-gpus"),
        pytest.param("twice-both-gpus", "n4", 2, TEN_MINUTES, True, "1.0% < 10%", id="every-gpu-scraped-twice"),
        pytest.param("twice-one-copy-late", "n4", 1, TEN_MINUTES, True, "1.0% < 10%",
                     id="one-full-copy-covers-the-device"),
        pytest.param("no-uuid", "n4", 1, TEN_MINUTES, True, "1.0% < 10%", id="no-uuid-label-index-is-the-device"),
        pytest.param("busy-late", "n4", 1, TEN_MINUTES, False, "70.0% >= 10%", id="busy-needs-no-coverage"),
        pytest.param("twice-no-uuid", "n4", 2, TEN_MINUTES, False, "only 1 of 2 devices report",
                     id="gpu-of-2-gpu-pod-scraped-twice-one-copy-without-uuid-is-one-device"),
        pytest.param("late-25s", "n5", 1, TEN_MINUTES, True, "1.0% < 10%", id="first-sample-25s-after-start"),
        pytest.param("late-40s", "n5", 1, TEN_MINUTES, False, "longer than 2x the observed scrape interval (~15s)",
                     id="first-sample-40s-after-start"),
        pytest.param("late-200s", "n5", 1, TEN_MINUTES, False, "longer than 2x the observed scrape interval (~15s)",
                     id="first-sample-200s-after-start-inside-the-oldest-part"),
        pytest.param("hole-30s-at-15", "n5", 1, TEN_MINUTES, True, "1.0% < 10%", id="hole-of-2-intervals-boundary"),
        pytest.param("hole-45s-at-15", "n5", 1, TEN_MINUTES, False, "longer than 2x the observed scrape interval",
                     id="hole-of-3-intervals"),
        pytest.param("interval-change", "n5", 1, TEN_MINUTES, False, "observed scrape interval (~15s)",
                     id="interval-change-judged-at-the-faster-interval"),
        pytest.param("mig-single", MIG_SINGLE, 1, TEN_MINUTES, True, "2.0% < 10%", id="mig-single-strategy"),
    ],
)
async def test_coverage_by_time_at_several_scrape_intervals(
    coverage_server: PrometheusServer, config: settings.Settings, pod: str, node: str, gpus: int, window: int,
    idle: bool, reason: str,
) -> None:
    result = (await judged(coverage_server, coverage_cluster({pod: node}, gpus=gpus), [pod], window=window,
                           config=config))[pod]
    assert (result.idle, reason in result.reason) == (idle, True), result.reason


# --- Time from the data, partial answers, one line per failure ------------------------------------------


def _spared(cycle: reclaim_loop.Cycle) -> dict[str, str]:
    return {s.pod: s.reason for s in cycle.plan.spared}


@pytest.mark.parametrize(
    ("skew", "evicted"),
    [
        pytest.param(-150.0, False, id="descheduler-150s-behind-the-store"),
        pytest.param(150.0, False, id="descheduler-150s-ahead-of-the-store"),
        pytest.param(-12.0, False, id="just-past-the-10s-bound"),
        pytest.param(-5.0, True, id="within-the-bound"),
    ],
)
async def test_clock_skew_between_descheduler_and_store_fails_closed(
    server: PrometheusServer, skew: float, evicted: bool,
) -> None:
    """The store's time decides the windows; a descheduler clock far from it fails closed and is exported."""
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always",
                                                                         "rebuild_parts_per_cycle": 24}}})
    registry = prometheus_client.CollectorRegistry()
    client = prometheus.Client(settings.Prometheus(url=server.url))
    try:
        cluster = build(config, time.time())
        loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(cluster), prometheus=client,
                                        evictions=evictor.DryRunClient(), api=None, registry=registry,
                                        clock=lambda: time.time() + skew)
        cycle = await loop.cycle()
    finally:
        client.close()
    assert ("team-a/idle" in {e["pod"] for e in cycle.plan.as_json()["evictions"]}) == evicted
    measured = registry.get_sample_value("gpu_steward_reclaim_clock_skew_seconds")
    assert measured is not None and abs(measured + skew) < 2
    if not evicted:
        assert "from ours (more than max_clock_skew_seconds 10)" in _spared(cycle)["team-a/idle"]
        assert len(cycle.prometheus_errors) == 1  # once, not once per pod


@pytest.fixture
async def proxy_adding_warnings(server: PrometheusServer) -> AsyncIterator[str]:
    """The real Prometheus behind a proxy that adds `warnings`, as Thanos does to a partial response."""
    async def forward(request: web.Request) -> web.Response:
        form = await request.post()
        async with aiohttp.ClientSession() as session, session.post(f"{server.url}/api/v1/query",
                                                                    data=dict(form)) as upstream:
            body = await upstream.json()
        return web.json_response({**body, "warnings": ["partial response: store 10.0.0.7:10901 unavailable"]})

    app = web.Application()
    app.router.add_post("/api/v1/query", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_an_answer_with_warnings_fails_closed(proxy_adding_warnings: str) -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always"}}})
    client = prometheus.Client(settings.Prometheus(url=proxy_adding_warnings))
    try:
        cycle = await _loop(config, client, time.time()).cycle()
    finally:
        client.close()
    assert cycle.plan.evictions == ()
    assert _spared(cycle)["team-a/idle"] == ("not idle: Prometheus answered with warnings (partial data): partial "
                                             "response: store 10.0.0.7:10901 unavailable (fail closed)")


async def test_a_failed_query_is_one_log_line_not_one_per_pod(caplog: pytest.LogCaptureFixture) -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always"}}})
    down = prometheus.Client(settings.Prometheus(url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2))
    caplog.set_level(logging.DEBUG)
    try:
        cycle = await _loop(config, down, time.time()).cycle()
    finally:
        down.close()
    failures = [r for r in caplog.records if "Prometheus failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING
    assert "cannot reach" in failures[0].getMessage() and "label_replace" not in failures[0].getMessage()
    # Every other line is short: no query text anywhere (it was 3 KB per spared pod).
    assert all("label_replace" not in r.getMessage() and len(r.getMessage()) < 1000 for r in caplog.records)
    assert len(_spared(cycle)) == 15


UNIT_HISTORY = [
    # DCGM_FI_PROF_GR_ENGINE_ACTIVE on a whole GPU (no MIG): 0.9 is 90 % busy.
    Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm("0", pod="ratio-busy"), scraped(15, value=0.9)),
    Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm("1", pod="ratio-idle"), scraped(15, value=0.02)),
    # A recording rule exporting percent under a name the auto unit reads as a ratio.
    Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dcgm("2", pod="percent-under-a-ratio-name"), scraped(15, value=35.0)),
]


@pytest.mark.parametrize(
    ("unit", "pod", "idle", "reason"),
    [
        pytest.param("auto", "ratio-busy", False, "peak GPU utilisation 90.0% >= 10%", id="auto-reads-prof-as-ratio"),
        pytest.param("auto", "ratio-idle", True, "peak GPU utilisation 2.0% < 10%", id="auto-ratio-idle"),
        pytest.param("percent", "ratio-busy", True, "0.9% < 10%", id="percent-misreads-a-ratio-as-the-issue-did"),
        pytest.param("auto", "percent-under-a-ratio-name", False, "DCGM_FI_PROF_GR_ENGINE_ACTIVE reads 3500.0% "
                     "(> 100 %): its unit is not what prometheus.gpu_util_unit (auto) says; set it to percent",
                     id="percent-data-read-as-ratio-is-a-clear-error"),
        pytest.param("ratio", "percent-under-a-ratio-name", False, "reads 3500.0% (> 100 %)", id="ratio-set-by-hand"),
    ],
)
async def test_ratio_metric_units(prometheus_factory: StartPrometheus, config: settings.Settings, unit: str, pod: str,
                                  idle: bool, reason: str) -> None:
    server = prometheus_factory(UNIT_HISTORY)
    prom = settings.Prometheus(url=server.url, gpu_util_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu_util_unit=unit)
    merged = config.model_copy(update={"prometheus": prom})
    result = (await judged(server, coverage_cluster({pod: "n1"}), [pod], window=TEN_MINUTES, config=merged))[pod]
    assert (result.idle, reason in result.reason) == (idle, True), result.reason


THREE_HOURS = 10800
PHASES = range(1, 16)  # seconds between the newest sample and the evaluation, at a 15 s scrape


@pytest.fixture(scope="module")
def long_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """The normal tier's 3 h window, fully covered at a 15 s scrape, once per phase against the evaluation."""
    history = [Series(UTIL, dcgm("0", pod=f"phase-{phase}", host=f"p{phase}"), scraped(15, start=11000, end=phase))
               for phase in PHASES]
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-long"), history, now=on_grid())
    try:
        yield started
    finally:
        started.stop()


async def test_a_fully_covered_3h_window_is_covered_in_every_phase(long_server: PrometheusServer,
                                                                   config: settings.Settings) -> None:
    """The issue: at the 3 h window the subquery step was 90 s, and a fully covered 15 s series was judged not
    covered in 9 of 15 phases. Measured exactly, it is covered in all of them."""
    pods = {f"phase-{phase}": f"p{phase}" for phase in PHASES}
    found = await judged(long_server, coverage_cluster(pods), list(pods), window=THREE_HOURS, config=config,
                         threshold_percent=5)
    verdicts = {phase: found[f"phase-{phase}"].reason for phase in PHASES}
    assert verdicts == {phase: "peak GPU utilisation 1.0% < 5% over 10800s" for phase in PHASES}


class TimingOut(Counting):
    """The real client, but while `failing` every range query and the left-end probe time out."""

    failing = False

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        if self.failing and "[1ms]" in promql:
            raise prometheus.PrometheusError("query timed out after 5.0s (injected)")
        return await super().instant(promql, time=time)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        if self.failing:
            raise prometheus.PrometheusError("query timed out after 5.0s (injected)")
        return await super().query_range(promql, start=start, end=end, step=step)


async def test_a_first_cycle_whose_reads_all_time_out_leaves_no_trace(
    ahead_server: tuple[PrometheusServer, float],
) -> None:
    """The first cycle's range queries and the probe of the store's left end all time out (a loaded store at a
    cold start; samples on the part grid, where the left end matters); the next cycles read the parts back, and
    from then on every verdict is a cold cache's at the same store time."""
    server, first = ahead_server
    limits = {"per_cycle": 100, "per_node": 100, "per_namespace": 100}
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {
        "mode": "always", "rebuild_parts_per_cycle": 6, "limits": limits}}})
    everything = settings_loader.load(overrides={"descheduler": {"reclaim": {
        "mode": "always", "rebuild_parts_per_cycle": 100, "limits": limits}}})
    now = [first]
    querier = TimingOut(prometheus.Client(settings.Prometheus(url=server.url)), clock=lambda: now[0])

    def new_loop(kept: measurement.Parts, settings_: settings.Settings) -> reclaim_loop.ReclaimLoop:
        return _ahead_loop(settings_, querier, kept, first=first, now=lambda: now[0])

    kept = measurement.Parts()
    warm, cold = [], []
    try:
        for minute in range(10):
            now[0] = first + 60 * minute
            querier.failing = minute == 0
            cycle = await new_loop(kept, config).cycle()
            assert (minute, bool(cycle.prometheus_errors)) == (minute, minute == 0)
            warm.append(_verdicts(cycle))
            cold.append(_verdicts(await new_loop(measurement.Parts(), everything).cycle()))
    finally:
        querier.client.close()
    assert "not read from the store yet" in warm[0]["team-a/idle"]
    assert warm[3:] == cold[3:]  # the hour's 12 parts read back 6 a cycle after the failed one
    assert [v["team-a/idle"] for v in warm[3:]] == ["evict"] * 7
    assert kept.left_closed is True  # Prometheus 2.x, asked again after the failed probe


async def test_one_recheck_query_reads_exactly_the_victims_named(prometheus_factory: StartPrometheus) -> None:
    """The re-check of a demand's victims is one query naming them in one regex: Prometheus anchors it, and a name's
    `.` is escaped, so neither a longer name (`b-1`, `ab`) nor a name the dot would match (`web-0Xx`) is read."""
    names = ("web-0.x", "web-0Xx", "b", "b-1", "ab")
    server = prometheus_factory([Series(UTIL, dcgm(str(i), pod=name), every_minute(1.0, start=600))
                                 for i, name in enumerate(names)])
    config = settings.Prometheus(url=server.url)
    client = prometheus.Client(config)
    try:
        answer = await client.instant(utilisation_promql.newest(["web-0.x", "b"], config=config, kinds=("gpu",)))
    finally:
        client.close()
    read = sorted((row["metric"].get("pod", ""), row["metric"][utilisation_promql.RECHECK]) for row in answer.series)
    assert read == [("", "now"), ("b", "gpu_last"), ("b", "gpu_value"), ("web-0.x", "gpu_last"),
                    ("web-0.x", "gpu_value")]
