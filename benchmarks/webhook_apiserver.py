"""What gpu-steward's webhook adds to pod creation through the real API server.

    python benchmarks/webhook_apiserver.py [--nodes 20x8g2d] [--pods 300] [--block 25] [--quick] [--out FILE]

One local control plane (kube-apiserver, etcd, scheduler, kwok; `gpu_steward/localcluster.py`) with
the same kwok GPU nodes for both arms, and the real `gpu-steward webhook` process started once
(`gpu_steward/localsteward.py`). Two arms, alternated in blocks of `--block` pods in the order
A B B A A B … (so a linear drift of the machine falls on both alike):
  * A — the webhook NOT registered (its MutatingWebhookConfiguration deleted);
  * B — the webhook registered (the same object created again).
Before each block a probe pod is created until the apiserver shows the arm's state (B: the pod
carries our decision annotation; A: it does not), since webhook registrations reach the admission
chain through an informer. Then `--block` GPU pods (1 GPU, default tier) are created ONE AT A TIME
over one keep-alive HTTPS connection with the admin client certificate (sequential creates: this
measures latency, not throughput), each timed from the POST to the decoded answer; after the
block its pods are force-deleted so every block starts from the same empty nodes.

The apiserver's /metrics is scraped around every block; the delta of
`apiserver_admission_webhook_admission_duration_seconds{name="pods.gpu-steward.io",type="admit"}`
gives the webhook call's mean (sum/count, exact) and p50/p99 estimated from its buckets the way
PromQL's histogram_quantile does (linear within a bucket; the buckets are coarse: 5 ms, 25 ms, …).
The webhook's own /metrics is scraped too: `gpu_steward_admission_request_duration_seconds` (body
read to answer ready, fine buckets) — the rest of the apiserver's figure is transport and the
apiserver's own work (encoding the review, applying the patch). The goal is judged on the median
of paired neighbouring-block differences (B minus A), which a drifting load cancels; pooled p50s
and medians of block medians are printed beside it.
Prints a table and writes JSON to --out. Times are printed, never asserted; the machine may be
shared, so the load average is recorded and the arms are compared by medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import pathlib
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after site-packages: an installed gpu-steward wins; a bare checkout works too

import aiohttp  # noqa: E402
from kubernetes_asyncio import client  # noqa: E402
from prometheus_client import parser as prom_parser  # noqa: E402

from common import kube, settings  # noqa: E402
from gpu_steward import demo, localcluster, localsteward  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "webhook_apiserver.json"
NAMESPACE = "bench"
WEBHOOK_NAME = "pods.gpu-steward.io"  # the webhook's name inside our registration
ADMISSION_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
HANDLER_METRIC = "gpu_steward_admission_request_duration_seconds"  # the webhook's own, from admission/metrics.py
REGISTRATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CALL_TIMEOUT_SECONDS = 30
SWITCH_TIMEOUT_SECONDS = 60
GOAL_ADDED_P50_MS = 2.0
ARMS = {"A": "without webhook", "B": "with gpu-steward"}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- pods -----------------------------------------------------------------------------------------


def gpu_pod(name: str) -> dict[str, Any]:
    """A 1-GPU pod with no tier label or priority class: the default tier."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "registry.example/train:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
            }],
        },
    }


async def create(api: client.ApiClient, name: str) -> tuple[float, kube.Json]:
    """Create one pod; the wall time of the call (seconds) and the stored pod."""
    started = time.perf_counter()
    stored = await kube.request(api, "POST", PODS, body=gpu_pod(name), timeout_seconds=CALL_TIMEOUT_SECONDS)
    return time.perf_counter() - started, stored


async def delete_all(api: client.ApiClient) -> None:
    """Force-delete every pod of the namespace and wait until none is left."""
    await kube.request(api, "DELETE", PODS, query={"gracePeriodSeconds": 0}, timeout_seconds=CALL_TIMEOUT_SECONDS)
    async with asyncio.timeout(SWITCH_TIMEOUT_SECONDS):
        while True:
            if not (await kube.get(api, PODS, timeout_seconds=CALL_TIMEOUT_SECONDS))["items"]:
                return
            await asyncio.sleep(0.1)


# --- the registration, on and off -----------------------------------------------------------------


