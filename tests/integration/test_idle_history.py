"""Learned idle windows in a real reclaim cycle against a real Prometheus (descheduler/reclaim/idle_history.py).

Every pod below idles for the last 40 minutes and, before that, alternates 10 busy minutes with 10 idle ones
(or with silence). The tier window is 3 h, so only a learned window can find any of them idle. 21 more pods, not
in the cluster, make the pool the learned window's probability is estimated from."""

from __future__ import annotations

import datetime
import json
import math
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest

from common import prometheus, settings, settings_loader, snapshot_build, source
from descheduler import evictor, policy
from descheduler.reclaim import idle_history, utilisation_promql
from descheduler.reclaim import loop as reclaim_loop
from gpu_steward import cli
from tests import builders
from tests.support.prometheus import PrometheusServer, Series, StartPrometheus, free_port, start_prometheus

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
P = policy.PREFIX
LEARN = "gpu-steward.io/learned-idle-window"
IDLE_FOR = 2400  # the last 40 min idle
CHUNK = 600  # then 10 min busy, 10 min idle, ... back in time


def history(*, newest: float, oldest: float, busy: float | None = 50.0, idle_for: int = IDLE_FOR
            ) -> list[tuple[float, float]]:
    """One sample a minute: idle for the last `idle_for` s, then alternating chunks, from `newest` to `oldest` s
    ago; `busy` None: the busy chunks have no samples (the idle stretches end in gaps, not in work)."""
    samples = []
    for ago in range(30, int(oldest), 60):
        if ago < newest:
            continue
        working = ago >= idle_for and (ago - idle_for) // CHUNK % 2 == 0
        if working and busy is None:
            continue
        samples.append((float(ago), busy if working else 1.0))
    return samples


def dcgm(gpu: str, pod: str) -> dict[str, str]:
    return {"gpu": gpu, "UUID": f"GPU-n1-{gpu}", "Hostname": "n1", "namespace": "team-a", "pod": pod}


HISTORY = [
    # Deployment serve: 3 stretches in the current replica's life, 3 more in a replica of an older rollout.
    Series(UTIL, dcgm("0", "serve-7d9f8-aaaaa"), history(newest=0, oldest=6000)),
    Series(UTIL, dcgm("0", "serve-11111-bbbbb"), history(newest=6000, oldest=9600)),
    # The same behaviour, in a class that does not learn.
    Series(UTIL, dcgm("1", "plain-7d9f8-ccccc"), history(newest=0, oldest=9600)),
    # A Job with 2 stretches only: too little history.
    Series(UTIL, dcgm("2", "train-x1y2z"), history(newest=0, oldest=4800)),
    # Idle stretches ended in silence, never in work: nothing learned.
    Series(UTIL, dcgm("3", "gappy-qwert"), history(newest=0, oldest=9600, busy=None)),
    # The pool: 21 pods elsewhere, each with 8 stretches, now idle for 3x their longest and still idle: evidence
    # that a stretch lasting twice its pod's longest rarely ends in work within 10 min.
    *(Series(UTIL, {**dcgm("0", f"fleet-{i}"), "Hostname": f"n{i + 2}", "namespace": "team-b"},
             history(newest=0, oldest=12000)) for i in range(21)),
]


def running(name: str, *, gpu_class: str, owner: tuple[str, str], labels: dict[str, str] | None = None
            ) -> dict[str, Any]:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName=gpu_class, priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]

    return builders.pod(name, namespace="team-a", gpus=1, node="n1", phase="Running", labels=labels,
                        created="2020-01-01T00:00:00Z", mutate=mutate)


TIER = {f"{P}resource-idle-seconds": "10800", f"{P}resource-idle-usage-threshold": "5"}
CLASSES = [builders.priority_class("learning", 1000, annotations={**TIER, LEARN: "true"}),
           builders.priority_class("fixed", 1000, annotations=TIER)]
