"""CPU to rebuild the cluster snapshot: from scratch, and after one pod event, the way the feeder rebuilds.

    python benchmarks/snapshot_rebuild.py [--nodes 200] [--pods 2000] [--dra-every 10] [--events 300] [--seed 1]
                                          [--quick] [--out FILE]

The cluster (built with tests/builders): `--nodes` GPU nodes of 8 GPUs in two NVLink domains of 4, one in
`--dra-every` of them (default 10; 1: all) DRA nodes (no device plugin; a ResourceSlice of 8 GPUs each, and NVIDIA's
DeviceClass serving `nvidia.com/gpu`), grouped 16 to an `nvidia.com/gpu.clique`; `--pods` pods: GPU pods of 1, 2, 4 or
8 GPUs bound until the nodes are about 85 % full (on a DRA node through an allocated, reserved ResourceClaim), the
rest gated (our gate) pending GPU pods, plus one CPU-only pod bound to every node (a DaemonSet's); the tier
PriorityClasses and a namespace. DCGM occupancy names the GPU indices of half of the device-plugin nodes' pods.

Rows (each the CPU, `time.process_time()`, of one rebuild as the feeder does it: a copy of its stores, then
`feeder.Builder.build`):
  * full            — a build by a new builder (from scratch: the first list; a relist comes close);
  * pod bound       — one gated pending pod un-gated and bound to a node with room (a new object in the store);
  * pod deleted     — one bound pod removed from the store;
  * gated pod added — one new gated GPU pod in the store;
  * DRA pod bound   — a new 1-GPU pod bound to a DRA node with the claim kube-scheduler allocated for it (a pod and a
                      claim in the stores; when the DRA nodes are full, a bound DRA pod and its claim gone instead).
Each event row reports p50 and p90 over `--events` events (each applied to the state the last one left), the load
average (`os.getloadavg()`) beside every row. Writes JSON to --out. Numbers, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from common import feeder, settings, snapshot  # noqa: E402
from tests import builders  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "snapshot_rebuild.json"
NAMES = settings.Names()
DOMAINS = [range(4), range(4, 8)]
SIZES = (1, 1, 2, 2, 4, 8)
Stores = dict[str, dict[str, dict[str, Any]]]


def cluster(*, nodes: int, pods: int, seed: int, dra_every: int = 10) -> tuple[Stores, snapshot.Occupancy]:
    """The feeder's stores (kind -> key -> object) and a DCGM occupancy for a cluster of `nodes` and `pods`."""
    rng = random.Random(seed)
    stores: Stores = {kind.name: {} for kind in feeder.KINDS}
    free: dict[str, int] = {}
    dra_nodes: set[str] = set()
    for i in range(nodes):
        name = f"gpu-{i:04d}"
        labels = {"nvidia.com/gpu.clique": f"clique-{i // 16}"}
        if i % dra_every == dra_every - 1:
            stores["nodes"][name] = builders.dra_node(name, gpus=8, domains=DOMAINS)
            stores["nodes"][name]["metadata"]["labels"].update(labels)
            dra_nodes.add(name)
            stores["resourceslices"][name] = builders.resource_slice(name, 8)
        else:
            stores["nodes"][name] = builders.gpu_node(name, gpus=8, domains=DOMAINS, labels=labels)
        free[name] = 8
    stores["deviceclasses"]["gpu.nvidia.com"] = builders.device_class()
    stores["deviceclasses"]["gpu.nvidia.com"]["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    for pc in builders.tier_classes():
        stores["priorityclasses"][pc["metadata"]["name"]] = pc
    stores["namespaces"]["train"] = builders.namespace("train")
    occupancy: dict[str, dict[int, str]] = {}
    next_index = dict.fromkeys(free, 0)
    capacity = 8 * nodes
    for node_name in list(stores["nodes"]):
        add(stores, builders.pod(f"ds-{node_name}", namespace="train", node=node_name, phase="Running"))
    created = 0
    while created < pods - nodes:
        gpus = rng.choice(SIZES)
        name = f"job-{created:05d}"
        stamp = f"2026-11-21T{10 + created // 3600:02d}:{created // 60 % 60:02d}:{created % 60:02d}Z"
        created += 1
        fits = [n for n, f in free.items() if f >= gpus]
        if sum(free.values()) > 0.15 * capacity and fits:
            node = rng.choice(fits)
            free[node] -= gpus
            first = next_index[node]
            next_index[node] += gpus
            if node in dra_nodes:
                claim = f"{name}-gpu"
                body = builders.pod(name, namespace="train", gpus=gpus, node=node, phase="Running", created=stamp,
                                    mutate=builders.with_extended_claim(claim))
                stores["resourceclaims"][f"train/{claim}"] = builders.resource_claim(
                    claim, namespace="train", extended=True, reserved_for=[name],
                    devices=[(node, first + k) for k in range(gpus)])
            else:
                body = builders.pod(name, namespace="train", gpus=gpus, node=node, phase="Running", created=stamp)
                if created % 2:
                    occupancy.setdefault(node, {}).update({first + k: f"train/{name}" for k in range(gpus)})
        else:
            body = gated(name, gpus=gpus, created=stamp)
        add(stores, body)
    return stores, occupancy


def gated(name: str, *, gpus: int, created: str = "2026-11-22T10:00:00Z") -> dict[str, Any]:
    return builders.pod(name, namespace="train", gpus=gpus, created=created,
                        mutate=lambda body: body["spec"].update(schedulingGates=[{"name": NAMES.gate}]))


def add(stores: Stores, body: dict[str, Any]) -> None:
    stores["pods"][f"{body['metadata']['namespace']}/{body['metadata']['name']}"] = body


def builder() -> feeder.Builder:
    return feeder.Builder(names=NAMES, gpu_classes=settings.Dra().gpu_device_classes)


def rebuild(stores: Stores, occupancy: snapshot.Occupancy, into: feeder.Builder) -> snapshot.Snapshot:
    """What `Feeder._rebuild` does: copy the stores, build (in its worker thread)."""
    return into.build(stores={name: dict(store) for name, store in stores.items()}, served=True,
                      pod_group_version=None, occupancy=occupancy, taken_at=0.0)


def bind_one(stores: Stores, rng: random.Random, built: snapshot.Snapshot) -> None:
    """A gated pod un-gated and bound to a device-plugin node with room (else: a new gated pod)."""
    waiting = [p for p in built.pods.values() if p.scheduling_gates and p.node_name is None]
    rng.shuffle(waiting)
    for pod in waiting:
        room = [n for n in built.nodes.values() if not n.dra_gpus and n.free_gpus >= pod.request.full]
        if room:
            body = json.loads(json.dumps(pod.raw))
            body["spec"].pop("schedulingGates", None)
            body["spec"]["nodeName"] = rng.choice(room).name
            body["status"]["phase"] = "Running"
            add(stores, body)
            return
    add_gated(stores, rng, built)


def delete_one(stores: Stores, rng: random.Random, built: snapshot.Snapshot) -> None:
    """A bound device-plugin GPU pod gone."""
    bound = sorted(k for k, p in built.pods.items() if p.node_name and not p.dra.count and p.request.full)
    del stores["pods"][rng.choice(bound)]


def add_gated(stores: Stores, rng: random.Random, built: snapshot.Snapshot) -> None:
    add(stores, gated(f"new-{len(stores['pods'])}-{rng.randrange(10**9)}", gpus=rng.choice(SIZES)))


def bind_dra(stores: Stores, rng: random.Random, built: snapshot.Snapshot) -> None:
    """A new 1-GPU pod bound to a DRA node with a free device, with the claim kube-scheduler allocated for it (else: a
    bound DRA pod and its claim gone)."""
    room = sorted(n.name for n in built.nodes.values() if n.dra_gpus and n.free_gpus)
    if not room:
        bound = sorted(k for k, p in built.pods.items() if p.dra.claims and p.node_name)
        key = rng.choice(bound)
        del stores["pods"][key]
        stores["resourceclaims"].pop(f"{key}-gpu", None)
        return
    node = built.nodes[rng.choice(room)]
    index = next(i for domain in node.free_by_domain() for i in domain)
    name = f"dra-{len(stores['pods'])}-{rng.randrange(10**9)}"
    add(stores, builders.pod(name, namespace="train", gpus=1, node=node.name, phase="Running",
                             mutate=builders.with_extended_claim(f"{name}-gpu")))
    stores["resourceclaims"][f"train/{name}-gpu"] = builders.resource_claim(
        f"{name}-gpu", namespace="train", extended=True, reserved_for=[name], devices=[(node.name, index)])


EVENTS: dict[str, Callable[[Stores, random.Random, snapshot.Snapshot], None]] = {
    "pod bound": bind_one, "pod deleted": delete_one, "gated pod added": add_gated, "DRA pod bound": bind_dra}


def timed(build: Callable[[], snapshot.Snapshot]) -> tuple[float, snapshot.Snapshot]:
    started = time.process_time()
    built = build()
    return time.process_time() - started, built


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--dra-every", type=int, default=10, help="one node in N is a DRA node (1: all)")
    parser.add_argument("--events", type=int, default=300, help="events per event row")
    parser.add_argument("--full", type=int, default=10, help="full rebuilds timed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI: 30 events per row, 3 full rebuilds")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.full = 30, 3
    stores, occupancy = cluster(nodes=args.nodes, pods=args.pods, seed=args.seed, dra_every=args.dra_every)
    rows: list[dict[str, Any]] = []

    def row(name: str, samples: list[float]) -> None:
        ordered = sorted(samples)
        rows.append({"row": name, "rebuilds": len(samples), "p50_ms": 1000 * statistics.median(ordered),
                     "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))], "load_average": load()})

    full = [timed(lambda: rebuild(stores, occupancy, builder())) for _ in range(args.full)]
    row("full", [took for took, _ in full])
    kept = builder()
    built = rebuild(stores, occupancy, kept)
    rng = random.Random(args.seed)
    for name, event in EVENTS.items():
        samples = []
        for _ in range(args.events):
            event(stores, rng, built)
            took, built = timed(lambda: rebuild(stores, occupancy, kept))
            samples.append(took)
        row(name, samples)
    print(f"{len(built.nodes)} GPU nodes, {len(stores['pods'])} pods in the store, {len(built.pods)} in the snapshot")
    print(f"{'rebuild':<18}{'n':>5}{'p50 ms':>9}{'p90 ms':>9}  load average (1, 5, 15 min)")
    for r in rows:
        print(f"{r['row']:<18}{r['rebuilds']:>5}{r['p50_ms']:>9.1f}{r['p90_ms']:>9.1f}  {r['load_average']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/snapshot_rebuild.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(), "nodes": args.nodes, "pods": args.pods,
        "dra_every": args.dra_every, "events": args.events,
        "seed": args.seed, "rows": rows}, indent=2))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
