"""One size of the reclaim-cycle benchmark against a real Prometheus (run by benchmarks/reclaim_cycle.py).

    python benchmarks/reclaim_prometheus.py --gpus 10000 [--cycles 3] [--pending 20] [--quick] --out FILE

A cluster of 8-GPU nodes, each holding pods of 1, 1, 2 and 4 GPUs (every GPU taken), in the chart's tiers
(normal: 3 h window, scavenger: 10 min, critical: never reclaimed; charts/gpu-steward/values.yaml), a third
of them idle; pending: `--pending` critical pods of 1-8 GPUs and two gated gangs of 4 x 2 GPUs. Its DCGM
history (one series per GPU, 4 h, every 15 s; benchmarks/dcgm_history.py) is backfilled into a real
Prometheus, then `ReclaimLoop.cycle()` runs in dry-run against it with the real client, after one warm-up
cycle. Reported: each PromQL query's wall time (by statistic and window), the whole cycle's wall time and
its phases, peak RSS of this process (the descheduler's part: snapshot, answers, plan) and of Prometheus,
demands served by kind, evictions planned, and the plain `max_over_time` of each window for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after site-packages: an installed gpu-steward wins; a bare checkout works too

from benchmarks import dcgm_history  # noqa: E402
from common import prometheus, settings, settings_loader, snapshot, source  # noqa: E402
from descheduler import evictor, policy, reclaim, reclaim_loop, utilisation_promql  # noqa: E402

VALUES = ROOT / "charts" / "gpu-steward" / "values.yaml"
SCRAPE_SECONDS, HOURS = 15, 4.0
AHEAD_SECONDS = 1800  # samples past "now": the store's newest stays one scrape old while the benchmark runs
NODE_PODS = ((1, (0,)), (1, (1,)), (2, (2, 3)), (4, (4, 5, 6, 7)))  # (GPUs, indices) of the pods of a node
CLASS_MIX = ("gpu-steward-normal", "gpu-steward-normal", "gpu-steward-scavenger", "gpu-steward-critical",
             "gpu-steward-normal", "gpu-steward-scavenger", "gpu-steward-normal")
PENDING_GPUS = (1, 2, 4, 1, 2, 8)
GOALS = {"query_seconds": 1.0, "cycle_seconds": 2.0, "peak_rss_mb": 500.0}


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
    """The real client, timing each query by what it asks (statistic and window)."""

    def __init__(self, client: prometheus.Client, names: dict[str, str]) -> None:
        self.client = client
        self.names = names  # promql -> "<window>s <kind>_<stat>"
        self.seconds: dict[str, list[float]] = {}

    async def instant(self, promql: str, *, time: float | None = None) -> prometheus.Answer:
        started = _perf()
        try:
            return await self.client.instant(promql, time=time)
        finally:
            self.seconds.setdefault(self.names.get(promql, "store time"), []).append(_perf() - started)


def _perf() -> float:
    return time.perf_counter()


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


def run(gpus: int, *, pending: int, cycles: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="reclaim-prometheus-") as tmp:
        now = time.time()
        raw, devices = cluster(gpus, pending=pending, now=now)
        with dcgm_history.backfilled(pathlib.Path(tmp) / "prometheus", devices, hours=HOURS,
                                     scrape_seconds=SCRAPE_SECONDS, ahead_seconds=AHEAD_SECONDS) as history:
            config = settings_loader.load(overrides={"prometheus": {"url": history.server.url},
                                              "descheduler": {"reclaim": {"dry_run": True}}})
            built = snapshot.build(nodes=raw["nodes"], pods=raw["pods"], priority_classes=raw["priority_classes"],
                                   names=config.names, taken_at=now)
            del raw
            windows = _windows(chart_classes())
            names = {promql: f"{window}s {name}" for window in windows for name, promql in utilisation_promql.queries(
                window, config=config.prometheus, reclaim=config.descheduler.reclaim, kinds={"gpu"}).items()}
            client = prometheus.Client(config.prometheus)
            timed = Timed(client, names)
            results, wall, cpu, prometheus_cpu = [], [], [], []
            pid = history.server.process.pid
            try:
                for _ in range(cycles + 1):
                    loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(built),
                                                    prometheus=timed, evictions=evictor.DryRunClient(), api=None)
                    started, used, asked = _perf(), time.process_time(), dcgm_history.cpu_seconds(pid)
                    results.append(asyncio.run(loop.cycle()))
                    wall.append(_perf() - started)
                    cpu.append(time.process_time() - used)
                    prometheus_cpu.append(dcgm_history.cpu_seconds(pid) - asked)
            finally:
                client.close()
            plain = asyncio.run(_plain(history.server.url, pid, windows))
            prometheus_rss = dcgm_history.rss_mb(history.server.process.pid, peak=True)
            backfill = {"samples": history.samples, "openmetrics_mb": round(history.openmetrics_bytes / 1e6),
                        "blocks_mb": round(history.blocks_bytes / 1e6),
                        "seconds": {k: round(v, 1) for k, v in history.seconds.items()}}
    del results[0], wall[0], cpu[0], prometheus_cpu[0]
    last = results[-1]
    served = [d for d in last.plan.demands if d.served]
    queries = {name: {"p50": round(statistics.median(v), 3), "max": round(max(v), 3)}
               for name, v in sorted(timed.seconds.items())}
    return {
        "gpus": len(devices), "gpu_pods": sum(1 for p in built.pods.values() if p.node_name), "pending": pending,
        "cycles": cycles, "history": {"hours": HOURS, "scrape_seconds": SCRAPE_SECONDS, **backfill},
        "cycle_seconds": {"p50": round(statistics.median(wall), 3), "max": round(max(wall), 3)},
        # CPU: what the cycle costs whatever else the machine runs (wall times count the neighbours too)
        "cycle_cpu_seconds_p50": {"descheduler": round(statistics.median(cpu), 3),
                                  "prometheus": round(statistics.median(prometheus_cpu), 3)},
        "phase_seconds_p50": {k: round(statistics.median(c.seconds.get(k, 0.0) for c in results), 3)
                              for k in results[0].seconds},
        "queries_per_cycle": sorted({c.queries for c in results}), "query_seconds": queries,
        "query_seconds_max": max(v["max"] for v in queries.values()),
        "plain_max_over_time_seconds": plain,
        "prometheus_errors": sorted({e for c in results for e in c.prometheus_errors}),
        "candidates": last.plan.candidates, "demands": len(last.plan.demands),
        "demands_served": {"pods": sum(1 for d in served if not d.demand.startswith(reclaim.GANG)),
                           "gangs": sum(1 for d in served if d.demand.startswith(reclaim.GANG))},
        "evictions_planned": len(last.plan.evictions),
        "peak_rss_mb": {"descheduler": round(_peak_rss_mb(), 1), "prometheus": round(prometheus_rss, 1)},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="CI-sized: 200 GPUs, 2 cycles")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.cycles = 200, 2
    args.out.write_text(json.dumps(run(args.gpus, pending=args.pending, cycles=args.cycles), indent=2) + "\n")


if __name__ == "__main__":
    main()