async def set_registered(
    api: client.ApiClient, registration: Mapping[str, Any], *, on: bool, decision: str, probes: list[int]
) -> None:
    """Create or delete our registration, then create probe pods until the admission chain agrees."""
    path = f"{REGISTRATIONS}/{registration['metadata']['name']}"
    try:
        await kube.get(api, path, timeout_seconds=CALL_TIMEOUT_SECONDS)
        present = True
    except kube.ApiError as exc:
        if exc.status != 404:
            raise
        present = False
    if on and not present:
        await kube.request(api, "POST", REGISTRATIONS, body=dict(registration), timeout_seconds=CALL_TIMEOUT_SECONDS)
    elif present and not on:
        await kube.request(api, "DELETE", path, timeout_seconds=CALL_TIMEOUT_SECONDS)
    tries = 0
    async with asyncio.timeout(SWITCH_TIMEOUT_SECONDS):
        while True:
            tries += 1
            _, stored = await create(api, f"probe-{len(probes)}-{tries}")
            if (decision in (stored["metadata"].get("annotations") or {})) == on:
                break
            await asyncio.sleep(0.1)
    probes.append(tries)


# --- apiserver metrics ----------------------------------------------------------------------------


Histogram = dict[float, float]  # cumulative count by upper bound; the sum under key -1 (no bound is negative)


def histogram(text: str, family_name: str, labels: Mapping[str, str]) -> Histogram:
    """One histogram out of a Prometheus text page, summed over the series matching `labels`."""
    out: Histogram = {}
    for family in prom_parser.text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                out[bound] = out.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                out[-1.0] = out.get(-1.0, 0.0) + sample.value
    return out


async def scrape(api: client.ApiClient, webhook: aiohttp.ClientSession, webhook_metrics: str) -> dict[str, Histogram]:
    """The apiserver's view of our webhook calls (label `operation`/`rejected` summed) and the webhook's
    own handling time (body read to answer ready), both cumulative."""
    response = await api.call_api(
        "/metrics", "GET", header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"],
        _preload_content=False, _request_timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS))
    async with response:
        if response.status != 200:
            raise kube.ApiError(response.status, "GET /metrics failed")
        apiserver = await response.text()
    async with webhook.get(webhook_metrics) as answer:
        answer.raise_for_status()
        own = await answer.text()
    return {
        "apiserver": histogram(apiserver, ADMISSION_METRIC, {"name": WEBHOOK_NAME, "type": "admit"}),
        "handler": histogram(own, HANDLER_METRIC, {}),
    }


def histogram_delta(before: Mapping[float, float], after: Mapping[float, float]) -> Histogram:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def bucket_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """PromQL's histogram_quantile over cumulative buckets (seconds), or None without observations."""
    bounds = sorted(b for b in buckets if b >= 0)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # as PromQL: the highest finite bound
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def webhook_summary(buckets: Mapping[float, float]) -> dict[str, Any]:
    count = buckets.get(math.inf, 0.0)
    p50, p99 = bucket_quantile(0.5, buckets), bucket_quantile(0.99, buckets)
    return {
        "calls": int(count),
        "mean_ms": round(buckets.get(-1.0, 0.0) / count * 1000, 3) if count else None,
        "p50_ms_from_buckets": None if p50 is None else round(p50 * 1000, 3),
        "p99_ms_from_buckets": None if p99 is None else round(p99 * 1000, 3),
        "buckets": {("+Inf" if math.isinf(b) else f"{b:g}"): int(v) for b, v in sorted(buckets.items()) if b >= 0},
    }


# --- the run --------------------------------------------------------------------------------------


def block_order(blocks: int) -> list[str]:
    """A B B A A B B A …: each arm's mean position is the same, so a linear drift cancels."""
    return [("A", "B", "B", "A")[i % 4] for i in range(blocks)]


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def arm_summary(latencies: Sequence[float], block_medians: Sequence[float]) -> dict[str, Any]:
    return {
        "pods": len(latencies),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p90_ms": round(_percentile(latencies, 0.90) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
        "median_of_block_medians_ms": round(statistics.median(block_medians) * 1000, 3),
    }


