"""Idle-reclaim cycle: against a real Prometheus (the measurement), or a stand-in (the planner alone).

    python benchmarks/reclaim_cycle.py --prometheus [--quick] [--gpus 1000 ...] [--no-cluster-matcher]
                                       [--twice-every 10]             # real Prometheus, 1,000-10,000 GPUs
    python benchmarks/reclaim_cycle.py [--nodes 1000] [--pods 10000] [--pending 50] [--cycles 5]
                                       [--quick] [--scale] [--gc-freeze] [--out FILE]   # planner stand-in

`--prometheus`: for 1,000, 5,000 and 10,000 GPUs (`--quick`: 200; `--gpus`: the sizes given), each in its own
process, as a shared store by default (every series labelled `cluster="a"`, the descheduler's
`prometheus.scope_matchers` set to it, `--no-cluster-matcher`: neither; one GPU in ten, `--twice-every`, also
scraped by a second path without the `gpu` label),
benchmarks/reclaim_prometheus.py backfills 4 h of 15 s DCGM history into a real Prometheus with promtool
and runs dry-run cycles of one `ReclaimLoop` against it with the chart's tiers (3 h and 10 min windows), its
store time advancing 60 s a cycle: the cold cycles (empty part cache) apart, then the warm ones: every query's
wall time, the cycle's, CPU seconds of each side, peak RSS, demands served by kind; then a line of the slowest
query and of the cycle against GPUs. Goals at 10,000 GPUs: every query < 1 s, cycle < 2 s, descheduler < 500 MB.

Without it, Prometheus is a STAND-IN (FakePrometheus: it answers the same queries from the pod list, at
no cost of its own) and what is measured is the planner and the cycle around it: a full cluster (every
GPU taken, so each pending pod needs victims) of 8-GPU nodes with two NVLink domains of 4 holding pods of
1, 1, 2 and 4 GPUs, plus as many MIG nodes (28x 1g.10gb + 8x 3g.40gb) as it takes to place `--pods`
pods. Pods belong to four PriorityClasses (three idle windows, one not reclaimable), some to ReplicaSets
and gangs; about a third are idle. Pending: `--pending` pods of 1-8 GPUs or one MIG slice at mixed
priorities, plus two gated gangs waiting for GPUs. Two scenarios, in dry-run: the default settings (the
per-cycle limit soon ends the search) and limits wide enough that every pending pod is searched for. The
snapshot is built once (the feeder keeps it up to date between cycles; its build time is reported apart);
every cycle runs on a fresh `ReclaimLoop` so that dry-run cooldowns do not shrink the next cycle's work,
sharing one utilisation part cache (warm after the warm-up cycle). Reported: whole cycle wall time (p50,
max) and CPU time (p50), the planner alone (CPU), each phase's median, peak RSS of the process (raw objects
and snapshot included), queries per cycle, demands served, evictions planned. `--scale` runs sizes up to
5,000 nodes / 50,000 pods, each in its own process (so each has its own peak RSS), and fits cycle CPU time
against pods. Times are printed, never asserted; the machine may be shared, so the load average is recorded
beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after site-packages: an installed gpu-steward wins; a bare checkout works too

from benchmarks import reclaim_prometheus  # noqa: E402
from common import prometheus, settings, settings_loader, snapshot, snapshot_build, source  # noqa: E402
from descheduler import evictor, policy, reclaim  # noqa: E402
from descheduler.reclaim import loop as reclaim_loop  # noqa: E402
from descheduler.reclaim import measurement, utilisation_promql  # noqa: E402
from gpu_steward import cmd_descheduler  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve()
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "reclaim_cycle.json"
DEFAULT_PROMETHEUS_OUT = ROOT / "benchmarks" / "results" / "reclaim_cycle_prometheus.json"
PREFIX = policy.PREFIX
NOW = 1_800_000_000.0
SCRAPE_SECONDS = 60.0  # the stand-in's DCGM scrape interval
STARTED = "2027-01-13T00:00:00Z"  # two days before NOW: past every toleration and window
GOALS = {"cycle_seconds": 2.0, "peak_rss_mb": 300.0}
SCALE = ((1000, 10000), (2000, 20000), (3000, 30000), (5000, 50000))
QUICK_SCALE = ((50, 500), (100, 1000), (200, 2000))
FULL_NODE_PODS = (1, 1, 2, 4)  # GPUs of the pods on an 8-GPU node (two NVLink domains of 4)
MIG_SLICES = {"1g.10gb": 28, "3g.40gb": 8}  # one pod per slice
# PriorityClass: value, annotations; pods cycle through `CLASS_MIX`.
CLASSES: dict[str, tuple[int, dict[str, str]]] = {
    "batch": (1000, {f"{PREFIX}resource-idle-seconds": "3600", f"{PREFIX}resource-idle-usage-threshold": "10"}),
    "notebook": (500, {f"{PREFIX}gpu-idle-seconds": "1800", f"{PREFIX}gpu-idle-usage-threshold": "5",
                       f"{PREFIX}minimum-preemptable-priority": "600"}),
    "scavenger": (100, {f"{PREFIX}resource-idle-seconds": "900", f"{PREFIX}minimum-preemptable-priority": "0"}),
    "inference": (100000, {}),
}
# Seven long: prime to the 4 pods of a full node and the 36 of a MIG node, so every size gets every class.
CLASS_MIX = ("batch", "batch", "notebook", "inference", "batch", "scavenger", "notebook")
PENDING = ((1, None, 10000), (2, None, 10000), (0, "1g.10gb", 4000), (4, None, 10000), (1, None, 600),
           (8, None, 10000), (0, "3g.40gb", 10000), (2, None, 4000))  # (GPUs, MIG profile, priority), cycled


# --- the synthetic cluster ------------------------------------------------------------------------


def _node(name: str, allocatable: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, *, namespace: str, limits: dict[str, str], node: str | None, priority: int,
         class_name: str | None, created: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
                            "priority": priority}
    if class_name:
        spec["priorityClassName"] = class_name
    status: dict[str, Any] = {"phase": "Pending"}
    if node:
        spec["nodeName"] = node
        status = {"phase": "Running", "startTime": created,
                  "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": created}]}
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec, "status": status,
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "creationTimestamp": created, "labels": labels or {}}}


def synthetic_cluster(*, nodes: int, pods: int, pending: int) -> dict[str, list[dict[str, Any]]]:
    full_pods = len(FULL_NODE_PODS)
    mig_pods = sum(MIG_SLICES.values())
    mig_nodes = min(nodes, max(0, math.ceil((pods - full_pods * nodes) / (mig_pods - full_pods))))
    raw_nodes: list[dict[str, Any]] = []
    slots: list[tuple[str, dict[str, str]]] = []  # (node, limits) of every device set a pod may hold
    topology = json.dumps([[0, 1, 2, 3], [4, 5, 6, 7]])
    for n in range(nodes):
        name = f"gpu-{n:05d}"
        if n < nodes - mig_nodes:
            raw_nodes.append(_node(name, {"nvidia.com/gpu": "8"}, {"gpu-steward.io/nvlink-topology": topology}))
            slots += [(name, {"nvidia.com/gpu": str(g)}) for g in FULL_NODE_PODS]
        else:
            raw_nodes.append(_node(name, {f"nvidia.com/mig-{p}": str(c) for p, c in MIG_SLICES.items()}, {}))
            slots += [(name, {f"nvidia.com/mig-{p}": "1"}) for p, c in MIG_SLICES.items() for _ in range(c)]
    running = []
    for i, (node, limits) in enumerate(slots[:pods]):
        class_name = CLASS_MIX[i % len(CLASS_MIX)]
        labels = {"gpu-steward.io/gang-name": f"job-{i // 400}", "gpu-steward.io/gang-size": "4"} \
            if i % 400 < 4 else {}
        body = _pod(f"p-{i:06d}", namespace=f"team-{i % 50}", limits=limits, node=node,
                    priority=CLASSES[class_name][0], class_name=class_name, created=STARTED, labels=labels)
        # Half in ReplicaSets of ten, half Jobs of their own (bare pods are never evicted by default).
        owner = ("ReplicaSet", f"rs-{i // 10}") if i % 2 else ("Job", f"job-{i}")
        body["metadata"]["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
        running.append(body)
    waiting = []
    for i in range(pending):
        gpus, profile, priority = PENDING[i % len(PENDING)]
        limits = {f"nvidia.com/mig-{profile}": "1"} if profile else {"nvidia.com/gpu": str(gpus)}
        body = _pod(f"w-{i:04d}", namespace="team-b", limits=limits, node=None, priority=priority, class_name=None,
                    created=f"2027-01-14T23:{i // 60 % 60:02d}:{i % 60:02d}Z")
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        waiting.append(body)
    for g in range(2):  # complete gated gangs that wait only for GPUs
        for m in range(4):
            body = _pod(f"gang-{g}-{m}", namespace="team-g", limits={"nvidia.com/gpu": "2"}, node=None,
                        priority=10000, class_name=None, created="2027-01-14T22:00:00Z",
                        labels={"gpu-steward.io/gang-name": f"g{g}", "gpu-steward.io/gang-size": "4"})
            body["spec"]["schedulingGates"] = [{"name": "gpu-steward.io/gang"}]
            waiting.append(body)
    classes = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": value,
                "metadata": {"name": name, "annotations": notes}} for name, (value, notes) in CLASSES.items()]
    return {"nodes": raw_nodes, "pods": running + waiting, "priority_classes": classes}


class FakePrometheus:
    """A stand-in for the planner alone (the real Prometheus: `--prometheus`, benchmarks/reclaim_prometheus.py).
    Answers the reclaim queries (descheduler.reclaim.utilisation_promql) as Prometheus would for every pod with
    DCGM series: per device, for the live stretch (instant) and each part (range, one step per part) its
    samples, peak and last sample, scraped every `interval_seconds` up to NOW; a third idle, and a few with
    half the samples in every kept part (not idle for want of coverage). Answers are built once per query and
    decoded per query, as the HTTP client does (that cost and memory are the cycle's)."""

    def __init__(self, pods: Sequence[dict[str, Any]], *, interval_seconds: float) -> None:
        self.queries = 0
        self._interval = interval_seconds
        self._pods = [p for p in pods if p["spec"].get("nodeName")]
        self._bodies: dict[tuple[str, tuple[float, ...]], str] = {}  # (promql, steps) -> the HTTP body

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        return prometheus.Answer(self._answer(promql, (NOW if time is None else time,), ranged=False))

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        steps = tuple(start + k * step for k in range(round((end - start) / step) + 1))
        return self._answer(promql, steps, ranged=True)

    def _answer(self, promql: str, steps: tuple[float, ...], *, ranged: bool) -> list[dict[str, Any]]:
        self.queries += 1
        key = (promql, steps)
        if key not in self._bodies:  # built once: the stand-in's own work is not ours to measure
            self._bodies[key] = self._body(promql, steps, ranged=ranged)
        # Decoded per query, as the HTTP client does (that cost and memory are the cycle's).
        return list(json.loads(self._bodies[key])["data"]["result"])

    def _body(self, promql: str, steps: tuple[float, ...], *, ranged: bool) -> str:
        if promql == "vector(time())":
            rows = [{"metric": {}, "value": [NOW, repr(NOW)]}]
            return json.dumps({"status": "success", "data": {"resultType": "vector", "result": rows}})
        named = {name.replace("\\\\", "")  # one name, or several in one regex of escaped names (`newest`)
                 for names in re.findall(r'[{,]pod=~?"([^"]+)"', promql) for name in names.split("|")} \
            if utilisation_promql.RECHECK in promql else None
        mig = "GR_ENGINE_ACTIVE" in promql and named is None
        span = re.search(r"\[(\d+)(ms|s)\]", promql)
        seconds = (int(span.group(1)) / (1000 if span.group(2) == "ms" else 1)) if span else 0.0
        rows = []
        if named is not None:  # the re-check right before an eviction: the store's time, each device's newest sample
            rows.append({"metric": {utilisation_promql.RECHECK: "now"}, "value": [steps[0], repr(steps[0])]})
        for i, pod in enumerate(self._pods):
            meta, limits = pod["metadata"], pod["spec"]["containers"][0]["resources"]["limits"]
            if named is not None:
                if meta["name"] in named:
                    rows += self._newest(pod, i, steps[0])
                continue
            if ("nvidia.com/gpu" in limits) == mig:
                continue
            labels = {"namespace": meta["namespace"], "pod": meta["name"], "Hostname": pod["spec"]["nodeName"]}
            for device in range(sum(int(v) for v in limits.values())):
                metric = {**labels, "gpu": str(device), "UUID": f"GPU-{meta['name']}-{device}"}
                values = []
                for at in steps:
                    if "timestamp(" in promql:
                        value = at - 5.0
                    elif "count_over_time(" in promql:
                        gappy = ranged and i % 37 == 0  # its kept parts hold half the samples
                        value = seconds / self._interval * (0.5 if gappy else 1.0)
                    else:
                        value = 1.0 + i % 4 if i % 3 == 0 else 20.0 + i % 70  # a third idle
                    values.append([at, repr(value)])
                rows.append({"metric": metric, "values": values} if ranged
                            else {"metric": metric, "value": values[0]})
        kind = "matrix" if ranged else "vector"
        return json.dumps({"status": "success", "data": {"resultType": kind, "result": rows}})

    @staticmethod
    def _newest(pod: dict[str, Any], i: int, at: float) -> list[dict[str, Any]]:
        """One pod's rows of the answer to `utilisation_promql.newest`: as idle (or busy) as its window."""
        meta, limits = pod["metadata"], pod["spec"]["containers"][0]["resources"]["limits"]
        kind = "gpu" if "nvidia.com/gpu" in limits else "mig"
        labels = {"namespace": meta["namespace"], "pod": meta["name"], "Hostname": pod["spec"]["nodeName"]}
        rows: list[dict[str, Any]] = []
        for device in range(sum(int(v) for v in limits.values())):
            metric: dict[str, Any] = {**labels, "gpu": str(device), "UUID": f"GPU-{meta['name']}-{device}"}
            value = 1.0 + i % 4 if i % 3 == 0 else 20.0 + i % 70
            rows += [{"metric": {**metric, utilisation_promql.RECHECK: f"{kind}_value"}, "value": [at, repr(value)]},
                     {"metric": {**metric, utilisation_promql.RECHECK: f"{kind}_last"}, "value": [at, repr(at - 5.0)]}]
        return rows


# --- measuring ------------------------------------------------------------------------------------


def _rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# Settings overrides of each scenario: the defaults (a per-cycle limit soon stops the search), and
# limits so wide that every pending pod is searched for and served if it can be (the planner's worst).
SCENARIOS: dict[str, dict[str, Any]] = {
    "default limits": {},
    "no limits": {"limits": {"per_cycle": 1_000_000, "per_node": 64, "per_namespace": 1_000_000}},
}


def run_size(*, nodes: int, pods: int, pending: int, cycles: int, freeze: bool = False) -> dict[str, Any]:
    load_before = os.getloadavg()
    rss_start = _rss_mb()
    raw = synthetic_cluster(nodes=nodes, pods=pods, pending=pending)
    names = settings_loader.load().names
    started = time.perf_counter()
    cluster = snapshot_build.build(nodes=raw["nodes"], pods=raw["pods"], priority_classes=raw["priority_classes"],
                                   names=names, taken_at=NOW)
    build_seconds = time.perf_counter() - started
    rss_built = _rss_mb()
    if freeze:
        gc.freeze()  # what a long-running process may do once synced: the collector skips these objects
    stand_in = FakePrometheus(raw["pods"], interval_seconds=SCRAPE_SECONDS)
    scenarios = {}
    for scenario, reclaim_settings in SCENARIOS.items():
        config = settings_loader.load(overrides={"descheduler": {"reclaim": {"dry_run": True, **reclaim_settings}}})
        scenarios[scenario] = _scenario(cluster, stand_in, config=config, cycles=cycles)
    return {
        "nodes": nodes, "gpu_pods": sum(1 for p in cluster.pods.values() if p.node_name), "pending": pending,
        "cycles": cycles, "gc_freeze": freeze, "scenarios": scenarios,
        "snapshot_build_seconds": round(build_seconds, 3),
        "rss_mb": {"start": round(rss_start, 1), "after_snapshot": round(rss_built, 1), "end": round(_rss_mb(), 1),
                   "peak": round(_peak_rss_mb(), 1)},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }


def _scenario(cluster: snapshot.Snapshot, stand_in: FakePrometheus, *, config: settings.Settings,
              cycles: int) -> dict[str, Any]:
    """`cycles` measured cycles after one to warm up (the stand-in builds its answers then)."""
    results: list[reclaim_loop.Cycle] = []
    wall: list[float] = []
    cpu: list[float] = []
    queries: list[int] = []
    inputs: dict[str, Any] = {}
    kept = measurement.Parts()  # the utilisation parts, warm after the first cycle (the stand-in's time stands)
    with _capturing(reclaim, "plan", inputs):  # the planner's inputs, to time it alone below
        for _ in range(cycles + 1):
            loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(cluster), prometheus=stand_in,
                                            evictions=evictor.DryRunClient(), api=None, clock=lambda: NOW,
                                            gang_demands=cmd_descheduler.gang_demands(config))
            loop.parts = kept
            before, started, used = stand_in.queries, time.perf_counter(), time.process_time()
            results.append(asyncio.run(loop.cycle()))
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - used)
            queries.append(stand_in.queries - before)
    del results[0], wall[0], cpu[0], queries[0]
    planner = []  # CPU time: the planner does no I/O, and a shared machine's wall clock counts the neighbours
    for _ in range(cycles):
        used = time.process_time()
        alone = reclaim.plan(**inputs)
        planner.append(time.process_time() - used)
    plans = {json.dumps(p.as_json(), sort_keys=True) for p in [alone, *(c.plan for c in results)]}
    last = results[-1].plan
    return {
        "cycle_seconds": _spread(wall), "cycle_cpu_seconds": _spread(cpu), "planner_cpu_seconds": _spread(planner),
        "phase_seconds_p50": {k: round(statistics.median(c.seconds.get(k, 0.0) for c in results), 4)
                              for k in results[0].seconds},
        "promql_queries_per_cycle": sorted(set(queries)),
        "candidates": last.candidates, "idle_gpus": last.idle_gpus,
        "demands": len(last.demands), "demands_served": sum(d.served for d in last.demands),
        "evictions_planned": len(last.evictions), "same_plan_every_cycle": len(plans) == 1,
    }