PODS = [
    running("serve-7d9f8-aaaaa", gpu_class="learning", owner=("ReplicaSet", "serve-7d9f8"),
            labels={"pod-template-hash": "7d9f8"}),
    running("plain-7d9f8-ccccc", gpu_class="fixed", owner=("ReplicaSet", "plain-7d9f8"),
            labels={"pod-template-hash": "7d9f8"}),
    running("train-x1y2z", gpu_class="learning", owner=("Job", "train")),
    running("gappy-qwert", gpu_class="learning", owner=("ReplicaSet", "gappy")),
]


def controller(kind: str, name: str, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    """A ReplicaSet or Job as `kubectl get replicasets,jobs -o json` lists it (the fields learned windows read)."""
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}]
    return {"apiVersion": "apps/v1" if kind == "ReplicaSet" else "batch/v1", "kind": kind, "metadata": meta}


# Deployment serve's ReplicaSets (the current rollout and an older one, whose pod is gone), plain's, Job train
# and a ReplicaSet gappy of its own.
CONTROLLERS = [controller("ReplicaSet", "serve-7d9f8", ("Deployment", "serve")),
               controller("ReplicaSet", "serve-11111", ("Deployment", "serve")),
               controller("ReplicaSet", "plain-7d9f8", ("Deployment", "plain")),
               controller("Job", "train"), controller("ReplicaSet", "gappy")]
# 6 h of look-back read in one range query; everything else as the defaults.
CONFIG = settings_loader.load(overrides={"descheduler": {"reclaim": {
    "mode": "always", "limits": {"per_cycle": 100, "per_node": 100, "per_namespace": 100},
    "learned_window": {"lookback_seconds": 21600, "chunk_seconds": 21600},
    "rebuild_parts_per_cycle": 48}}})  # the 3 h window's parts read back in the first cycle


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    now = math.floor(time.time() / 300) * 300  # on the history's 5-min steps, so the chunks are whole steps
    started = start_prometheus(tmp_path_factory.mktemp("prometheus"), HISTORY, now=now)
    try:
        yield started
    finally:
        started.stop()


class Counting:
    """The real Prometheus, its clock read as 7 s before `now` (the history's own, floored to its steps): every
    query of a cycle is then evaluated at the time the history was written for, as the trace replay does. The 7 s
    keep the window's part boundaries off the samples' 60 s grid: Prometheus 2.x ranges include their left end,
    so a sample exactly on a boundary counts in two parts and makes the coverage judgement stricter."""

    def __init__(self, client: prometheus.Client, *, now: float) -> None:
        self.client = client
        self.now = now
        self.ranges = 0
        self.instants = 0

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        self.instants += 1
        if promql == utilisation_promql.TIME_QUERY:
            at = self.now - 7
            return prometheus.Answer([{"metric": {}, "value": [at, repr(at)]}])
        return await self.client.instant(promql, time=time)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.ranges += " or " in promql  # the history's (the utilisation parts are range queries too)
        return await self.client.query_range(promql, start=start, end=end, step=step)


def loop(querier: Any, now: float, *, registry: prometheus_client.CollectorRegistry | None = None
         ) -> reclaim_loop.ReclaimLoop:
    cluster = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=PODS, priority_classes=CLASSES,
                                   names=CONFIG.names, taken_at=now)
    return reclaim_loop.ReclaimLoop(config=CONFIG, cluster=source.StaticSource(cluster), prometheus=querier,
                                    evictions=evictor.DryRunClient(), api=None, clock=lambda: now, registry=registry,
                                    controllers=idle_history.fixed_controllers(idle_history.controllers_in(CONTROLLERS)))


