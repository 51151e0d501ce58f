"""Admission webhook latency and throughput over TLS, against a no-op webhook on the same footing.

    python benchmarks/webhook_latency.py [--nodes 1000] [--pods 10000] [--rate 500] [--quick] [--out FILE]

Builds a synthetic cluster state (mixed 8-GPU/2-domain, 4-GPU/2-domain and 2-GPU nodes, pods bound
on them), then serves it twice, one server at a time, each pinned to the same single core when the
OS allows (`os.sched_setaffinity`) while this client runs on the others:
  * `gpu-steward webhook --cluster STATE.json` — the real process, TLS, logging and metrics included;
  * a no-op aiohttp webhook over the same TLS context that answers `allowed` without looking, twice:
    with the standard library's json, and with orjson as gpu-steward uses (`noop-orjson`).
Each is driven open-loop at a fixed rate (latency counted from the scheduled send time, so a slow
server cannot hide queueing) and closed-loop at the maximum rate. Also times `mutation.decide` in
process per pod. Prints a table and writes JSON results to --out. Times are printed, never asserted;
the client shares the machine, so compare with the no-op row rather than read absolute numbers alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import pathlib
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout; the tests package is not installed

import aiohttp  # noqa: E402

from admission import mutation  # noqa: E402
from benchmarks.noop_webhook import serve_noop  # noqa: E402
from common import settings_loader, snapshot_build  # noqa: E402
from gpu_steward_lab import certs  # noqa: E402
from tests import builders  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve()
TEMPLATE = ROOT / "tests" / "fixtures" / "admission" / "pod-create-gpu.json"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "webhook_latency.json"
# (GPUs, NVLink domains, share of nodes)
NODE_SHAPES = ((8, 2, 0.4), (4, 2, 0.3), (2, 1, 0.3))
NODE_FILL = (0.0, 0.25, 0.5, 0.75, 1.0)  # share of a node's GPUs held by pods, cycled
POD_GPUS = (1, 1, 1, 2, 2, 4, 8)  # what the posted pods ask for, cycled
GOALS = {"p99_ms_at_fixed_rate": 5.0, "max_rps": 1500.0}


# --- the synthetic cluster ------------------------------------------------------------------------


def synthetic_state(*, nodes: int, pods: int) -> dict[str, Any]:
    """A `kubectl get ... -o json` List. Nodes are 0-100 % used by GPU pods of mixed sizes (so free
    GPUs per domain vary); the rest of `pods` are CPU pods (exporters, sidecars) on the same nodes."""
    items: list[dict[str, Any]] = [*builders.tier_classes(), builders.namespace("bench")]
    shapes = [(gpus, domains) for gpus, domains, share in NODE_SHAPES for _ in range(round(share * 10))]
    sizes = itertools.cycle((1, 2, 1, 4, 1, 2, 8))
    names = []
    gpu_pods = 0
    for index in range(nodes):
        gpus, domains = shapes[index % len(shapes)]
        size = gpus // domains
        name = f"gpu-node-{index:04d}"
        names.append(name)
        items.append(
            builders.gpu_node(name, gpus=gpus, domains=[range(d * size, (d + 1) * size) for d in range(domains)])
        )
        left = round(gpus * NODE_FILL[index % len(NODE_FILL)])
        while left and gpu_pods < pods:
            want = min(next(sizes), left)
            items.append(
                builders.pod(f"train-{gpu_pods:05d}", namespace="bench", gpus=want, node=name, phase="Running")
            )
            left -= want
            gpu_pods += 1
    for index in range(pods - gpu_pods):
        items.append(builders.pod(f"cpu-{index:05d}", namespace="bench", node=names[index % nodes], phase="Running"))
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def review_bodies(count: int) -> list[bytes]:
    """Distinct GPU pod CREATE reviews shaped like kube-apiserver's, of varied sizes."""
    template = json.loads(TEMPLATE.read_text())
    bodies = []
    for index in range(count):
        body = json.loads(json.dumps(template))
        request = body["request"]
        request["uid"] = f"00000000-0000-4000-8000-{index:012d}"
        request["name"] = request["object"]["metadata"]["name"] = f"bench-{index}"
        request["namespace"] = request["object"]["metadata"]["namespace"] = "bench"
        gpus = str(POD_GPUS[index % len(POD_GPUS)])
        request["object"]["spec"]["containers"][0]["resources"] = {
            "limits": {"nvidia.com/gpu": gpus},
            "requests": {"nvidia.com/gpu": gpus},
        }
        bodies.append(json.dumps(body).encode())
    return bodies


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def time_decide(state: dict[str, Any], bodies: Sequence[bytes], *, seconds: float) -> dict[str, Any]:
    config = settings_loader.load()
    started = time.perf_counter()
    cluster = snapshot_build.from_list(state, names=config.names, taken_at=time.time())
    build_ms = (time.perf_counter() - started) * 1000
    pods = [json.loads(b)["request"]["object"] for b in bodies]
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline:
            for pod in pods:
                t0 = time.perf_counter()
                mutation.decide(
                    operation="CREATE", namespace="bench", pod=pod, cluster=cluster, config=config, now=time.time()
                )
                samples.append(time.perf_counter() - t0)
    except NotImplementedError:
        return {"snapshot_build_ms": build_ms, "error": "mutation.decide is not implemented yet"}
    return {
        "snapshot_build_ms": round(build_ms, 1),
        "gpu_nodes": len(cluster.nodes),
        "gpu_pods": len(cluster.pods),
        "calls": len(samples),
        "p50_us": round(_percentile(samples, 0.50) * 1e6, 1),
        "p99_us": round(_percentile(samples, 0.99) * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


# --- servers --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass(frozen=True)
class Cores:
    server: set[int] | None
    client: set[int] | None

    @staticmethod
    def plan() -> Cores:
        if not hasattr(os, "sched_setaffinity"):
            return Cores(None, None)
        available = sorted(os.sched_getaffinity(0))
        if len(available) < 2:
            return Cores({available[-1]}, None)
        return Cores({available[-1]}, set(available[:-1]))


@contextlib.asynccontextmanager
async def running(
    argv: Sequence[str], *, url: str, cores: Cores, ca: ssl.SSLContext, log: pathlib.Path
) -> AsyncIterator[None]:
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stdout=sink, stderr=sink)
    try:
        if cores.server is not None:
            os.sched_setaffinity(process.pid, cores.server)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ca)) as session:
            async with asyncio.timeout(120):
                while True:
                    if process.returncode is not None:
                        output = await asyncio.to_thread(log.read_text)
                        raise RuntimeError(f"{argv[1:4]} exited {process.returncode}: {output[-2000:]}")
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                            if r.status == 200:
                                break
                    await asyncio.sleep(0.2)
        yield
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=15)
            except TimeoutError:
                process.kill()
                await process.wait()