@contextlib.contextmanager
def _capturing(module: Any, name: str, into: dict[str, Any]) -> Iterator[None]:
    """Wrap `module.name` so that its last call's keyword arguments land in `into`."""
    original = getattr(module, name)

    def wrapper(**kwargs: Any) -> Any:
        into.update(kwargs)
        return original(**kwargs)

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 4), "max": round(max(values), 4), "min": round(min(values), 4)}


def scale(sizes: Sequence[tuple[int, int]], *, pending: int, cycles: int, freeze: bool) -> dict[str, Any]:
    """Each size in its own process (own peak RSS); per scenario, a least-squares line of the cycle's
    CPU time (p50; wall time on a shared machine measures the neighbours too) against pods, its r2, and
    the log-log slope (1: linear, 2: quadratic)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for nodes, pods in sizes:
            out = pathlib.Path(tmp) / f"{nodes}.json"
            subprocess.run([sys.executable, str(SCRIPT), "--nodes", str(nodes), "--pods", str(pods), "--pending",
                            str(pending), "--cycles", str(cycles), "--out", str(out), "--quiet",
                            *(["--gc-freeze"] if freeze else [])], check=True)
            rows.append(json.loads(out.read_text())["run"])
    xs = [float(r["gpu_pods"]) for r in rows]
    fits = {}
    for scenario in SCENARIOS:
        ys = [r["scenarios"][scenario]["cycle_cpu_seconds"]["p50"] for r in rows]
        line = statistics.linear_regression(xs, ys)
        mean = statistics.fmean(ys)
        total = sum((y - mean) ** 2 for y in ys)
        residual = sum((y - line.slope * x - line.intercept) ** 2 for x, y in zip(xs, ys, strict=True))
        r2 = 1 - residual / total if total else 1.0
        exponent = statistics.linear_regression([math.log(x) for x in xs], [math.log(y) for y in ys]).slope
        fits[scenario] = {"seconds_per_1000_pods": round(line.slope * 1000, 4),
                          "intercept_seconds": round(line.intercept, 4), "r2": round(r2, 4),
                          "loglog_exponent": round(exponent, 3), "growth": _growth(exponent)}
    return {"sizes": rows, "fits": fits}


def table(run: dict[str, Any]) -> str:
    rss = run["rss_mb"]
    lines = [
        f"reclaim cycle: {run['nodes']} nodes, {run['gpu_pods']} GPU pods, {run['pending']} pending pods + 2 gangs "
        f"of 4; {run['cycles']} cycles each{'; gc.freeze() after the snapshot build' if run['gc_freeze'] else ''}",
        f"  {'scenario':<15} {'cycle p50':>9} {'max':>7} {'cpu p50':>8} {'planner':>8} {'queries':>7} "
        f"{'served':>7} {'evictions':>9}  phases p50 (ms)",
    ]
    for name, s in run["scenarios"].items():
        phases = " ".join(f"{k} {v * 1000:.0f}" for k, v in s["phase_seconds_p50"].items() if k != "policies")
        lines.append(
            f"  {name:<15} {s['cycle_seconds']['p50'] * 1000:>7.0f}ms {s['cycle_seconds']['max'] * 1000:>5.0f}ms "
            f"{s['cycle_cpu_seconds']['p50'] * 1000:>6.0f}ms {s['planner_cpu_seconds']['p50'] * 1000:>6.0f}ms "
            f"{','.join(map(str, s['promql_queries_per_cycle'])):>7} {s['demands_served']:>3}/{s['demands']:<3} "
            f"{s['evictions_planned']:>9}  {phases}"
            + ("" if s["same_plan_every_cycle"] else "  (plans differ between cycles!)"))
    lines += [
        f"  goals: cycle < {GOALS['cycle_seconds'] * 1000:.0f} ms, peak RSS < {GOALS['peak_rss_mb']:.0f} MB, "
        f"queries constant (the live stretch's; the parts are kept)",
        f"  peak RSS {rss['peak']:.0f} MB (at start {rss['start']:.0f}, after the snapshot "
        f"{rss['after_snapshot']:.0f}); snapshot build {run['snapshot_build_seconds'] * 1000:.0f} ms "
        "(the feeder's, not the cycle's)",
        f"  candidates (idle and reclaimable) {next(iter(run['scenarios'].values()))['candidates']}; load average "
        f"before {run['load_average']['before']}, after {run['load_average']['after']} (2 cores, shared)",
    ]
    return "\n".join(lines)


def _growth(exponent: float) -> str:
    """In words, how time grows with size, from the log-log slope."""
    if exponent > 1.2:
        return "superlinear"
    return "linear" if exponent >= 0.8 else "sublinear (fixed costs weigh, or noise)"


def scale_table(result: dict[str, Any]) -> str:
    lines = ["scaling (each size in its own process): cycle CPU p50 / planner p50 per scenario, peak RSS",
             f"  {'nodes':>6} {'GPU pods':>9} " + " ".join(f"{name:>22}" for name in SCENARIOS) + f" {'peak RSS':>9}"]
    for r in result["sizes"]:
        cells = " ".join(f"{s['cycle_cpu_seconds']['p50'] * 1000:>10.0f}ms /"
                         f"{s['planner_cpu_seconds']['p50'] * 1000:>7.0f}ms" for s in r["scenarios"].values())
        lines.append(f"  {r['nodes']:>6} {r['gpu_pods']:>9} {cells} {r['rss_mb']['peak']:>7.0f}MB")
    for name, fit in result["fits"].items():
        lines.append(f"  {name}: CPU {fit['seconds_per_1000_pods'] * 1000:.1f} ms per 1,000 pods + "
                     f"{fit['intercept_seconds'] * 1000:.0f} ms, r2 {fit['r2']}, log-log exponent "
                     f"{fit['loglog_exponent']} -> {fit['growth']}")
    return "\n".join(lines)


PROMETHEUS_SIZES = (1000, 5000, 10000)
QUICK_PROMETHEUS_SIZES = (200,)


def real_prometheus(sizes: Sequence[int], *, pending: int, cycles: int, cluster_matcher: bool = True,
                    twice_every: int = reclaim_prometheus.TWICE_EVERY) -> dict[str, Any]:
    """Each size in its own process (benchmarks/reclaim_prometheus.py: backfill, real Prometheus, cycles),
    then least-squares lines of the slowest query and of the cycle's wall time against GPUs."""
    rows = []
    shape = ["--twice-every", str(twice_every)] + ([] if cluster_matcher else ["--no-cluster-matcher"])
    with tempfile.TemporaryDirectory() as tmp:
        for gpus in sizes:
            out = pathlib.Path(tmp) / f"{gpus}.json"
            print(f"real Prometheus, {gpus} GPUs:", flush=True)
            subprocess.run([sys.executable, str(SCRIPT.parent / "reclaim_prometheus.py"), "--gpus", str(gpus),
                            "--pending", str(pending), "--cycles", str(cycles), "--out", str(out), *shape],
                           check=True)
            rows.append(json.loads(out.read_text()))
    fits = {}
    if len(rows) > 1:
        xs = [float(r["gpus"]) for r in rows]
        for name, ys in (("query_max", [r["query_seconds_max"] for r in rows]),
                         ("cycle_p50", [r["cycle_seconds"]["p50"] for r in rows])):
            line = statistics.linear_regression(xs, ys)
            exponent = statistics.linear_regression([math.log(x) for x in xs], [math.log(y) for y in ys]).slope
            fits[name] = {"seconds_per_1000_gpus": round(line.slope * 1000, 4),
                          "intercept_seconds": round(line.intercept, 4), "loglog_exponent": round(exponent, 3),
                          "growth": _growth(exponent)}
    return {"sizes": rows, "fits": fits}


