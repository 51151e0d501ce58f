"""One size of the reclaim-cycle benchmark against a real Prometheus (run by benchmarks/reclaim_cycle.py).

    python benchmarks/reclaim_prometheus.py --gpus 10000 [--cycles 10] [--pending 20] [--fail-first-cycle]
        [--no-cluster-matcher] [--twice-every 10] [--profile FILE] [--quick] --out FILE

A shared store by default: every series carries `cluster="a"` and the descheduler's
`prometheus.scope_matchers` is `['cluster="a"']` (`--no-cluster-matcher`: neither), and one GPU in ten
(`--twice-every`, 0: none) reaches it through a second scrape path without the `gpu` label.

A cluster of 8-GPU nodes, each holding pods of 1, 1, 2 and 4 GPUs (every GPU taken), in the chart's tiers
(normal: 3 h window, scavenger: 10 min, critical: never reclaimed; charts/gpu-steward/values.yaml), a third
of them idle; pending: `--pending` critical pods of 1-8 GPUs and two gated gangs of 4 x 2 GPUs. Its DCGM
history (one series per GPU, 4 h, every 15 s; benchmarks/dcgm_history.py) is backfilled into a real
Prometheus, then `ReclaimLoop`s (one a cycle, so that dry-run cooldowns do not shrink the next cycle's work,
sharing one part cache) run dry-run cycles against it with the real client, the store's time (the answer to
`vector(time())`) advancing 60 s a cycle as in production, over history written past the wall clock (the
loop's own clock stays at the snapshot's, so that pending pods and gangs keep their age; the skew check is
widened for it): first the cold cycles (empty part cache: the rebuild, `rebuild_parts_per_cycle` parts a
cycle, until a cycle reads no more than the steady state does), then `--cycles` warm ones (10: two parts
settle on the way; a cycle with a failed query is still cold). Reported apart for cold and warm cycles:
wall time, CPU seconds of each side, queries, parts read, each query's wall time (by kind: live stretch or
parts, and statistic); peak RSS of this process
(the descheduler's part: snapshot, cache, answers, plan) and of Prometheus, demands served by kind (warm),
evictions planned, the re-checks right before the evictions (count, summed wall time, its share of the rest of
the cycle; then the last warm cycle's re-checks timed both ways, one query per victim and one per demand,
`recheck_arms`), and the plain `max_over_time` of each window for reference. Every cycle, cold or warm, is
also printed and reported with its candidates, failed queries, the store's time past the history's "now" (the
history ends `AHEAD_SECONDS` after it) and why the other pods were spared: a count per reason, its numbers
masked and its text cut (`REASON_CHARS`), so that a cycle finding no idle pod says why. `--fail-first-cycle`
fails every range query of the first cycle (a timeout, as a loaded store gives it): the cold start after it.
`--learned`: the normal tier learns its idle windows (its PriorityClass opts in), its look-back the history's 4 h
read in `chunk_seconds` (30 min) reads, one a cycle, each the size of a 30-min refresh; one learner across the
cycles. Each cycle's refresh runs after it, beside the next one as in the process (`Learner.start()`); here it
is awaited after the cycle and timed apart: `learned.refresh_seconds` (its query, fold and pool), while the
cycle's wall and CPU stop before it. (The loop's clock stays put, so once the look-back is read no refresh is due:
the reads while it is read stand in for the 30-min refreshes.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import datetime
import json
import os
import pathlib
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after site-packages: an installed gpu-steward wins; a bare checkout works too

from benchmarks import dcgm_history  # noqa: E402
from common import prometheus, settings, settings_loader, snapshot_build, source  # noqa: E402
from descheduler import evictor, policy, reclaim  # noqa: E402
from descheduler.reclaim import idle_history, measurement, utilisation_promql  # noqa: E402
from descheduler.reclaim import loop as reclaim_loop  # noqa: E402
from gpu_steward import cmd_descheduler  # noqa: E402

VALUES = ROOT / "charts" / "gpu-steward" / "values.yaml"
SCRAPE_SECONDS, HOURS = 15, 4.0
AHEAD_SECONDS = 1800  # samples past "now": the store's newest stays one scrape old while the benchmark runs
NODE_PODS = ((1, (0,)), (1, (1,)), (2, (2, 3)), (4, (4, 5, 6, 7)))  # (GPUs, indices) of the pods of a node
CLASS_MIX = ("gpu-steward-normal", "gpu-steward-normal", "gpu-steward-scavenger", "gpu-steward-critical",
             "gpu-steward-normal", "gpu-steward-scavenger", "gpu-steward-normal")
PENDING_GPUS = (1, 2, 4, 1, 2, 8)
GOALS = {"query_seconds": 1.0, "cycle_seconds": 2.0, "peak_rss_mb": 500.0}
CYCLE_SECONDS = 60.0  # store time between cycles (the default reclaim interval)
# The loop's own clock stays at the snapshot's time (pending pods and gated gangs keep their age, so both kinds of
# demand stay demands); only the store's time advances: its skew from ours is allowed up to the run's length.
SKEW_ALLOWED = 3600.0
RECHECK = "recheck"  # the re-check of each victim right before its eviction (descheduler.reclaim.recheck)
REASON_CHARS = 90  # a spared pod's reason, its numbers masked, cut to this many characters in the histogram


def chart_classes() -> list[dict[str, Any]]:
    """The chart's PriorityClasses with their reclaim annotations, as the chart renders them."""
    values = yaml.safe_load(VALUES.read_text())
    prefix = values["priorityClasses"]["reclaimAnnotationPrefix"]
    out = []
    for tier, spec in values["settings"]["tiers"].items():
        if not isinstance(spec, dict):
            continue
        reclaim = dict(values["priorityClasses"].get(tier, {}).get("reclaim") or {})
        notes = {f"{prefix}{k}": str(v) for k, v in reclaim.items() if k != "enabled"} \
            if reclaim.pop("enabled", False) else {}
        out.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": spec["value"],
                    "metadata": {"name": spec["name"], "annotations": notes}})
    return out


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Raw = dict[str, list[dict[str, Any]]]