# --- load -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    latencies: list[float] = dataclasses.field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def summary(self, *, target_rps: float | None) -> dict[str, Any]:
        return {
            "target_rps": target_rps,
            "requests": len(self.latencies),
            "errors": self.errors,
            "achieved_rps": round(len(self.latencies) / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": round(_percentile(self.latencies, 0.50) * 1000, 3),
            "p99_ms": round(_percentile(self.latencies, 0.99) * 1000, 3),
        }


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> bool:
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _session(ca: ssl.SSLContext, *, connections: int) -> aiohttp.ClientSession:
    # The API server keeps connections to a webhook alive and reuses them; so does this client.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ca, limit=connections),
        timeout=aiohttp.ClientTimeout(total=10),
    )


async def fixed_rate(
    session: aiohttp.ClientSession, url: str, bodies: Sequence[bytes], *, rate: float, seconds: float
) -> Run:
    run = Run()

    async def one(index: int, due: float) -> None:
        if await _post(session, url, bodies[index % len(bodies)]):
            run.latencies.append(time.perf_counter() - due)  # from the scheduled send: no coordinated omission
        else:
            run.errors += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for index in range(int(rate * seconds)):
            due = start + index / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(one(index, due))
    run.seconds = time.perf_counter() - start
    return run


async def max_rate(
    session: aiohttp.ClientSession, url: str, bodies: Sequence[bytes], *, workers: int, seconds: float
) -> Run:
    run = Run()
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(offset: int) -> None:
        index = offset
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            if await _post(session, url, bodies[index % len(bodies)]):
                run.latencies.append(time.perf_counter() - t0)
            else:
                run.errors += 1
            index += workers

    async with asyncio.TaskGroup() as group:
        for offset in range(workers):
            group.create_task(worker(offset))
    run.seconds = time.perf_counter() - start
    return run


async def measure(url: str, bodies: Sequence[bytes], *, ca: ssl.SSLContext, args: argparse.Namespace) -> dict[str, Any]:
    async with _session(ca, connections=max(64, args.workers)) as session:
        await max_rate(session, url, bodies, workers=args.workers, seconds=args.warmup)  # also opens the connections
        fixed = await fixed_rate(session, url, bodies, rate=args.rate, seconds=args.duration)
        top = await max_rate(session, url, bodies, workers=args.workers, seconds=args.duration)
    return {"fixed": fixed.summary(target_rps=args.rate), "max": top.summary(target_rps=None)}


