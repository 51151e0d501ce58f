"""Reclaim against a real Prometheus that is not the lab's one-cluster, one-exporter store (issue 29 items 1, 2, 9).

One store holds two clusters' DCGM series told apart by the external label `cluster` (as Thanos, Mimir or a federated
Prometheus hold them), with the same node and pod names in both; one GPU reaches it through a second scrape path
without the `gpu` label; a recording rule's output and a short retention stand in for the metric settings that would
otherwise keep every pod not idle forever. Each row marked `issue` failed on main before this change.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings, settings_loader, snapshot_build
from descheduler.reclaim import utilisation
from gpu_steward import cli
from tests import builders
from tests.support.prometheus import PrometheusServer, Series, judge, start_prometheus

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
HOUR = 3600
NODE = "gpu-01"
OURS = 'cluster="a"'


def scraped(every: float = 15, *, start: float = HOUR + 330, end: float = 5,
            value: float = 1.0) -> list[tuple[float, float]]:
    """A sample every `every` seconds from `start` to `end` seconds ago."""
    return [(float(ago), value) for ago in range(int(end), int(start) + 1, int(every))]


def dcgm(cluster: str, gpu: str | None, *, pod: str, uuid: str | None = "", **extra: str) -> dict[str, str]:
    """dcgm-exporter's labels on one cluster's series (`uuid` "" : GPU-<cluster>-<gpu>; None: no UUID label)."""
    labels = {"cluster": cluster, "Hostname": NODE, "namespace": "team-a", "pod": pod, "container": "main",
              "modelName": "NVIDIA A100", **extra}
    if gpu is not None:
        labels["gpu"] = gpu
    if uuid is not None:
        labels["UUID"] = uuid or f"GPU-{cluster}-{gpu}"
    return labels


HISTORY = [
    # 2-GPU `serve` in both clusters: ours has its second GPU 95 % busy, the other's are idle.
    Series(UTIL, dcgm("a", "0", pod="serve"), scraped()),
    Series(UTIL, dcgm("a", "1", pod="serve"), scraped(value=95.0)),
    Series(UTIL, dcgm("b", "0", pod="serve"), scraped()),
    Series(UTIL, dcgm("b", "1", pod="serve"), scraped()),
    # `quiet`: our exporter sent nothing for the last 20 minutes; the other cluster's `quiet` reports on.
    Series(UTIL, dcgm("a", "2", pod="quiet"), scraped(end=1200)),
    Series(UTIL, dcgm("b", "2", pod="quiet"), scraped()),
    # `twopath`, 2 GPUs: GPU 3 scraped twice (the second path relabelled, no `gpu` label); its busy GPU 4 reaches
    # the store without the pod (attribution lost): one idle GPU seen twice is not two idle GPUs.
    Series(UTIL, {**dcgm("a", "3", pod="twopath"), "job": "dcgm"}, scraped()),
    Series(UTIL, {**dcgm("a", None, pod="twopath", uuid="GPU-a-3"), "job": "federated"}, scraped()),
    Series(UTIL, {**dcgm("a", "4", pod=""), "namespace": ""}, scraped(value=90.0)),
    # `nouuidpath`, 1 GPU: a second path without UUID carries the busy reading.
    Series(UTIL, {**dcgm("a", "5", pod="nouuidpath"), "job": "dcgm"}, scraped()),
    Series(UTIL, {**dcgm("a", "5", pod="nouuidpath", uuid=None), "job": "federated"},
           [(ago, 70.0 if ago == 95 else value) for ago, value in scraped()]),
    # `alone`: an idle 1-GPU pod only our cluster has (the scoped store judges it as the unscoped one did).
    Series(UTIL, dcgm("a", "6", pod="alone"), scraped()),
]


def on_grid() -> float:
    return 300.0 * math.floor(time.time() / 300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-shared"), HISTORY, now=on_grid())
    try:
        yield started
    finally:
        started.stop()


UNSCOPED = settings_loader.load()
SCOPED = settings_loader.load(overrides={"prometheus": {"scope_matchers": [OURS]}})


async def judged(server: PrometheusServer, name: str, *, gpus: int, window: int,
                 config: settings.Settings) -> utilisation.Assessment:
    """The running pod `name` in team-a (on NODE, holding `gpus`) judged as a cycle judges it."""
    raw = builders.pod(name, namespace="team-a", gpus=gpus, node=NODE, phase="Running")
    cluster = snapshot_build.build(nodes=[builders.gpu_node(NODE, gpus=8)], pods=[raw], priority_classes=[],
                                   names=UNSCOPED.names, taken_at=0)
    found = await judge(server.url, cluster, [f"team-a/{name}"], window=window, threshold_percent=10, config=config,
                        now=server.now)
    return found[f"team-a/{name}"]


@pytest.mark.parametrize(
    ("pod", "gpus", "window", "config", "idle", "reason"),
    [
        pytest.param("quiet", 1, HOUR, SCOPED, False, "no sample within Prometheus' lookback (stale)",
                     id="issue-own-exporter-silent-20-min-other-cluster-reporting-scoped"),
        pytest.param("quiet", 1, HOUR, UNSCOPED, False, "the pod's series show 2 distinct GPUs, it holds 1 (another "
                     "cluster's series in the same store? set prometheus.scope_matchers)",
                     id="issue-own-exporter-silent-20-min-unscoped-fails-closed-naming-the-setting"),
        pytest.param("twopath", 2, 600, SCOPED, False, "only 1 of 2 devices report",
                     id="issue-second-scrape-path-without-gpu-label-is-not-a-second-gpu"),
        pytest.param("serve", 2, HOUR, SCOPED, False, "95.0% >= 10%", id="second-gpu-busy-other-cluster-idle-scoped"),
        pytest.param("serve", 2, HOUR, UNSCOPED, False, "95.0% >= 10%",
                     id="second-gpu-busy-other-cluster-idle-unscoped"),
        pytest.param("nouuidpath", 1, 600, SCOPED, False, "70.0% >= 10%",
                     id="second-scrape-path-without-uuid-busiest-copy-wins"),
        pytest.param("alone", 1, HOUR, SCOPED, True, "peak GPU utilisation 1.0% < 10% over 3600s",
                     id="scoped-idle-pod-is-idle"),
        pytest.param("alone", 1, HOUR, UNSCOPED, True, "peak GPU utilisation 1.0% < 10% over 3600s",
                     id="unscoped-pod-of-one-cluster-only-is-idle"),
    ],
)
async def test_one_store_two_clusters_and_two_scrape_paths(server: PrometheusServer, pod: str, gpus: int, window: int,
                                                           config: settings.Settings, idle: bool, reason: str) -> None:
    found = await judged(server, pod, gpus=gpus, window=window, config=config)
    assert (found.idle, reason in found.reason) == (idle, True), found.reason


# --- start-up checks of the metric and the store ------------------------------------------------------------------

RULE = "team:dcgm_gpu_util:max_by_pod"
CHECKED = [
    Series(UTIL, dcgm("a", "0", pod="serve"), scraped(start=900)),
    Series(RULE, {"cluster": "a", "namespace": "team-a", "pod": "serve", "Hostname": NODE}, scraped(start=900)),
]


@pytest.fixture(scope="module")
def short_retention(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    started = start_prometheus(tmp_path_factory.mktemp("prometheus-2h"), CHECKED,
                               flags=["--storage.tsdb.retention.time=2h"])
    try:
        yield started
    finally:
        started.stop()


def check(url: str, *extra: str, config: dict[str, Any] | None = None, tmp_path: pathlib.Path,
          capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config or {}))
    code = cli.main(["check", "--prometheus", url, "--config", str(path), *extra])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("config", "extra", "code", "lines"),
    [
        pytest.param({"prometheus": {"gpu_util_metric": RULE}}, ["--window", "600"], 1,
                     [f"FAIL {RULE} (prometheus.gpu_util_metric): its 1 series carry neither UUID nor gpu: no per-GPU "
                      "identity (a recording rule aggregated over GPUs?)"], id="issue-recording-rule"),
        pytest.param({}, ["--window", "10800"], 1,
                     ["FAIL the store keeps 2h (/api/v1/status/runtimeinfo storageRetention), less than the longest "
                      "idle window 10800s"], id="issue-retention-shorter-than-the-window"),
        pytest.param({"prometheus": {"scope_matchers": ['cluster="c"']}}, [], 1,
                     ["FAIL no series of DCGM_FI_DEV_GPU_UTIL (prometheus.gpu_util_metric) matching "
                      "prometheus.scope_matchers ['cluster=\"c\"'] in the store"], id="scope-matching-nothing"),
        pytest.param({"prometheus": {"scope_matchers": [OURS]}}, ["--window", "7200"], 0,
                     ["ok   DCGM_FI_DEV_GPU_UTIL: 1 series matching prometheus.scope_matchers ['cluster=\"a\"'], "
                      "GPUs identified by UUID and gpu",
                      "ok   the store keeps 2h (/api/v1/status/runtimeinfo storageRetention) >= the longest idle "
                      "window 7200s"], id="scoped-retention-equal-to-the-window"),
    ],
)
def test_gpu_steward_check_prometheus(short_retention: PrometheusServer, tmp_path: pathlib.Path,
                                      capsys: pytest.CaptureFixture[str], config: dict[str, Any], extra: list[str],
                                      code: int, lines: list[str]) -> None:
    got, out = check(short_retention.url, *extra, config=config, tmp_path=tmp_path, capsys=capsys)
    assert got == code and all(line in out for line in lines), out


def test_descheduler_refuses_to_start_on_a_store_that_cannot_serve_its_windows(
        short_retention: PrometheusServer, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`descheduler --once` on a cluster whose normal tier's window is 3 h, against a store keeping 2 h: exit 2 with
    the reason, not a run in which every pod of that tier is silently not idle forever."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"kind": "Node", **builders.gpu_node(NODE, gpus=8)},
        builders.priority_class("normal", 1000, annotations={
            "reclaim-idle-resource.scheduling.x-k8s.io/resource-idle-seconds": "10800"}),
    ]}))
    code = cli.main(["descheduler", "--once", "--cluster", str(state), "--prometheus-url", short_retention.url])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (f"metrics store at {short_retention.url}: the store keeps 2h (/api/v1/status/runtimeinfo "
            "storageRetention), less than the longest idle window 10800s") in err


def test_a_store_that_does_not_answer_does_not_stop_the_start(tmp_path: pathlib.Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Unreachable: the checks cannot say anything, so the descheduler starts and says so (its cycles fail closed)."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"kind": "Node", **builders.gpu_node(NODE, gpus=8)}]}))
    with caplog.at_level("WARNING"):
        code = cli.main(["descheduler", "--once", "--cluster", str(state), "--prometheus-url", "http://127.0.0.1:9",
                         "--prometheus-timeout", "1"])
    assert code == 0
    assert "metrics store not checked at start (pods stay not idle while it cannot be read): store checks failed " \
           "at http://127.0.0.1:9" in caplog.text