async def test_learned_window_evicts_what_the_tier_window_cannot_and_says_why(server: PrometheusServer) -> None:
    querier = Counting(prometheus.Client(settings.Prometheus(url=server.url)), now=server.now)
    try:
        reclaim = loop(querier, server.now)
        before = await reclaim.cycle()  # reads no history itself: starts its refresh, beside the cycles
        await reclaim.learner.settle()
        first = await reclaim.cycle()  # the refresh is complete: learned windows
        await reclaim.learner.settle()
        await reclaim.cycle()  # history is fresh: no second range query
        await reclaim.learner.settle()
    finally:
        querier.client.close()
    assert querier.ranges == 1
    assert before.plan.evictions == ()
    [eviction] = first.plan.evictions
    assert (eviction.pod, eviction.window_seconds) == ("team-a/serve-7d9f8-aaaaa", 1800)
    assert eviction.reason.startswith(
        "peak GPU utilisation 1.0% < 5% over 1800s; learned idle window 30 min = 2.0x this workload's longest idle "
        "stretch that ended in work in 6.0 h (about 15 min, of 6): of the 22 idle stretches of all pods that lasted "
        "2.0x their pod's longest, followed to work or to 2.7x, an estimated 0.0% ended in work within 10 min, under "
        "5%; mode always")
    spared = {s.pod: s.reason for s in first.plan.spared}
    assert spared["team-a/plain-7d9f8-ccccc"] == "not idle: peak GPU utilisation 50.0% >= 5% over 10800s"
    assert spared["team-a/train-x1y2z"] == (
        "not idle: peak GPU utilisation 50.0% >= 5% over 10800s; 2 idle stretch(es) of this workload ended in "
        "work in 6.0 h, fewer than 6: tier window")
    assert spared["team-a/gappy-qwert"].startswith("not idle: DCGM_FI_DEV_GPU_UTIL: coverage")
    assert spared["team-a/gappy-qwert"].endswith("0 idle stretch(es) of this workload ended in work in 6.0 h, "
                                                 "fewer than 6: tier window")


async def test_history_not_read_keeps_the_tier_window() -> None:
    now = datetime.datetime.now(datetime.UTC).timestamp()
    down = prometheus.Client(settings.Prometheus(url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2))
    registry = prometheus_client.CollectorRegistry()
    try:
        reclaim = loop(down, now, registry=registry)
        await reclaim.cycle()
        await reclaim.learner.settle()  # the refresh it started fails
        cycle = await reclaim.cycle()
        await reclaim.learner.settle()  # and the next one, started by this cycle
    finally:
        down.close()
    assert cycle.plan.evictions == ()
    assert (reclaim.learner.queries, reclaim.learner.errors) == (2, 2)
    assert registry.get_sample_value("gpu_steward_reclaim_history_errors_total") == 2
    assert registry.get_sample_value("gpu_steward_reclaim_history_fresh") == 0
    spared = {s.pod: s.reason for s in cycle.plan.spared}
    assert spared["team-a/serve-7d9f8-aaaaa"].startswith("not idle: Prometheus query for the store's time failed")
    assert spared["team-a/serve-7d9f8-aaaaa"].endswith("; history not read (yet): tier window")
    assert "history" not in spared["team-a/plain-7d9f8-ccccc"]


def test_query_reads_every_device_kind_by_pod() -> None:
    promql = idle_history.query(config=settings.Prometheus(), step_seconds=300)
    assert promql == ('max by (exported_namespace, exported_pod, namespace, pod) '
                      '(max_over_time(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE=""}[300s]) or '
                      'max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!=""}[300s]) * 100)')