# --- report ---------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    servers = results["servers"]
    noop = servers.get("noop")
    lines = [
        f"{'server':<12} {'load':<10} {'achieved rps':>12} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'vs no-op':>9}"
    ]
    for name, phases in servers.items():
        for phase, row in phases.items():
            load = f"{row['target_rps']:g} rps" if row["target_rps"] else "max"
            if noop is None or name.startswith("noop"):
                ratio = ""
            elif phase == "max":
                ratio = f"{row['achieved_rps'] / noop['max']['achieved_rps']:.2f}x rps"
            else:
                ratio = f"{row['p99_ms'] / noop['fixed']['p99_ms']:.2f}x p99"
            lines.append(
                f"{name:<12} {load:<10} {row['achieved_rps']:>12.1f} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
                f"{row['errors']:>6} {ratio:>9}"
            )
    fast, ours = servers.get("noop-orjson"), servers.get("gpu-steward")
    if fast is not None and ours is not None:
        ratio = ours["max"]["achieved_rps"] / fast["max"]["achieved_rps"]
        lines.append(f"gpu-steward at max rate vs the no-op with orjson (same JSON library as ours): {ratio:.2f}x rps")
    decide = results["decide_in_process"]
    if "error" in decide:
        lines.append(f"decide() in process: {decide['error']}")
    else:
        lines.append(
            f"decide() in process: p50 {decide['p50_us']} us, p99 {decide['p99_us']} us per pod "
            f"({decide['gpu_nodes']} GPU nodes, {decide['gpu_pods']} GPU pods; snapshot built in "
            f"{decide['snapshot_build_ms']} ms)"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500, help="fixed-rate phase, requests/s")
    parser.add_argument("--duration", type=float, default=10, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=2, help="seconds of max-rate load before measuring")
    parser.add_argument("--workers", type=int, default=32, help="concurrent requests in the max-rate phase")
    parser.add_argument("--quick", action="store_true", help="CI size: 100 nodes, 1,000 pods, short phases")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--skip-server",
        action="append",
        default=[],
        choices=("gpu-steward", "noop", "noop-orjson"),
        help="do not run this server (e.g. while the engine is not implemented)",
    )
    parser.add_argument("--serve-noop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fast-json", action="store_true", help=argparse.SUPPRESS)  # the no-op with orjson
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert-file", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.duration, args.warmup = 100, 1000, 1.5, 0.5
    return args


def prepare(args: argparse.Namespace, workdir: pathlib.Path) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Write the cluster state and TLS files, time the engine in process; the server commands to run."""
    state = synthetic_state(nodes=args.nodes, pods=args.pods)
    state_file = workdir / "state.json"
    state_file.write_text(json.dumps(state))
    tls_files = certs.generate(workdir / "tls")
    cores = Cores.plan()
    results: dict[str, Any] = {
        "config": {
            "nodes": args.nodes,
            "pods": args.pods,
            "rate": args.rate,
            "duration_s": args.duration,
            "workers": args.workers,
            "server_cores": sorted(cores.server) if cores.server else None,
            "client_cores": sorted(cores.client) if cores.client else None,
            "python": sys.version.split()[0],
        },
        "goals": GOALS,
        "decide_in_process": time_decide(state, review_bodies(64), seconds=min(args.duration, 3)),
        "servers": {},
    }
    tls_flags = ["--cert-file", str(tls_files.cert_file), "--key-file", str(tls_files.key_file)]
    webhook = ["-m", "gpu_steward", "webhook", "--cluster", str(state_file), "--host", "127.0.0.1"]
    commands = {
        "noop": [sys.executable, str(SCRIPT), "--serve-noop", *tls_flags],
        "noop-orjson": [sys.executable, str(SCRIPT), "--serve-noop", "--fast-json", *tls_flags],
        "gpu-steward": [sys.executable, *webhook, *tls_flags],
    }
    return results, {name: argv for name, argv in commands.items() if name not in args.skip_server}


async def benchmark(
    args: argparse.Namespace, *, results: dict[str, Any], commands: dict[str, list[str]], workdir: pathlib.Path
) -> None:
    ca = ssl.create_default_context(cafile=workdir / "tls" / "ca.crt")
    bodies = review_bodies(64)
    cores = Cores.plan()
    if cores.client is not None:
        os.sched_setaffinity(0, cores.client)
    for name, argv in commands.items():
        port = _free_port()
        url = f"https://127.0.0.1:{port}"
        async with running([*argv, "--port", str(port)], url=url, cores=cores, ca=ca, log=workdir / f"{name}.log"):
            results["servers"][name] = await measure(f"{url}/mutate", bodies, ca=ca, args=args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_noop:
        serve_noop(port=args.port, cert_file=args.cert_file, key_file=args.key_file, fast_json=args.fast_json)
        return 0
    with tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp:
        workdir = pathlib.Path(tmp)
        results, commands = prepare(args, workdir)
        asyncio.run(benchmark(args, results=results, commands=commands, workdir=workdir))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
