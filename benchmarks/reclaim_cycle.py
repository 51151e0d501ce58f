"""One reclaim cycle over 1,000 nodes and 10,000 GPU pods: time, peak memory, PromQL queries.

    python -m benchmarks.reclaim_cycle [--nodes 1000] [--pods 10000] [--pending 200]

Prometheus is replaced by a stand-in returning one DCGM-shaped answer per window (5 statistics per
pod, as the real query does), so the number measures our side: snapshot screening, parsing,
assessment, planning and the dry-run evictor. Goal (issue 3): < 2 s, constant queries, < 300 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from typing import Any

from common import settings, snapshot, source
from descheduler import evictor, reclaim_loop
from tests import builders

P = "reclaim-idle-resource.scheduling.x-k8s.io/"
NOW = 1_800_000_000.0


class Answers:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.rows: list[dict[str, Any]] = []
        self.queries = 0
        for i, pod in enumerate(pods):
            meta = pod["metadata"]
            stats = {"util": 1.0 if i % 3 == 0 else 50.0, "samples": 60.0, "series": 1.0, "valid": 1.0,
                     "last": NOW - 20}
            for stat, value in stats.items():
                self.rows.append({"metric": {"gs_namespace": meta["namespace"], "gs_pod": meta["name"],
                                             "gs_host": pod["spec"]["nodeName"], "gs_stat": f"gpu_{stat}"},
                                  "value": [NOW, str(value)]})

    async def query(self, promql: str, *, time: float | None = None) -> list[dict[str, Any]]:
        self.queries += 1
        return self.rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--pending", type=int, default=200)
    args = parser.parse_args()

    def batch(body: dict[str, Any]) -> None:
        body["spec"].update(priorityClassName="batch" if body["metadata"]["name"].endswith("0") else "hourly",
                            priority=1000)

    def unschedulable(body: dict[str, Any]) -> None:
        body["spec"]["priority"] = 10000
        body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]

    per_node = max(1, args.pods // args.nodes)  # every node full: each demand needs victims
    nodes = [builders.gpu_node(f"node-{n}", gpus=per_node, topology="annotation",
                               domains=[range(per_node // 2), range(per_node // 2, per_node)])
             for n in range(args.nodes)]
    running = [builders.pod(f"p-{i}", namespace=f"ns-{i % 50}", gpus=1, node=f"node-{i % args.nodes}",
                            phase="Running", created="2020-01-01T00:00:00Z", mutate=batch) for i in range(args.pods)]
    waiting = [builders.pod(f"w-{i}", namespace="team-b", gpus=1 + i % 4, mutate=unschedulable)
               for i in range(args.pending)]
    classes = [builders.priority_class("batch", 1000, annotations={f"{P}resource-idle-seconds": "3600"}),
               builders.priority_class("hourly", 1000, annotations={f"{P}gpu-idle-seconds": "1800"})]
    config = settings.load(overrides={"descheduler": {"reclaim": {
        "dry_run": True, "limits": {"per_cycle": 100, "per_node": 4, "per_namespace": 10}}}})
    answers = Answers(running)
    cluster = snapshot.build(nodes=nodes, pods=running + waiting, priority_classes=classes, names=config.names,
                             taken_at=NOW)
    loop = reclaim_loop.ReclaimLoop(config=config, cluster=source.StaticSource(cluster), prometheus=answers,
                                    evictions=evictor.DryRunClient(), api=None, clock=lambda: NOW)
    started = time.perf_counter()
    cycle = asyncio.run(loop.cycle())
    elapsed = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # whole process, KiB on Linux
    print(json.dumps({
        "nodes": args.nodes, "gpu_pods": args.pods, "pending": args.pending,
        "cycle_seconds": round(elapsed, 3), "max_rss_mb": round(peak_mb, 1),
        "promql_queries": answers.queries, "evictions": len(cycle.plan.evictions),
        "candidates": cycle.plan.candidates,
    }))


if __name__ == "__main__":
    main()