async def measure(
    cluster: localcluster.LocalCluster, args: argparse.Namespace, *, workdir: pathlib.Path
) -> dict[str, Any]:
    names = settings.Settings().names
    api = await kube.api_client(settings.Kubernetes(kubeconfig=cluster.kubeconfig))
    try:
        async with contextlib.AsyncExitStack() as stack:
            await asyncio.to_thread(stack.enter_context, localsteward.webhook(cluster, workdir, config={}))
            stored = await kube.get(api, f"{REGISTRATIONS}/{localsteward.REGISTRATION}",
                                    timeout_seconds=CALL_TIMEOUT_SECONDS)
            registration = {key: stored[key] for key in ("apiVersion", "kind", "webhooks")}
            registration["metadata"] = {"name": stored["metadata"]["name"]}
            probes: list[int] = []
            latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
            medians: dict[str, list[float]] = {arm: [] for arm in ARMS}
            seen: dict[str, dict[str, Histogram]] = {arm: {"apiserver": {}, "handler": {}} for arm in ARMS}
            own_metrics = registration["webhooks"][0]["clientConfig"]["url"].replace("/mutate", "/metrics")
            trust = ssl.create_default_context(cafile=workdir / "tls" / "ca.crt")  # where localsteward put it
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=trust), timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS)))
            # Warm-up, not counted: connections, caches, the webhook's first requests, both arms.
            for arm in ARMS:
                await set_registered(api, registration, on=arm == "B", decision=names.decision, probes=probes)
                for index in range(args.warmup):
                    await create(api, f"warm-{arm.lower()}-{index}")
                await delete_all(api)
            order = block_order(math.ceil(args.pods / args.block) * 2)
            for number, arm in enumerate(order):
                await set_registered(api, registration, on=arm == "B", decision=names.decision, probes=probes)
                before = await scrape(api, session, own_metrics)
                times = [(await create(api, f"{arm.lower()}-{number}-{i}"))[0] for i in range(args.block)]
                after = await scrape(api, session, own_metrics)
                for source, total in seen[arm].items():
                    for key, value in histogram_delta(before[source], after[source]).items():
                        total[key] = total.get(key, 0.0) + value
                latencies[arm].extend(times)
                medians[arm].append(statistics.median(times))
                await delete_all(api)
    finally:
        await api.close()
    arms = {arm: {"label": ARMS[arm], **arm_summary(latencies[arm], medians[arm]),
                  "webhook_admission": webhook_summary(seen[arm]["apiserver"]),
                  "webhook_handler": webhook_summary(seen[arm]["handler"])} for arm in ARMS}
    return {"arms": arms, "block_order": order, "probe_pods_per_switch": probes,
            "blocks": [{"arm": arm, "median_ms": round(medians[arm][order[:i].count(arm)] * 1000, 3)}
                       for i, arm in enumerate(order)]}


def paired_differences(blocks: Sequence[Mapping[str, Any]]) -> list[float]:
    """B minus A block medians (ms) of neighbouring blocks (1st with 2nd, 3rd with 4th, …): the two
    blocks of a pair ran seconds apart, so the machine's drift between pairs drops out."""
    out = []
    for first, second in zip(blocks[::2], blocks[1::2], strict=False):
        by_arm = {first["arm"]: first["median_ms"], second["arm"]: second["median_ms"]}
        out.append(round(by_arm["B"] - by_arm["A"], 3))
    return out