def cluster(gpus: int, *, pending: int, now: float) -> tuple[Raw, list[dcgm_history.Device]]:
    classes = chart_classes()
    value = {c["metadata"]["name"]: c["value"] for c in classes}
    started = _iso(now - 5 * 3600)  # before the window and toleration of every tier
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    devices: list[dcgm_history.Device] = []
    for n in range(max(1, gpus // 8)):
        name = f"gpu-{n:05d}"
        nodes.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
                      "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                                                             "nvidia.com/gpu": "8"},
                                             "conditions": [{"type": "Ready", "status": "True"}]}})
        for size, indices in NODE_PODS:
            i = len(pods)
            class_name = CLASS_MIX[i % len(CLASS_MIX)]
            pod = f"p-{i:06d}"
            pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod, "namespace": f"team-{i % 50}", "uid": f"uid-{i}", "creationTimestamp": started,
                "ownerReferences": [{"kind": "Job", "name": f"job-{i}", "controller": True}]},
                "spec": {"nodeName": name, "priority": value[class_name], "priorityClassName": class_name,
                         "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(size)}}}]},
                "status": {"phase": "Running", "startTime": started, "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": started}]}})
            devices += [dcgm_history.Device(name, g, f"team-{i % 50}", pod, i % 3 == 0) for g in indices]
    waiting = []
    for i in range(pending):
        waiting.append(_pending(f"w-{i:04d}", gpus=PENDING_GPUS[i % len(PENDING_GPUS)], now=now))
    for g in range(2):  # complete gated gangs that wait only for GPUs
        for m in range(4):
            body = _pending(f"gang-{g}-{m}", gpus=2, now=now, namespace="team-g")
            body["metadata"]["labels"] = {"gpu-steward.io/gang-name": f"g{g}", "gpu-steward.io/gang-size": "4"}
            body["spec"]["schedulingGates"] = [{"name": "gpu-steward.io/gang"}]
            del body["status"]["conditions"]
            waiting.append(body)
    return {"nodes": nodes, "pods": pods + waiting, "priority_classes": classes}, devices