def test_the_cli_once_dry_run_prints_the_learned_window_reason(
    prometheus_factory: StartPrometheus, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpu-steward descheduler --once --cluster STATE --prometheus-url URL` (the dry-run CLI) reads the whole
    look-back in its one cycle (12 chunks of 30 min here, the default chunk), so its plan shows learned windows."""
    # Written up to the wall clock (the CLI's own clock and the store's), so off the 5-min steps: a 10-min stretch
    # may read as one idle step or two. The pool's pods have been idle for 90 min, so that either way they are
    # followed past the serving workload's 30 min plus the 10-min horizon.
    fleet = [Series(UTIL, s.labels, history(newest=0, oldest=15000, idle_for=5400)) for s in HISTORY[5:]]
    server = prometheus_factory([*HISTORY[:5], *fleet])
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"kind": "List", "items": [builders.gpu_node("n1", gpus=8), *CLASSES, *PODS,
                                                           *CONTROLLERS]}))
    config = tmp_path / "settings.yaml"
    config.write_text(json.dumps({"descheduler": {"reclaim": {"mode": "always",
                                                              "learned_window": {"lookback_seconds": 21600}}}}))
    code = cli.main(["descheduler", "--once", "--cluster", str(state), "--config",
                                              str(config), "--prometheus-url", server.url])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    evicted = lines.get("evict team-a/serve-7d9f8-aaaaa on n1", out)
    assert "; learned idle window 30 min = " in evicted, out
    assert "this workload's longest idle stretch that ended in work in 6.0 h" in evicted
    assert lines["spare team-a/train-x1y2z"].endswith("fewer than 6: tier window")


def web_history() -> list[Series]:
    """Deployment web: its pod `web-5f6g7-qwrtz` worked, idled 27 min and was evicted (its series ends); 5 min
    later the pod that replaced it, `web-5f6g7-bcdfg`, worked at once, then 6 stretches of 10 min and 35 min idle
    now. The fleet (as above, idle 40 min now) is the pool."""
    start = 2100 + 13 * 600  # the replacement's first sample (s ago), busy
    evicted = [(float(ago), 1.0 if ago < start + 300 + 1620 else 50.0) for ago in range(start + 300, start + 2700, 60)]
    return [Series(UTIL, dcgm("0", "web-5f6g7-bcdfg"), history(newest=0, oldest=start + 1, idle_for=2100)),
            Series(UTIL, dcgm("0", "web-5f6g7-qwrtz"), evicted), *HISTORY[5:]]


async def test_an_eviction_followed_by_work_widens_the_learned_window(prometheus_factory: StartPrometheus) -> None:
    """The evicted run and the replacement's wait (about 35 min) is a stretch that ended in work: Deployment web's
    longest, so its window is 40 min, not the 30 min its 10-min stretches alone give: idle 35 min, it stays."""
    now = math.floor(time.time() / 300) * 300
    server = prometheus_factory(web_history(), now=now)
    web = running("web-5f6g7-bcdfg", gpu_class="learning", owner=("ReplicaSet", "web-5f6g7"))
    cluster = snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=[web], priority_classes=CLASSES,
                                   names=CONFIG.names, taken_at=now)
    querier = Counting(prometheus.Client(settings.Prometheus(url=server.url)), now=now)
    controllers = idle_history.controllers_in([controller("ReplicaSet", "web-5f6g7", ("Deployment", "web"))])

    async def judged(found: dict[tuple[str, str, str], Any]) -> str:
        reclaim = reclaim_loop.ReclaimLoop(config=CONFIG, cluster=source.StaticSource(cluster), prometheus=querier,
                                           evictions=evictor.DryRunClient(), api=None, clock=lambda: now,
                                           controllers=idle_history.fixed_controllers(found))
        await reclaim.cycle()
        await reclaim.learner.settle()
        cycle = await reclaim.cycle()
        return {**{e.pod: f"evict: {e.reason}" for e in cycle.plan.evictions},
                **{s.pod: f"spare: {s.reason}" for s in cycle.plan.spared}}["team-a/web-5f6g7-bcdfg"]

    try:
        widened = await judged(controllers)
        alone = await judged({})  # its ReplicaSet unknown: the evicted pod's series is not its workload's
    finally:
        querier.client.close()
    assert widened.startswith("spare: not idle: peak GPU utilisation 50.0% >= 5% over 2400s; learned idle window "
                              "40 min = "), widened
    assert "this workload's longest idle stretch that ended in work in 6.0 h (about 3" in widened
    assert ", of 7)" in widened
    assert alone.startswith("evict: peak GPU utilisation 1.0% < 5% over 1800s; learned idle window 30 min = 2.0x "
                            "this workload's longest idle stretch that ended in work in 6.0 h (about 15 min, of 6)"
                            ), alone
