"""A stand-in for the NVIDIA device plugin and dcgm-exporter on kwok nodes (demo, e2e tests, benchmarks).

kwok nodes have no device plugin to choose GPU indices and no DCGM to report them. This module
does both with one documented policy, the same for every system compared (default scheduler, bin
packing, gpu-steward), so that only the node choice differs:

* each GPU pod bound to a node gets indices by `common.placement.allocate` (smallest free NVLink
  domain that fits, else the fewest domains), oldest pod first, and keeps them until it ends;
* on a node whose GPUs are DRA devices (`snapshot.Node.dra_gpus`) there is no device plugin to stand in for:
  kube-scheduler's allocator chose the devices, and a pod's indices are its claims' allocation as the model reads
  it (`snapshot.Pod.indices_observed`); a pod whose claim is not seen allocated yet gets none until it is;
* it serves `/metrics` in dcgm-exporter's format: one `DCGM_FI_DEV_GPU_UTIL` series per GPU with
  `gpu`, `UUID`, `device`, `modelName`, `Hostname` and the `pod`/`namespace`/`container` labels
  (empty for a free GPU, as dcgm-exporter does). On DRA nodes too: dcgm-exporter 4.8.4 and later label
  DRA-allocated GPUs with the pod (and `dra_*` labels, left out here: the model reads DRA allocations from the
  claims, never from these series).

A pod's simulated utilisation (percent) is read from its annotation
`gpu-steward.io/simulated-gpu-util`: one number for all its GPUs or a comma-separated list, one
per GPU (default `DEFAULT_UTILISATION`). Change the annotation to make a pod go idle or busy.
"""

from __future__ import annotations

import asyncio
import dataclasses

from aiohttp import web

from common import placement, snapshot, source
from gpu_steward_lab import localcluster

UTILISATION_ANNOTATION = "gpu-steward.io/simulated-gpu-util"
DEFAULT_UTILISATION = 60.0
METRIC = "DCGM_FI_DEV_GPU_UTIL"


@dataclasses.dataclass
class Assignments:
    """Stable GPU-index assignment per node: node -> pod key -> indices. Pure state, no I/O."""

    by_node: dict[str, dict[str, tuple[int, ...]]] = dataclasses.field(default_factory=dict)

    def update(self, cluster: snapshot.Snapshot) -> None:
        for name in list(self.by_node):
            if name not in cluster.nodes:
                del self.by_node[name]
        for name, node in cluster.nodes.items():
            resident = [p for p in map(cluster.pods.__getitem__, node.pods) if p.holds_gpus and p.request.full]
            if node.dra_gpus:  # the allocator's choice, read from the claims
                self.by_node[name] = {p.key: p.gpu_indices for p in resident if p.indices_observed}
                continue
            held = {k: v for k, v in self.by_node.get(name, {}).items() if k in {p.key for p in resident}}
            for pod in sorted(resident, key=lambda p: (p.created, p.key)):
                if pod.key in held:
                    continue
                used = {i for indices in held.values() for i in indices}
                choice = placement.allocate(placement.free_by_domain(node.topology.domains, used), pod.request.full)
                if choice is not None:
                    held[pod.key] = choice.indices
            self.by_node[name] = held


def _utilisation(pod: snapshot.Pod | None, position: int) -> float:
    if pod is None:
        return 0.0
    raw = pod.annotations.get(UTILISATION_ANNOTATION)
    if raw is None:
        return DEFAULT_UTILISATION
    values = [v.strip() for v in str(raw).split(",") if v.strip()]
    try:
        return float(values[min(position, len(values) - 1)]) if values else DEFAULT_UTILISATION
    except ValueError:
        return DEFAULT_UTILISATION


def render(cluster: snapshot.Snapshot, assignments: Assignments) -> str:
    lines = [f"# HELP {METRIC} GPU utilization (in %).", f"# TYPE {METRIC} gauge"]
    for name in sorted(cluster.nodes):
        node = cluster.nodes[name]
        owner: dict[int, tuple[str, int]] = {}
        for key, indices in assignments.by_node.get(name, {}).items():
            for position, index in enumerate(indices):
                owner[index] = (key, position)
        model = node.labels.get(localcluster.GPU_PRODUCT_LABEL) or "NVIDIA-Simulated-GPU"
        for index in sorted(i for domain in node.topology.domains for i in domain):
            key, position = owner.get(index, ("", 0))
            pod = cluster.pods.get(key) if key else None
            namespace, pod_name = key.split("/", 1) if key else ("", "")
            labels = (
                f'gpu="{index}",UUID="GPU-{name}-{index}",device="nvidia{index}",modelName="{model}",'
                f'Hostname="{name}",container="{"main" if key else ""}",namespace="{namespace}",pod="{pod_name}"'
            )
            lines.append(f"{METRIC}{{{labels}}} {_utilisation(pod, position):g}")
    return "\n".join(lines) + "\n"


APP_SOURCE = web.AppKey("source", source.SnapshotSource)
APP_ASSIGNMENTS = web.AppKey("assignments", Assignments)


async def _metrics(request: web.Request) -> web.Response:
    cluster = request.app[APP_SOURCE].snapshot
    assignments = request.app[APP_ASSIGNMENTS]
    assignments.update(cluster)
    return web.Response(text=render(cluster, assignments), content_type="text/plain")


def create_app(*, cluster_source: source.SnapshotSource) -> web.Application:
    app = web.Application()
    app[APP_SOURCE] = cluster_source
    app[APP_ASSIGNMENTS] = Assignments()
    app.router.add_get("/metrics", _metrics)
    return app


async def serve(*, cluster_source: source.SnapshotSource, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve /metrics until `stop` is set; assignments advance at each scrape (every pod seen at
    least once per scrape interval keeps its indices)."""
    runner = web.AppRunner(create_app(cluster_source=cluster_source), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        await stop.wait()
    finally:
        await runner.cleanup()