def compare(arms: Mapping[str, Mapping[str, Any]], blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The goal is judged on the median of paired block differences: on a shared machine the pooled
    p50s drift by more than the effect (the pooled numbers are reported beside it)."""
    a, b = arms["A"], arms["B"]
    pairs = paired_differences(blocks)
    added = statistics.median(pairs)
    return {
        "added_p50_ms_paired_blocks": round(added, 3),
        "paired_block_differences_ms": pairs,
        "added_pooled_p50_ms": round(b["p50_ms"] - a["p50_ms"], 3),
        "added_median_of_block_medians_ms": round(b["median_of_block_medians_ms"] - a["median_of_block_medians_ms"], 3),
        "p50_ratio": round(b["p50_ms"] / a["p50_ms"], 3),
        "p99_ratio": round(b["p99_ms"] / a["p99_ms"], 3),
        "goal": f"under {GOAL_ADDED_P50_MS:g} ms added to p50 pod creation",
        "goal_met": added < GOAL_ADDED_P50_MS,
    }


def table(results: Mapping[str, Any]) -> str:
    arms, verdict = results["arms"], results["comparison"]
    lines = [f"{'arm':<20} {'pods':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
             f"{'blk med':>8} {'webhook calls':>13} {'wh mean ms':>10} {'wh p50~':>8} {'wh p99~':>8} "
             f"{'own mean':>8} {'own p50~':>8}"]
    for arm, row in arms.items():
        hook, own = row["webhook_admission"], row["webhook_handler"]

        def cell(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        lines.append(
            f"{arm + ' ' + row['label']:<20} {row['pods']:>5} {row['p50_ms']:>8.3f} {row['p90_ms']:>8.3f} "
            f"{row['p99_ms']:>8.3f} {row['mean_ms']:>8.3f} {row['median_of_block_medians_ms']:>8.3f} "
            f"{hook['calls']:>13} {cell(hook['mean_ms']):>10} {cell(hook['p50_ms_from_buckets']):>8} "
            f"{cell(hook['p99_ms_from_buckets']):>8} {cell(own['mean_ms']):>8} {cell(own['p50_ms_from_buckets']):>8}"
        )
    lines.append(
        f"added by the webhook to the median create: {verdict['added_p50_ms_paired_blocks']:+.3f} ms "
        f"(median of {len(verdict['paired_block_differences_ms'])} paired block differences); pooled p50 "
        f"{verdict['added_pooled_p50_ms']:+.3f} ms (B/A {verdict['p50_ratio']:.2f}x), "
        f"median of block medians {verdict['added_median_of_block_medians_ms']:+.3f} ms,\n  "
        f"p99 B/A {verdict['p99_ratio']:.2f}x; goal {verdict['goal']}: "
        f"{'MET' if verdict['goal_met'] else 'NOT MET'}"
    )
    load = results["load_average"]
    lines.append(f"load average (1/5/15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="20x8g2d", help="kwok GPU nodes (localcluster.parse_nodes)")
    parser.add_argument("--pods", type=int, default=300, help="pods created per arm")
    parser.add_argument("--block", type=int, default=25, help="pods per block; arms alternate A B B A …")
    parser.add_argument("--warmup", type=int, default=10, help="uncounted pods per arm before measuring")
    parser.add_argument("--quick", action="store_true", help="CI size: 50 pods per arm in blocks of 10")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.pods, args.block, args.warmup = 50, 10, 5
    if args.pods < 1 or args.block < 1:
        parser.error("--pods and --block must be positive")
    gpus = sum(g.count * g.gpus for g in localcluster.parse_nodes(args.nodes))
    if gpus < args.block + args.warmup:
        parser.error(f"--nodes {args.nodes} has {gpus} GPUs: fewer than a block's (or the warm-up's) pods")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    with localcluster.sigterm_as_interrupt():
        return _main(parse_args(argv), command=list(argv if argv is not None else sys.argv[1:]))


def _main(args: argparse.Namespace, *, command: list[str]) -> int:
    bin_dir = localcluster.ensure_binaries(progress=lambda line: None)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    config = settings.Settings()
    with tempfile.TemporaryDirectory(prefix="webhook-apiserver-") as tmp, \
            localcluster.LocalCluster(bin_dir, progress=say) as cluster:
        cluster.add_nodes(localcluster.gpu_nodes(args.nodes, names=config.names), timeout_seconds=120)
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                       *demo.priority_classes(config)])  # the tier classes the webhook assigns
        say(f"cluster with {args.nodes} ready; {args.pods} pods per arm in blocks of {args.block}")
        measured = asyncio.run(measure(cluster, args, workdir=pathlib.Path(tmp)))
    results: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/webhook_apiserver.py", *command]),
        "config": {"nodes": args.nodes, "pods_per_arm": args.pods, "block": args.block, "warmup": args.warmup,
                   "creates": "sequential, one keep-alive HTTPS connection, admin client certificate",
                   "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        **measured,
        "comparison": compare(measured["arms"], measured["blocks"]),
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{table(results)}\nresults written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
