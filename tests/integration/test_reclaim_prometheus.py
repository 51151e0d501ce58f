"""Idle detection against a real Prometheus holding DCGM-shaped history (backfilled with promtool)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from common import prometheus, settings, settings_loader, snapshot, source
from descheduler import evictor, policy, reclaim_loop, utilisation
from tests import builders
from tests.support.prometheus import PrometheusServer, Series, free_port, start_prometheus

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
MIG = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
P = policy.PREFIX
HOUR = 3600


def every_minute(value: float, *, start: int = HOUR - 30, end: int = 30) -> list[tuple[float, float]]:
    """One sample a minute from `start` to `end` seconds ago (the default fills the hour: 60 samples)."""
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
    return snapshot.build(nodes=nodes, pods=cluster_pods(), priority_classes=CLASSES, names=config.names,
                          taken_at=now)


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
        pytest.param("gappy", False, "DCGM_FI_DEV_GPU_UTIL: coverage: first sample ~1830s after the window's start",
                     id="coverage-gap"),
        pytest.param("stale", False, "no sample within Prometheus' lookback (stale)", id="stale"),
        pytest.param("elsewhere", False, "DCGM series come from n9, not the pod's node n1", id="other-host"),
        pytest.param("half-reporting", False, "only 1 of 2 devices report", id="one-of-two-gpus-reports"),
        pytest.param("nan", False, "a device averages NaN", id="nan"),
        pytest.param("missing", False, "no DCGM series for the pod over 3600s", id="no-series"),
    ],
)
@pytest.mark.parametrize("below_percent", [None, 10.0], ids=["every-row", "busy-pods-util-only"])
async def test_assess_against_real_prometheus(
    server: PrometheusServer, config: settings.Settings, pod: str, idle: bool, reason: str,
    below_percent: float | None,
) -> None:
    """Same verdict and reason whether or not the query leaves out the rows a busy pod does not need."""
    client = prometheus.Client(settings.Prometheus(url=server.url))
    try:
        rows = await client.query(utilisation.query(
            HOUR, config=config.prometheus, reclaim=config.descheduler.reclaim, below_percent=below_percent),
            time=server.now)
    finally:
        client.close()
    cluster = build(config, server.now)
    result = utilisation.assess(cluster.pods[f"team-a/{pod}"], readings=utilisation.parse(rows),
                                window_seconds=HOUR, threshold_percent=10, config=config, now=server.now)
    assert result.idle == idle
    assert reason in result.reason


@pytest.mark.parametrize(
    ("statistic", "idle", "reason"),
    [
        pytest.param("peak", False, "peak GPU utilisation 60.0% >= 10% over 3600s", id="peak-sees-the-burst"),
        pytest.param("average", True, "average GPU utilisation 2.0% < 10% over 3600s", id="average-hides-it"),
    ],
)
async def test_window_statistic_on_a_bursty_pod(server: PrometheusServer, statistic: str, idle: bool,
                                                reason: str) -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"idle_statistic": statistic}}})
    client = prometheus.Client(settings.Prometheus(url=server.url))
    try:
        rows = await client.query(utilisation.query(HOUR, config=config.prometheus, reclaim=config.descheduler.reclaim),
                                  time=server.now)
    finally:
        client.close()
    result = utilisation.assess(build(config, server.now).pods["team-a/bursty"], readings=utilisation.parse(rows),
                                window_seconds=HOUR, threshold_percent=10, config=config, now=server.now)
    assert (result.idle, result.reason) == (idle, reason)


class Counting:
    """The real client, counting queries."""

    def __init__(self, client: prometheus.Client) -> None:
        self.client = client
        self.promql: list[str] = []

    async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]:
        self.promql.append(promql)
        return await self.client.query(promql, time=time)


def _loop(config: settings.Settings, querier: Any, now: float, pending: Sequence[dict[str, Any]] = ()
          ) -> reclaim_loop.ReclaimLoop:
    cluster = build(config, now)
    raw = [p.raw for p in cluster.pods.values()] + list(pending)
    nodes = [builders.gpu_node("n1", gpus=8), builders.gpu_node("n2", gpus=8)]
    fixed = snapshot.build(nodes=nodes, pods=raw, priority_classes=CLASSES, names=config.names, taken_at=now)
    return reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(fixed), prometheus=querier,
                                    evictions=evictor.DryRunClient(), api=None, clock=lambda: now)


async def test_cycle_queries_once_per_window_and_plans(server: PrometheusServer) -> None:
    limits = {"per_cycle": 100, "per_node": 100, "per_namespace": 100}
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always", "limits": limits}}})
    querier = Counting(prometheus.Client(settings.Prometheus(url=server.url)))
    try:
        cycle = await _loop(config, querier, server.now).cycle()
    finally:
        querier.client.close()
    assert cycle.queries == 2 and len(querier.promql) == 2  # 15 pods, two distinct windows
    assert cycle.prometheus_errors == ()
    evicted = {e["pod"] for e in cycle.plan.as_json()["evictions"]}
    assert evicted == {"team-a/idle", "team-a/renamed", "team-a/multi-idle", "team-a/mig-idle"}
    spared = {s.pod: s.reason for s in cycle.plan.spared}
    assert spared["team-a/half-hour"] == "not idle: no DCGM series for the pod over 1800s"
    assert spared["team-a/multi"] == "not idle: peak GPU utilisation 80.0% >= 10% over 3600s"
    assert spared["team-a/bursty"] == "not idle: peak GPU utilisation 60.0% >= 10% over 3600s"
    assert all(o.result is evictor.Result.WOULD_EVICT for o in cycle.outcomes)


async def test_prometheus_down_evicts_nothing_and_says_so() -> None:
    config = settings_loader.load(overrides={"descheduler": {"reclaim": {"mode": "always"}}})
    now = datetime.datetime.now(datetime.UTC).timestamp()
    down = prometheus.Client(settings.Prometheus(url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2))
    try:
        cycle = await _loop(config, down, now).cycle()
    finally:
        down.close()
    assert cycle.plan.evictions == ()
    assert len(cycle.prometheus_errors) == 2
    assert all("cannot reach" in e for e in cycle.prometheus_errors)
    assert {s.reason.split(":")[0] for s in cycle.plan.spared} == {"not idle"}
    assert "Prometheus query failed: cannot reach" in {s.pod: s.reason for s in cycle.plan.spared}["team-a/idle"]


# --- Coverage by time, at the scrape intervals dcgm-exporter is run with -------------------------------

TEN_MINUTES = 600


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
]


@pytest.fixture(scope="module")
def coverage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-coverage"), COVERAGE_HISTORY)
    try:
        yield started
    finally:
        started.stop()


def coverage_pod(name: str, *, node: str, gpus: int = 1) -> snapshot.Pod:
    raw = builders.pod(name, namespace="team-a", gpus=gpus, node=node, phase="Running")
    cluster = snapshot.build(nodes=[builders.gpu_node(node, gpus=8)], pods=[raw], priority_classes=[],
                             names=settings_loader.load().names, taken_at=0)
    return cluster.pods[f"team-a/{name}"]


@pytest.mark.parametrize(
    ("pod", "node", "gpus", "window", "idle", "reason"),
    [
        *(pytest.param(f"steady-{every}", "n3", 1, TEN_MINUTES, True, "peak GPU utilisation 1.0% < 10% over 600s",
                       id=f"covered-at-{every}s-scrape") for every in (10, 15, 30, 60)),
        pytest.param("late-15", "n3", 1, TEN_MINUTES, False, "coverage: first sample ~", id="issue-15s-last-150s"),
        pytest.param("late-60", "n3", 1, TEN_MINUTES, False, "coverage: first sample ~", id="60s-last-150s"),
        pytest.param("hole-15", "n3", 1, TEN_MINUTES, False, "coverage: ~", id="15s-scrape-4-minute-hole"),
        pytest.param("hole-30", "n3", 1, TEN_MINUTES, False, "without a sample within the 600s window",
                     id="30s-scrape-3-missed"),
        pytest.param("missed-one-60", "n3", 1, TEN_MINUTES, True, "1.0% < 10%", id="60s-scrape-one-missed-is-fine"),
        pytest.param("long-hole-60", "n3", 1, HOUR, False, "without a sample within the 3600s window",
                     id="hole-longer-than-prometheus-lookback"),
        pytest.param("sparse", "n3", 1, HOUR, False, "observed scrape interval (~60s), at most 2x",
                     id="sparse-samples-are-no-slow-scrape"),
        pytest.param("twice-one-gpu", "n4", 2, TEN_MINUTES, False, "only 1 of 2 devices report",
                     id="2-gpu-pod-one-gpu-scraped-twice-is-not-2-gpus"),
        pytest.param("twice-both-gpus", "n4", 2, TEN_MINUTES, True, "1.0% < 10%", id="every-gpu-scraped-twice"),
        pytest.param("twice-one-copy-late", "n4", 1, TEN_MINUTES, True, "1.0% < 10%",
                     id="one-full-copy-covers-the-device"),
        pytest.param("no-uuid", "n4", 1, TEN_MINUTES, True, "1.0% < 10%", id="no-uuid-label-index-is-the-device"),
        pytest.param("busy-late", "n4", 1, TEN_MINUTES, False, "70.0% >= 10%", id="busy-needs-no-coverage"),
    ],
)
@pytest.mark.parametrize("below_percent", [None, 10.0], ids=["every-row", "busy-pods-util-only"])
async def test_coverage_by_time_at_several_scrape_intervals(
    coverage_server: PrometheusServer, config: settings.Settings, pod: str, node: str, gpus: int, window: int,
    idle: bool, reason: str, below_percent: float | None,
) -> None:
    client = prometheus.Client(settings.Prometheus(url=coverage_server.url))
    try:
        promql = utilisation.query(window, config=config.prometheus, reclaim=config.descheduler.reclaim,
                                   below_percent=below_percent)
        rows = await client.query(promql, time=coverage_server.now)
    finally:
        client.close()
    result = utilisation.assess(coverage_pod(pod, node=node, gpus=gpus), readings=utilisation.parse(rows),
                                window_seconds=window, threshold_percent=10, config=config, now=coverage_server.now)
    assert (result.idle, reason in result.reason) == (idle, True), result.reason
