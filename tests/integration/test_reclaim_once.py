"""`gpu-steward descheduler --once` judges as a warmed-up loop, and a victim whose init container asked more GPUs
than its main containers is measured on the GPUs its running containers hold — against a real Prometheus.

The normal tier's 3 h window needs 36 or 37 parts of 300 s (as the clock stands against the grid); a loop reads
back `rebuild_parts_per_cycle` (12) a cycle after a start, so a single cycle used to judge every pod "not read from
the store yet". The history is written up to two minutes past the wall clock (the CLI's clock and the store's), so
the newest sample is always fresh."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from typing import Any

import pytest

from common import prometheus, settings, settings_loader, snapshot_build, source
from descheduler import evictor, policy
from descheduler.reclaim import loop as reclaim_loop
from descheduler.reclaim import utilisation_parts
from gpu_steward import cli
from tests import builders
from tests.support.prometheus import Series, StartPrometheus

pytestmark = pytest.mark.prometheus

UTIL = "DCGM_FI_DEV_GPU_UTIL"
P = policy.PREFIX
AHEAD = 120.0  # the history's "now" is this far past the wall clock
NORMAL = builders.priority_class("normal", 1000, annotations={f"{P}resource-idle-seconds": "10800",
                                                              f"{P}resource-idle-usage-threshold": "5"})


def dcgm(gpu: str, pod: str) -> dict[str, str]:
    return {"gpu": gpu, "UUID": f"GPU-n1-{gpu}", "Hostname": "n1", "namespace": "team-a", "pod": pod}


def scraped(*, oldest: float, value: float = 1.0) -> list[tuple[float, float]]:
    """A sample every 15 s from `oldest` s before the history's now to 5 s before it."""
    return [(float(ago), value) for ago in range(5, int(oldest), 15)]