def _pending(name: str, *, gpus: int, now: float, namespace: str = "team-b") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "creationTimestamp": _iso(now - 120)},
            "spec": {"priority": 100000, "priorityClassName": "gpu-steward-critical",
                     "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]}}


class Timed:
    """The real client, timing each query by what it asks (live stretch or parts, and statistic); the store's
    time is the benchmark's clock (advanced 60 s a cycle over history written ahead of the wall clock)."""

    def __init__(self, client: prometheus.Client, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        self.seconds: list[tuple[str, float]] = []  # this cycle's queries
        self.fail_ranges = False  # every range query fails as a timeout (--fail-first-cycle)
        self.history = ""  # the learned windows' history query (`--learned`): timed apart, not as the cycle's
        self.history_seconds: list[float] = []

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        if promql == utilisation_promql.TIME_QUERY:
            self.seconds.append(("store time", 0.0))
            return prometheus.Answer([{"metric": {}, "value": [self.clock.now, repr(self.clock.now)]}])
        started = _perf()
        try:
            return await self.client.instant(promql, time=time)
        finally:
            self.seconds.append((f"live {_stat(promql)}" if utilisation_promql.RECHECK not in promql else RECHECK,
                                 _perf() - started))

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[prometheus.Series]:
        if self.fail_ranges:
            self.seconds.append((f"parts {_stat(promql)} (failed)", 0.0))
            raise prometheus.PrometheusError(f"query timed out (injected) at {self.client.url}")
        started = _perf()
        try:
            return await self.client.query_range(promql, start=start, end=end, step=step)
        finally:
            if promql == self.history:
                self.history_seconds.append(_perf() - started)
            else:
                self.seconds.append((f"parts {_stat(promql)} x{round((end - start) / step) + 1}", _perf() - started))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _stat(promql: str) -> str:
    for function, name in (("min by", "n_min"), ("count_over_time", "n"), ("max_over_time", "peak"),
                           ("sum_over_time", "sum"), ("timestamp", "last")):
        if function in promql:
            return name
    return "other"


def _perf() -> float:
    return time.perf_counter()


def reasons(plan: reclaim.Plan) -> dict[str, int]:
    """Why pods were spared, a count per reason (numbers masked, cut to `REASON_CHARS`), most frequent first."""
    counted = collections.Counter(re.sub(r"\d+(\.\d+)?", "#", s.reason)[:REASON_CHARS] for s in plan.spared)
    return dict(counted.most_common())


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _windows(classes: list[dict[str, Any]]) -> list[int]:
    return sorted({int(c["metadata"]["annotations"][f"{policy.PREFIX}resource-idle-seconds"]) for c in classes
                   if f"{policy.PREFIX}resource-idle-seconds" in c["metadata"]["annotations"]})


async def _plain(url: str, pid: int, windows: list[int], *, repeats: int = 3) -> dict[str, dict[str, float]]:
    """The reference: a plain max_over_time over every GPU, per window: wall (best of `repeats`) and
    Prometheus' CPU seconds (median)."""
    client = prometheus.Client(settings.Prometheus(url=url, timeout_seconds=120))
    try:
        out = {}
        for window in windows:
            wall, cpu = [], []
            for _ in range(repeats):
                started, used = _perf(), dcgm_history.cpu_seconds(pid)
                await client.query(f"max_over_time(DCGM_FI_DEV_GPU_UTIL[{window}s])")
                wall.append(_perf() - started)
                cpu.append(dcgm_history.cpu_seconds(pid) - used)
            out[f"{window}s"] = {"wall": round(min(wall), 3), "prometheus_cpu": round(statistics.median(cpu), 3)}
        return out
    finally:
        client.close()


CLUSTER = "a"
TWICE_EVERY = 10
ARM_REPEATS = 7  # each re-check arm, interleaved


async def recheck_arms(client: prometheus.Client, config: settings.Prometheus, evictions: Sequence[reclaim.Eviction],
                       *, repeats: int = ARM_REPEATS) -> dict[str, dict[str, Any]]:
    """The re-check's queries both ways on the real store, interleaved `repeats` times: one query per GPU victim,
    a demand's victims concurrently (before), against one query per demand (now); for the last warm cycle's
    demands as planned, and for all of its victims as one demand (a gang, or a pending pod taking several
    victims). The re-reads of a demand's later victims right before their own calls are the same both ways: not
    timed."""
    demands: dict[str, list[str]] = {}
    for eviction in evictions:
        if eviction.utilization is not None:
            demands.setdefault(eviction.preemptor or eviction.unit, []).append(eviction.pod.partition("/")[2])
    shapes = {"as planned": list(demands.values()), "one demand of all": [[n for v in demands.values() for n in v]]}

    async def arm(groups: list[list[str]], *, per_victim: bool) -> float:
        started = _perf()
        for names in groups:
            asked = [[name] for name in names] if per_victim else [names]
            await asyncio.gather(*(client.instant(utilisation_promql.newest(a, config=config, kinds=("gpu",)))
                                   for a in asked))
        return _perf() - started

    out: dict[str, dict[str, Any]] = {}
    for shape, groups in shapes.items():
        before, now = [], []
        for _ in range(repeats):
            before.append(await arm(groups, per_victim=True))
            now.append(await arm(groups, per_victim=False))
        out[shape] = {"demands": len(groups), "victims": sum(map(len, groups)),
                      "one_query_per_victim_seconds": _spread(before), "one_query_per_demand_seconds": _spread(now)}
    return out


def run(gpus: int, *, pending: int, cycles: int, fail_first_cycle: bool = False, learned: bool = False,
        cluster_label: str | None = CLUSTER, twice_every: int = TWICE_EVERY,
        profile: pathlib.Path | None = None) -> dict[str, Any]:
    """`profile`: the last warm cycle runs under cProfile, its stats dumped there (`python -m pstats FILE`)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="reclaim-prometheus-") as tmp:
        now = time.time()
        raw, devices = cluster(gpus, pending=pending, now=now)
        with dcgm_history.backfilled(pathlib.Path(tmp) / "prometheus", devices, hours=HOURS,
                                     scrape_seconds=SCRAPE_SECONDS, ahead_seconds=AHEAD_SECONDS,
                                     cluster=cluster_label, twice_every=twice_every) as history:
            learning = {"learned_window": {"lookback_seconds": HOURS * 3600}} if learned else {}
            scope = [f'cluster="{cluster_label}"'] if cluster_label else []
            config = settings_loader.load(overrides={"prometheus": {"url": history.server.url,
                                                                    "scope_matchers": scope},
                                              "descheduler": {"reclaim": {
                                                  "dry_run": True, "max_clock_skew_seconds": SKEW_ALLOWED,
                                                  **learning}}})
            for pc in raw["priority_classes"] if learned else ():
                if pc["metadata"]["name"] == "gpu-steward-normal":
                    pc["metadata"]["annotations"][config.names.learned_idle_window] = "true"
            built = snapshot_build.build(nodes=raw["nodes"], pods=raw["pods"], priority_classes=raw["priority_classes"],
                                         names=config.names, taken_at=now)
            del raw
            windows = _windows(chart_classes())
            client = prometheus.Client(config.prometheus)
            clock = Clock(history.now)
            timed = Timed(client, clock)
            if learned:
                timed.history = idle_history.query(config=config.prometheus,
                                                   step_seconds=config.descheduler.reclaim.learned_window.step_seconds)
            learner: idle_history.Learner | None = None  # one across the cycles (`--learned`)
            pid = history.server.process.pid
            kept = measurement.Parts()  # one part cache across cycles; a fresh loop each cycle, so that dry-run
            # cooldowns do not shrink the next cycle's work
            cold: list[dict[str, Any]] = []
            warm: list[dict[str, Any]] = []
            results = []
            try:
                while len(warm) < cycles:
                    timed.seconds = []
                    timed.fail_ranges = fail_first_cycle and not cold
                    started, used, asked = _perf(), time.process_time(), dcgm_history.cpu_seconds(pid)
                    loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(built),
                                                    prometheus=timed, evictions=evictor.DryRunClient(), api=None,
                                                    clock=lambda: now,
                                                    gang_demands=cmd_descheduler.gang_demands(config))
                    loop.parts = kept
                    learner = learner or loop.learner
                    loop.learner = learner
                    timed.history_seconds = []

                    async def cycle(loop: reclaim_loop.ReclaimLoop = loop) -> tuple[reclaim_loop.Cycle, list[float]]:
                        done = await loop.cycle()
                        split = [_perf(), time.process_time(), dcgm_history.cpu_seconds(pid)]
                        await loop.learner.settle()  # the refresh it started: beside the next cycle in the process
                        return done, split

                    profiler = cProfile.Profile() if profile is not None and len(warm) == cycles - 1 else None
                    if profiler is not None:
                        profiler.enable()
                    result, (ended, used_until, asked_until) = asyncio.run(cycle())
                    if profiler is not None and profile is not None:
                        profiler.disable()
                        profiler.dump_stats(profile)
                    row: dict[str, Any] = {
                        "wall": ended - started, "descheduler_cpu": used_until - used,
                        "prometheus_cpu": asked_until - asked, "queries": result.queries,
                        "refresh": _perf() - ended if timed.history_seconds else None,
                        "refresh_cpu": time.process_time() - used_until,
                        "history_query": timed.history_seconds[0] if timed.history_seconds else None,
                        "learned_windows": sum("learned idle window" in s.reason for s in result.plan.spared)
                        + sum("learned idle window" in e.reason for e in result.plan.evictions),
                        "parts_read": sum(loop.parts.read), "query_seconds": list(timed.seconds),
                        "served": sum(1 for d in result.plan.demands if d.served),
                        "phases": dict(result.seconds), "candidates": result.plan.candidates,
                        "errors": len(result.prometheus_errors), "spared": reasons(result.plan),
                        "store_past_history_now": clock.now - history.now}
                    print(f"  cycle {len(cold) + len(warm) + 1}: store time history+{clock.now - history.now:.0f}s, "
                          f"{row['parts_read']} parts read, {row['errors']} failed queries, {row['candidates']} "
                          f"candidates, {row['served']} served, wall {row['wall']:.2f}s"
                          + (f", history refresh after it {row['refresh']:.2f}s, {row['learned_windows']} learned "
                             f"windows" if learned and row["refresh"] is not None else
                             f", {row['learned_windows']} learned windows" if learned else "")
                          + f"; spared: {row['spared']}", flush=True)
                    # Cold until a cycle reads no more parts than the steady state does (the newest settled
                    # part, one still short of samples), none of its queries failed (a failed read reads no
                    # part: not a warm cache) and it serves demands again.
                    steady = row["parts_read"] <= 2 and not row["errors"] and row["served"]
                    (warm if warm or (cold and steady) else cold).append(row)
                    if warm:
                        results.append(result)
                    clock.now += CYCLE_SECONDS
                    if len(cold) > 20:
                        raise RuntimeError("the part cache never warmed up in 20 cycles")
                arms = asyncio.run(recheck_arms(client, config.prometheus, results[-1].plan.evictions))
                for shape, arm in arms.items():
                    print(f"  re-check, {shape} ({arm['demands']} demands, {arm['victims']} victims): one query per "
                          f"victim {arm['one_query_per_victim_seconds']} s, one per demand "
                          f"{arm['one_query_per_demand_seconds']} s", flush=True)
            finally:
                client.close()
            plain = asyncio.run(_plain(history.server.url, pid, windows))
            prometheus_rss = dcgm_history.rss_mb(history.server.process.pid, peak=True)
            backfill = {"samples": history.samples, "openmetrics_mb": round(history.openmetrics_bytes / 1e6),
                        "blocks_mb": round(history.blocks_bytes / 1e6),
                        "seconds": {k: round(v, 1) for k, v in history.seconds.items()}}
    last = results[-1]
    served = [d for d in last.plan.demands if d.served]
    queries: dict[str, list[float]] = {}
    for row in warm:
        for name, seconds in row["query_seconds"]:
            queries.setdefault(name, []).append(seconds)
    return {
        "gpus": len(devices), "gpu_pods": sum(1 for p in built.pods.values() if p.node_name), "pending": pending,
        "scope_matchers": [f'cluster="{cluster_label}"'] if cluster_label else [], "twice_every": twice_every,
        "cycles": cycles, "cycle_seconds_of_store_time": CYCLE_SECONDS,
        "history": {"hours": HOURS, "scrape_seconds": SCRAPE_SECONDS, **backfill},
        # warm cycles (the cache filled): wall, and CPU seconds, what the cycle costs whatever else the machine runs
        "cycle_seconds": _spread([r["wall"] for r in warm]),
        "cycle_cpu_seconds_p50": {"descheduler": round(statistics.median(r["descheduler_cpu"] for r in warm), 3),
                                  "prometheus": round(statistics.median(r["prometheus_cpu"] for r in warm), 3)},
        "cycle_cpu_seconds_max": {"descheduler": round(max(r["descheduler_cpu"] for r in warm), 3),
                                  "prometheus": round(max(r["prometheus_cpu"] for r in warm), 3)},
        "phase_seconds_p50": {k: round(statistics.median(c.seconds.get(k, 0.0) for c in results), 3)
                              for k in results[0].seconds},
        "queries_per_cycle": sorted({r["queries"] for r in warm}),
        "parts_read_per_cycle": sorted({r["parts_read"] for r in warm}),
        "query_seconds": {name: {"p50": round(statistics.median(v), 3), "max": round(max(v), 3)}
                          for name, v in sorted(queries.items())},
        "query_seconds_max": round(max(s for r in warm for _, s in r["query_seconds"]), 3),
        # the cold start (empty cache: a start or a leader change), cycle by cycle
        "cold_cycles": [{"wall": round(r["wall"], 3), "descheduler_cpu": round(r["descheduler_cpu"], 3),
                         "prometheus_cpu": round(r["prometheus_cpu"], 3), "queries": r["queries"],
                         "parts_read": r["parts_read"], "served": r["served"],
                         "query_seconds_max": round(max(s for _, s in r["query_seconds"]), 3)} for r in cold],
        # every cycle, cold then warm: candidates, failed queries, why the other pods were spared
        "cycles_spared": [{k: r[k] for k in ("store_past_history_now", "parts_read", "errors", "candidates", "served",
                                             "spared")} for r in cold + warm],
        "fail_first_cycle": fail_first_cycle,
        # `--learned`: every cycle (cold and warm) whose refresh read history, and the cycles after the look-back
        "learned": {
            "refresh_seconds": _spread([r["refresh"] for r in cold + warm if r["refresh"] is not None]),
            "refresh_descheduler_cpu_seconds": _spread([r["refresh_cpu"] for r in cold + warm
                                                        if r["refresh"] is not None]),
            "history_query_seconds": _spread([r["history_query"] for r in cold + warm
                                              if r["history_query"] is not None]),
            "history_reads": sum(r["refresh"] is not None for r in cold + warm),
            "cycle_seconds_with_a_refresh_after": _spread([r["wall"] for r in cold + warm
                                                           if r["refresh"] is not None]),
            "cycle_seconds_all": _spread([r["wall"] for r in cold + warm]),
            "learned_windows_last_cycle": warm[-1]["learned_windows"],
        } if learned else None,
        "plain_max_over_time_seconds": plain,
        "prometheus_errors": sorted({e for c in results for e in c.prometheus_errors}),
        "candidates": last.plan.candidates, "demands": len(last.plan.demands),
        "demands_served": {"pods": sum(1 for d in served if not d.demand.startswith(reclaim.GANG)),
                           "gangs": sum(1 for d in served if d.demand.startswith(reclaim.GANG))},
        "evictions_planned": len(last.plan.evictions),
        # The re-checks right before the evictions (one query per demand, in the act phase): their wall time
        # summed per warm cycle, against the rest of that cycle's wall time (what they add to it, at most: the
        # victims of one demand are re-checked in one query).
        "recheck": {
            "per_cycle": sorted({sum(n == RECHECK for n, _ in r["query_seconds"]) for r in warm}),
            "seconds_per_cycle": _spread([sum(s for n, s in r["query_seconds"] if n == RECHECK) for r in warm]),
            "share_of_the_rest_of_the_cycle": _spread([
                sum(s for n, s in r["query_seconds"] if n == RECHECK)
                / (r["wall"] - sum(s for n, s in r["query_seconds"] if n == RECHECK)) for r in warm]),
        },
        # The same re-checks both ways on the same store after the warm cycles (`recheck_arms`): wall seconds.
        "recheck_arms": arms,
        "peak_rss_mb": {"descheduler": round(_peak_rss_mb(), 1), "prometheus": round(prometheus_rss, 1)},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=10, help="warm cycles measured, after the cold ones")
    parser.add_argument("--fail-first-cycle", action="store_true",
                        help="fail every range query of the first cycle (a timeout): the cold start after it")
    parser.add_argument("--learned", action="store_true",
                        help="the normal tier learns its idle windows (4 h look-back, one 30-min read a cycle)")
    parser.add_argument("--no-cluster-matcher", action="store_true",
                        help="no cluster label on the series and no prometheus.scope_matchers (default: cluster=\"a\")")
    parser.add_argument("--twice-every", type=int, default=TWICE_EVERY, metavar="N",
                        help="one GPU in N also scraped by a second path without the gpu label (0: none)")
    parser.add_argument("--profile", type=pathlib.Path, metavar="FILE",
                        help="run the last warm cycle under cProfile and dump its stats to FILE (slower: its wall "
                        "time then says little)")
    parser.add_argument("--quick", action="store_true", help="CI-sized: 200 GPUs, 3 warm cycles")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.cycles = 200, 3
    found = run(args.gpus, pending=args.pending, cycles=args.cycles, fail_first_cycle=args.fail_first_cycle,
                learned=args.learned, cluster_label=None if args.no_cluster_matcher else CLUSTER,
                twice_every=args.twice_every, profile=args.profile)
    args.out.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