def prometheus_table(result: dict[str, Any]) -> str:
    goals = reclaim_prometheus.GOALS
    first = result["sizes"][0] if result["sizes"] else {}
    lines = ["reclaim cycle against a real Prometheus (4 h of 15 s DCGM history, the chart's tiers, dry-run; store "
             "time advancing 60 s a cycle; scope matchers "
             f"{first.get('scope_matchers') or 'none'}, one GPU in {first.get('twice_every') or 'no'} scraped "
             "twice):",
             "  warm cycles (the part cache filled):",
             f"  {'GPUs':>6} {'slowest query':>13} {'plain max 3h':>12} {'cycle p50':>9} {'max':>6} {'measure':>8} "
             f"{'CPU: ours':>9} {'Prometheus':>10} {'(max)':>6} {'plain 3h':>8} "
             f"{'RSS':>6} {'Prom RSS':>8} {'queries':>7} {'served pods/gangs':>17} {'errors':>6}"]
    for r in result["sizes"]:
        plain = r["plain_max_over_time_seconds"].get("10800s", {})
        lines.append(
            f"  {r['gpus']:>6} {r['query_seconds_max']:>12.2f}s {plain.get('wall', 0):>11.2f}s "
            f"{r['cycle_seconds']['p50']:>8.2f}s {r['cycle_seconds']['max']:>5.2f}s "
            f"{r['phase_seconds_p50'].get('measure', 0):>7.2f}s "
            f"{r['cycle_cpu_seconds_p50']['descheduler']:>8.2f}s {r['cycle_cpu_seconds_p50']['prometheus']:>9.2f}s "
            f"{r['cycle_cpu_seconds_max']['prometheus']:>5.2f}s {plain.get('prometheus_cpu', 0):>7.2f}s "
            f"{r['peak_rss_mb']['descheduler']:>4.0f}MB {r['peak_rss_mb']['prometheus']:>6.0f}MB "
            f"{','.join(map(str, r['queries_per_cycle'])):>7} "
            f"{r['demands_served']['pods']:>11}/{r['demands_served']['gangs']:<5} {len(r['prometheus_errors']):>6}")
    lines.append("  cold start (empty part cache: a start or a leader change), cycle by cycle: wall / CPU ours / "
                 "CPU Prometheus / slowest query / parts read / demands served")
    for r in result["sizes"]:
        cells = "; ".join(f"{c['wall']:.2f}/{c['descheduler_cpu']:.2f}/{c['prometheus_cpu']:.2f}/"
                          f"{c['query_seconds_max']:.2f}s {c['parts_read']}p {c['served']}"
                          for c in r["cold_cycles"])
        lines.append(f"  {r['gpus']:>6}  {cells}")
    for name, fit in result["fits"].items():
        lines.append(f"  {name}: {fit['seconds_per_1000_gpus']:.3f} s per 1,000 GPUs + "
                     f"{fit['intercept_seconds']:.2f} s, log-log exponent {fit['loglog_exponent']} -> {fit['growth']}")
    lines.append(f"  goals at 10,000 GPUs: every query < {goals['query_seconds']:g} s, cycle < "
                 f"{goals['cycle_seconds']:g} s, descheduler < {goals['peak_rss_mb']:g} MB; load average "
                 + ", ".join(f"{r['load_average']['before'][0]}-{r['load_average']['after'][0]}"
                             for r in result["sizes"]) + " (2 cores, shared)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000, help="GPU pods running")
    parser.add_argument("--pending", type=int, default=50, help="pending GPU pods (preemptors)")
    parser.add_argument("--cycles", type=int, default=5, help="cycles measured (and planner repeats)")
    parser.add_argument("--quick", action="store_true", help="CI-sized: 100 nodes, 1,000 pods, 10 pending, 3 cycles")
    parser.add_argument("--scale", action="store_true", help="also run 1,000/10,000 .. 5,000/50,000 and fit a line")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() once the snapshot is built")
    parser.add_argument("--prometheus", action="store_true",
                        help="against a real Prometheus at 1,000 / 5,000 / 10,000 GPUs (--quick: 200) instead of "
                        "the planner stand-in")
    parser.add_argument("--gpus", type=int, nargs="+", help="with --prometheus: the sizes (GPUs) to run")
    parser.add_argument("--no-cluster-matcher", action="store_true",
                        help="with --prometheus: no cluster label on the series, no prometheus.scope_matchers")
    parser.add_argument("--twice-every", type=int, default=reclaim_prometheus.TWICE_EVERY, metavar="N",
                        help="with --prometheus: one GPU in N also scraped by a second path without the gpu label "
                        "(0: none)")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)  # the --scale children
    args = parser.parse_args()
    if args.prometheus:
        sizes = args.gpus or (QUICK_PROMETHEUS_SIZES if args.quick else PROMETHEUS_SIZES)
        real = real_prometheus(sizes, pending=10 if args.quick else 20, cycles=3 if args.quick else 10,
                               cluster_matcher=not args.no_cluster_matcher, twice_every=args.twice_every)
        print(prometheus_table(real))
        out = DEFAULT_PROMETHEUS_OUT if args.out == DEFAULT_OUT else args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"goals": reclaim_prometheus.GOALS, "prometheus": real}, indent=2) + "\n")
        print(f"results: {out}")
        return
    if args.quick:
        args.nodes, args.pods, args.pending, args.cycles = 100, 1000, 10, 3
    result: dict[str, Any] = {"goals": GOALS, "run": run_size(nodes=args.nodes, pods=args.pods, pending=args.pending,
                                                              cycles=args.cycles, freeze=args.gc_freeze)}
    if not args.quiet:
        print(table(result["run"]), flush=True)
    if args.scale:
        result["scale"] = scale(QUICK_SCALE if args.quick else SCALE, pending=args.pending, cycles=args.cycles,
                                freeze=args.gc_freeze)
        print(scale_table(result["scale"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not args.quiet:
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