def running(name: str, *, gpus: int = 1, init_gpus: int = 0, sidecar_gpus: int = 0) -> dict[str, Any]:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="normal", priority=1000)
        body["metadata"]["ownerReferences"] = [{"kind": "Job", "name": name, "uid": f"uid-job-{name}",
                                                "controller": True}]
        inits = []
        if init_gpus:
            inits.append({"name": "warm-up", "image": "cuda:12",
                          "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}})
        if sidecar_gpus:
            inits.append({"name": "sidecar", "image": "cuda:12", "restartPolicy": "Always",
                          "resources": {"limits": {"nvidia.com/gpu": str(sidecar_gpus)}}})
        if inits:
            body["spec"]["initContainers"] = inits

    return builders.pod(name, namespace="team-a", gpus=gpus, node="n1", phase="Running",
                        created="2020-01-01T00:00:00Z", mutate=mutate)


HISTORY = [
    Series(UTIL, dcgm("0", "idle"), scraped(oldest=11700)),
    Series(UTIL, dcgm("1", "busy"), scraped(oldest=11700, value=50.0)),
    Series(UTIL, dcgm("2", "young"), scraped(oldest=5400)),  # 90 min of data: the 3 h window is not covered
    # 2 GPUs accounted (its init container's), 1 held by its running container: only that one reports.
    Series(UTIL, dcgm("3", "init-larger"), scraped(oldest=11700)),
    # 1 GPU in its main container, 1 in a sidecar init container: both held while running, both report.
    Series(UTIL, dcgm("4", "with-sidecar"), scraped(oldest=11700)),
    Series(UTIL, dcgm("5", "with-sidecar"), scraped(oldest=11700)),
    # A sidecar that holds a GPU whose series is missing: 1 of 2 devices reports.
    Series(UTIL, dcgm("6", "sidecar-silent"), scraped(oldest=11700)),
]
PODS = [running("idle"), running("busy"), running("young"), running("init-larger", init_gpus=2),
        running("with-sidecar", sidecar_gpus=1), running("sidecar-silent", sidecar_gpus=1)]
LIMITS = {"per_cycle": 100, "per_node": 100, "per_namespace": 100}


def verdicts(plan: dict[str, Any]) -> dict[str, str]:
    return {**{e["pod"]: f"evict: {e['reason']}" for e in plan["evictions"]},
            **{s["pod"]: f"spare: {s['reason']}" for s in plan["spared"]}}


async def warmed_up(url: str, config: settings.Settings) -> dict[str, str]:
    """The verdicts of a loop whose kept parts hold the whole window: read back over 4 cycles (12 parts a cycle),
    then judged by a new loop over those parts (the first loop's dry-run evictions make its own pods "leaving")."""
    cluster = source.StaticSource(snapshot_build.build(nodes=[builders.gpu_node("n1", gpus=8)], pods=PODS,
                                                       priority_classes=[NORMAL], names=config.names,
                                                       taken_at=time.time()))
    client = prometheus.Client(settings.Prometheus(url=url))

    def new_loop() -> reclaim_loop.ReclaimLoop:
        return reclaim_loop.ReclaimLoop(config=config, cluster=cluster, prometheus=client,
                                        evictions=evictor.DryRunClient(), api=None)

    try:
        warming = new_loop()
        cold = [await warming.cycle() for _ in range(4)]
        judge = new_loop()
        judge.parts = warming.parts
        cycle = await judge.cycle()
    finally:
        client.close()
    assert "not read from the store yet" in verdicts(cold[0].plan.as_json())["team-a/idle"]  # cold: as before
    return verdicts(cycle.plan.as_json())


def test_once_judges_the_3h_tier_as_a_warmed_up_loop(
    prometheus_factory: StartPrometheus, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
) -> None:
    server = prometheus_factory(HISTORY, now=time.time() + AHEAD)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"kind": "List", "items": [builders.gpu_node("n1", gpus=8), NORMAL, *PODS]}))
    overrides = {"descheduler": {"reclaim": {"mode": "always", "limits": LIMITS}}}
    config_file = tmp_path / "settings.yaml"
    config_file.write_text(json.dumps(overrides))
    grid = utilisation_parts.Grid.of(settings_loader.load(overrides=overrides).descheduler.reclaim)
    before = time.time()
    code = cli.main(["descheduler", "--once", "--cluster", str(state), "--config", str(config_file),
                     "--prometheus-url", server.url, "--output", "json"])
    # 36 or 37 parts, as the clock stands against the grid (the newest part is settled or not yet).
    needed = {len(grid.needed(10800, t)) for t in (before, time.time())}
    captured = capsys.readouterr()
    assert code == 0, captured.err
    once = verdicts(json.loads(captured.out))
    progress = [line for line in captured.err.splitlines() if "read back" in line]
    assert progress, captured.err + captured.out
    told = {f"descheduler --once: utilisation parts of 300s read back: {n} of {n}": n for n in needed}
    assert progress[-1] in told, (needed, captured.err)
    assert len(progress) == -(-told[progress[-1]] // 12)  # 12 parts a read
    loop = asyncio.run(warmed_up(server.url, settings_loader.load(overrides=overrides)))
    assert once == loop
    assert once == {
        "team-a/idle": "evict: peak GPU utilisation 1.0% < 5% over 10800s; mode always, no preemptor needed",
        "team-a/busy": "spare: not idle: peak GPU utilisation 50.0% >= 5% over 10800s",
        "team-a/young": once["team-a/young"],
        "team-a/init-larger": "evict: peak GPU utilisation 1.0% < 5% over 10800s; mode always, no preemptor needed",
        "team-a/with-sidecar": "evict: peak GPU utilisation 1.0% < 5% over 10800s; mode always, no preemptor needed",
        "team-a/sidecar-silent": "spare: not idle: DCGM_FI_DEV_GPU_UTIL: only 1 of 2 devices report",
    }
    assert once["team-a/young"].startswith("spare: not idle: DCGM_FI_DEV_GPU_UTIL: coverage: a stretch of the "
                                           "10800s window without a sample"), once["team-a/young"]
