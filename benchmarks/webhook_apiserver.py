"""What gpu-steward's webhook adds to pod creation through the real API server, beside any webhook's floor.

    python benchmarks/webhook_apiserver.py [--nodes 20x8g2d] [--pods 300] [--block 25] [--quick] [--out FILE]

One local control plane (kube-apiserver, etcd, scheduler, kwok; `gpu_steward/localcluster.py`) with
the same kwok GPU nodes for every arm, the real `gpu-steward webhook` process (`gpu_steward/localsteward.py`)
and a no-op aiohttp webhook (`benchmarks/noop_webhook.py`, this script with `--serve-noop`) each started
once. Three arms:
  * A — no webhook registered;
  * B — gpu-steward's MutatingWebhookConfiguration registered;
  * C — the no-op webhook registered instead: a copy of ours as the apiserver stores it (rules,
    selectors, timeout, failure policy, side effects), named `noop.benchmark.gpu-steward.io` and
    pointing at the no-op server over TLS with its own throwaway CA (`gpu_steward/certs.py`). It
    decodes the review, echoes the uid and allows, with no patch: the apiserver does the same work
    as for B except our handler and applying our patch. C minus A is the floor: what ANY Python
    aiohttp webhook adds on this machine.
At most one registration exists at a time (the old one is deleted before the new one is created).
Blocks of `--block` pods run in rounds of one block per arm, every other round reversed: A B C C B A
A B C … (each arm's mean position is the same over two rounds, so a linear drift of the machine falls
on all arms alike). Before each block a probe pod is created until the apiserver shows the arm's
state, since webhook registrations reach the admission chain through an informer: the pod carries
our decision annotation exactly in B, and the no-op server's request counter (it changes nothing in
the pod) rose exactly in C. Then `--block` GPU pods (1 GPU, default tier) are created ONE AT A TIME
over one keep-alive HTTPS connection with the admin client certificate (sequential creates: this
measures latency, not throughput), each timed from the POST to the decoded answer; after the block
its pods are force-deleted so every block starts from the same empty nodes.

The apiserver's /metrics is scraped around every block; the delta of
`apiserver_admission_webhook_admission_duration_seconds{name=…,type="admit"}` (B: pods.gpu-steward.io,
C: the no-op's name, A: both, which must stay 0) gives the webhook call's mean (sum/count, exact) and
p50/p99 estimated from its buckets the way PromQL's histogram_quantile does (linear within a bucket;
the buckets are coarse: 5 ms, 25 ms, …). gpu-steward's own /metrics is scraped too:
`gpu_steward_admission_request_duration_seconds` (body read to answer ready, fine buckets). Each
comparison (B-A: added by gpu-steward, the goal's; C-A: the floor; B-C: gpu-steward over the floor)
is judged on the median of the differences within rounds (blocks seconds apart, which a drifting load
cancels; C and A are two blocks apart); pooled p50s and medians of block medians are printed beside it.
Prints a table and writes JSON to --out. Times are printed, never asserted; the machine may be
shared, so the load average is recorded and the arms are compared by medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import dataclasses
import json
import math
import os
import pathlib
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after site-packages: an installed gpu-steward wins; a bare checkout works too

import aiohttp  # noqa: E402
from kubernetes_asyncio import client  # noqa: E402
from prometheus_client import parser as prom_parser  # noqa: E402

from benchmarks.noop_webhook import serve_noop  # noqa: E402
from common import kube, settings  # noqa: E402
from gpu_steward_lab import certs, demo, localcluster, localsteward  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve()
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "webhook_apiserver.json"
NAMESPACE = "bench"
WEBHOOK_NAME = "pods.gpu-steward.io"  # the webhook's name inside our registration
NOOP_REGISTRATION = "gpu-steward-benchmark-noop"
NOOP_WEBHOOK_NAME = "noop.benchmark.gpu-steward.io"
ADMISSION_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
HANDLER_METRIC = "gpu_steward_admission_request_duration_seconds"  # the webhook's own, from admission/metrics.py
REGISTRATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CALL_TIMEOUT_SECONDS = 30
SWITCH_TIMEOUT_SECONDS = 60
GOAL_ADDED_P50_MS = 2.0
ARMS = {"A": "without webhook", "B": "with gpu-steward", "C": "with no-op webhook"}
WEBHOOKS = {"B": WEBHOOK_NAME, "C": NOOP_WEBHOOK_NAME}  # the webhook each arm registers (A: none)
# key: (minuend arm, subtrahend arm, what the difference means)
COMPARISONS = {
    "B_vs_A": ("B", "A", "added by gpu-steward"),
    "C_vs_A": ("C", "A", "added by the no-op webhook"),
    "B_vs_C": ("B", "C", "gpu-steward over the no-op"),
}


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


# --- the registrations: none, ours or the no-op's -------------------------------------------------


@contextlib.contextmanager
def noop_webhook(workdir: pathlib.Path) -> Iterator[tuple[str, certs.ServingCert]]:
    """Run arm C's server (this script with --serve-noop) on a serving certificate of its own CA,
    made the way localsteward makes ours; yield its base URL and the certificate. Stopped on exit."""
    cert = certs.generate(workdir / "noop-tls", common_name="noop-webhook")
    port = localcluster.free_port()
    url = f"https://127.0.0.1:{port}"
    server = localcluster.ManagedProcess(
        "noop-webhook",
        [sys.executable, str(SCRIPT), "--serve-noop", "--port", str(port),
         "--cert-file", str(cert.cert_file), "--key-file", str(cert.key_file)],
        log_file=workdir / "noop-webhook.log")
    try:
        server.start()
        trust = ssl.create_default_context(cafile=str(cert.ca_file))
        server.wait_http_ok(f"{url}/readyz", ssl_context=trust, timeout_seconds=60)
        yield url, cert
    finally:
        server.stop()


def noop_registration(ours: Mapping[str, Any], *, url: str, ca_bundle: bytes) -> dict[str, Any]:
    """Our registration as the apiserver stored it (defaults filled in), renamed and pointed at the
    no-op server: whatever localsteward registers, C differs from B only in who answers."""
    [hook] = copy.deepcopy(ours["webhooks"])
    hook["name"] = NOOP_WEBHOOK_NAME
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()}
    return {"apiVersion": ours["apiVersion"], "kind": ours["kind"], "metadata": {"name": NOOP_REGISTRATION},
            "webhooks": [hook]}


@dataclasses.dataclass
class Registrations:
    """Which webhook the apiserver calls on pod create: none (A), ours (B) or the no-op (C)."""

    api: client.ApiClient
    objects: Mapping[str, Mapping[str, Any]]  # arm -> the MutatingWebhookConfiguration it registers
    session: aiohttp.ClientSession  # trusts the no-op server
    noop_requests_url: str
    decision: str  # our annotation: the sign that ours was called
    probes: list[int] = dataclasses.field(default_factory=list)  # probe pods per switch

    async def switch(self, arm: str) -> None:
        """Make `arm`'s registration the only one, then create probe pods until the admission chain agrees."""
        # Deletions first: two webhooks are never registered at once.
        for owner in sorted(self.objects, key=lambda owner: owner == arm):
            await self._ensure(self.objects[owner], present=owner == arm)
        tries = 0
        async with asyncio.timeout(SWITCH_TIMEOUT_SECONDS):
            while True:
                tries += 1
                before = await self.noop_requests()
                _, stored = await create(self.api, f"probe-{len(self.probes)}-{tries}")
                called = {"B": self.decision in (stored["metadata"].get("annotations") or {}),
                          "C": await self.noop_requests() > before}
                if all(seen == (owner == arm) for owner, seen in called.items()):
                    break
                await asyncio.sleep(0.1)
        self.probes.append(tries)

    async def _ensure(self, registration: Mapping[str, Any], *, present: bool) -> None:
        path = f"{REGISTRATIONS}/{registration['metadata']['name']}"
        try:
            await kube.get(self.api, path, timeout_seconds=CALL_TIMEOUT_SECONDS)
            exists = True
        except kube.ApiError as exc:
            if exc.status != 404:
                raise
            exists = False
        if present and not exists:
            await kube.request(self.api, "POST", REGISTRATIONS, body=dict(registration),
                               timeout_seconds=CALL_TIMEOUT_SECONDS)
        elif exists and not present:
            await kube.request(self.api, "DELETE", path, timeout_seconds=CALL_TIMEOUT_SECONDS)

    async def noop_requests(self) -> int:
        """How many reviews the no-op server has answered (it leaves no mark in the pod)."""
        async with self.session.get(self.noop_requests_url) as answer:
            answer.raise_for_status()
            return int(await answer.text())


# --- apiserver metrics ----------------------------------------------------------------------------


Histogram = dict[float, float]  # cumulative count by upper bound; the sum under key -1 (no bound is negative)


def histograms(
    text: str, family_name: str, labels: Mapping[str, str], *, by: str | None = None
) -> dict[str, Histogram]:
    """Histograms out of a Prometheus text page, one per value of label `by` (read once: the apiserver's
    page is large; all under "" without `by`), each summed over the series matching `labels`."""
    out: dict[str, Histogram] = {}
    for family in prom_parser.text_string_to_metric_families(text):
        if family.name != family_name:
            continue
        for sample in family.samples:
            if any(sample.labels.get(key) != value for key, value in labels.items()):
                continue
            hist = out.setdefault(sample.labels.get(by, "") if by else "", {})
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                hist[bound] = hist.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                hist[-1.0] = hist.get(-1.0, 0.0) + sample.value
    return out


def histogram_sum(parts: Sequence[Mapping[float, float]]) -> Histogram:
    out: Histogram = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


async def scrape(api: client.ApiClient, webhook: aiohttp.ClientSession, webhook_metrics: str) -> dict[str, Histogram]:
    """Cumulative: the apiserver's view of the calls to each arm's webhook (under the arm's letter;
    labels `operation`/`rejected` summed) and gpu-steward's own handling time (body read to answer
    ready, under "handler")."""
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
    calls = histograms(apiserver, ADMISSION_METRIC, {"type": "admit"}, by="name")
    return {
        **{arm: calls.get(name, {}) for arm, name in WEBHOOKS.items()},  # no series before a webhook's first call
        "handler": histograms(own, HANDLER_METRIC, {}).get("", {}),
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


def block_order(rounds: int) -> list[str]:
    """Rounds of one block per arm, every other one reversed: A B C C B A A B C …. Over two rounds each
    arm's mean position is the same, so a linear drift cancels; within a round the arms run seconds apart."""
    arms = list(ARMS)
    return [arm for number in range(rounds) for arm in (arms if number % 2 == 0 else arms[::-1])]


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


def admission_summary(arm: str, seen: Mapping[str, Histogram]) -> dict[str, Any]:
    """The apiserver's calls to the arm's webhook (A: to any, so 0) and, as a check, to each webhook by name."""
    own = seen[arm] if arm in WEBHOOKS else histogram_sum([seen[other] for other in WEBHOOKS])
    return {
        "webhook": WEBHOOKS.get(arm, "none (calls to any counted)"),
        **webhook_summary(own),
        "calls_by_webhook": {name: int(seen[other].get(math.inf, 0.0)) for other, name in WEBHOOKS.items()},
    }


async def measure(
    cluster: localcluster.LocalCluster,
    args: argparse.Namespace,
    *,
    workdir: pathlib.Path,
    noop_url: str,
    noop_cert: certs.ServingCert,
) -> dict[str, Any]:
    names = settings.Settings().names
    api = await kube.api_client(settings.Kubernetes(kubeconfig=cluster.kubeconfig))
    try:
        async with contextlib.AsyncExitStack() as stack:
            await asyncio.to_thread(stack.enter_context, localsteward.webhook(cluster, workdir, config={}))
            stored = await kube.get(api, f"{REGISTRATIONS}/{localsteward.REGISTRATION}",
                                    timeout_seconds=CALL_TIMEOUT_SECONDS)
            ours = {key: stored[key] for key in ("apiVersion", "kind", "webhooks")}
            ours["metadata"] = {"name": stored["metadata"]["name"]}
            latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
            medians: dict[str, list[float]] = {arm: [] for arm in ARMS}
            seen: dict[str, dict[str, Histogram]] = {arm: {key: {} for key in (*WEBHOOKS, "handler")} for arm in ARMS}
            own_metrics = ours["webhooks"][0]["clientConfig"]["url"].replace("/mutate", "/metrics")
            trust = ssl.create_default_context(cafile=workdir / "tls" / "ca.crt")  # where localsteward put it
            trust.load_verify_locations(cafile=noop_cert.ca_file)
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=trust), timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS)))
            registrations = Registrations(
                api, {"B": ours, "C": noop_registration(ours, url=f"{noop_url}/mutate", ca_bundle=noop_cert.ca_bundle)},
                session, noop_requests_url=f"{noop_url}/requests", decision=names.decision)
            # Warm-up, not counted: connections, caches, the webhooks' first requests, every arm.
            for arm in ARMS:
                await registrations.switch(arm)
                for index in range(args.warmup):
                    await create(api, f"warm-{arm.lower()}-{index}")
                await delete_all(api)
            order = block_order(math.ceil(args.pods / args.block))
            for number, arm in enumerate(order):
                await registrations.switch(arm)
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
                  "webhook_admission": admission_summary(arm, seen[arm]),
                  "webhook_handler": webhook_summary(seen[arm]["handler"])} for arm in ARMS}
    return {"arms": arms, "webhooks": WEBHOOKS, "block_order": order, "probe_pods_per_switch": registrations.probes,
            "blocks": [{"arm": arm, "median_ms": round(medians[arm][order[:i].count(arm)] * 1000, 3)}
                       for i, arm in enumerate(order)]}


def paired_differences(blocks: Sequence[Mapping[str, Any]], first: str, second: str) -> list[float]:
    """`first` minus `second` block medians (ms) within each round (`block_order`): the blocks of a round
    ran seconds apart, so the machine's drift between rounds drops out, and the reversed rounds swap
    which of the two ran first."""
    out = []
    for start in range(0, len(blocks) - len(ARMS) + 1, len(ARMS)):
        by_arm = {block["arm"]: block["median_ms"] for block in blocks[start:start + len(ARMS)]}
        out.append(round(by_arm[first] - by_arm[second], 3))
    return out


def difference(arms: Mapping[str, Mapping[str, Any]], blocks: Sequence[Mapping[str, Any]], first: str,
               second: str) -> dict[str, Any]:
    x, y = arms[first], arms[second]
    pairs = paired_differences(blocks, first, second)
    return {
        "added_p50_ms_paired_blocks": round(statistics.median(pairs), 3),
        "paired_block_differences_ms": pairs,
        "added_pooled_p50_ms": round(x["p50_ms"] - y["p50_ms"], 3),
        "added_median_of_block_medians_ms": round(x["median_of_block_medians_ms"] - y["median_of_block_medians_ms"], 3),
        "p50_ratio": round(x["p50_ms"] / y["p50_ms"], 3),
        "p99_ratio": round(x["p99_ms"] / y["p99_ms"], 3),
    }


def compare(arms: Mapping[str, Mapping[str, Any]], blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each comparison is judged on the median of its paired block differences: on a shared machine the
    pooled p50s drift by more than the effect (the pooled numbers are reported beside it). The goal is
    gpu-steward's B-A; C-A, what a webhook that does nothing adds, is the floor under it."""
    out: dict[str, Any] = {key: {"arms": f"{first}-{second}", "label": label, **difference(arms, blocks, first, second)}
                           for key, (first, second, label) in COMPARISONS.items()}
    added, floor = out["B_vs_A"]["added_p50_ms_paired_blocks"], out["C_vs_A"]["added_p50_ms_paired_blocks"]
    return {
        **out,
        "goal": f"under {GOAL_ADDED_P50_MS:g} ms added to p50 pod creation (gpu-steward vs none)",
        "goal_met": added < GOAL_ADDED_P50_MS,
        "floor_ms": floor,
        "floor": "added to p50 pod creation by a no-op Python aiohttp webhook over TLS (no-op vs none)",
    }


def table(results: Mapping[str, Any]) -> str:
    arms, verdict = results["arms"], results["comparison"]
    lines = [f"{'arm':<20} {'pods':>5} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
             f"{'blk med':>8} {'webhook calls':>13} {'wh mean ms':>10} {'wh p50~':>8} {'wh p99~':>8} "
             f"{'own mean':>8} {'own p50~':>8}"]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    stray = []
    for arm, row in arms.items():
        hook, own = row["webhook_admission"], row["webhook_handler"]
        lines.append(
            f"{arm + ' ' + row['label']:<20} {row['pods']:>5} {row['p50_ms']:>8.3f} {row['p90_ms']:>8.3f} "
            f"{row['p99_ms']:>8.3f} {row['mean_ms']:>8.3f} {row['median_of_block_medians_ms']:>8.3f} "
            f"{hook['calls']:>13} {cell(hook['mean_ms']):>10} {cell(hook['p50_ms_from_buckets']):>8} "
            f"{cell(hook['p99_ms_from_buckets']):>8} {cell(own['mean_ms']):>8} {cell(own['p50_ms_from_buckets']):>8}"
        )
        stray += [f"{arm}: {calls} to {name}" for name, calls in hook["calls_by_webhook"].items()
                  if calls and name != hook["webhook"]]
    for key, (first, second, _) in COMPARISONS.items():
        diff = verdict[key]
        lines.append(
            f"{diff['label'] + ' (' + diff['arms'] + '):':<36} {diff['added_p50_ms_paired_blocks']:+7.3f} ms "
            f"(median of {len(diff['paired_block_differences_ms'])} paired block differences); pooled p50 "
            f"{diff['added_pooled_p50_ms']:+.3f} ms ({first}/{second} {diff['p50_ratio']:.2f}x), block medians "
            f"{diff['added_median_of_block_medians_ms']:+.3f} ms, p99 {first}/{second} {diff['p99_ratio']:.2f}x"
        )
    lines.append(f"goal {verdict['goal']}: {'MET' if verdict['goal_met'] else 'NOT MET'}; "
                 f"floor {verdict['floor_ms']:+.3f} ms = what a no-op Python aiohttp webhook adds here")
    if stray:
        lines.append(f"WARNING: webhook calls outside their arm's blocks: {'; '.join(stray)}")
    load = results["load_average"]
    lines.append(f"load average (1/5/15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="20x8g2d", help="kwok GPU nodes (localcluster.parse_nodes)")
    parser.add_argument("--pods", type=int, default=300, help="pods created per arm")
    parser.add_argument("--block", type=int, default=25, help="pods per block; blocks rotate A B C C B A …")
    parser.add_argument("--warmup", type=int, default=10, help="uncounted pods per arm before measuring")
    parser.add_argument("--quick", action="store_true", help="CI size: 40 pods per arm in blocks of 10")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    # Arm C's server: this script again, as a process of its own (`noop_webhook`).
    parser.add_argument("--serve-noop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert-file", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:  # 4 rounds: A B C C B A twice, balanced
        args.pods, args.block, args.warmup = 40, 10, 5
    if args.pods < 1 or args.block < 1:
        parser.error("--pods and --block must be positive")
    gpus = sum(g.count * g.gpus for g in localcluster.parse_nodes(args.nodes))
    if gpus < args.block + args.warmup:
        parser.error(f"--nodes {args.nodes} has {gpus} GPUs: fewer than a block's (or the warm-up's) pods")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_noop:  # aiohttp's run_app ends on SIGTERM by itself
        serve_noop(port=args.port, cert_file=args.cert_file, key_file=args.key_file)
        return 0
    with localcluster.sigterm_as_interrupt():
        return _main(args, command=list(argv if argv is not None else sys.argv[1:]))


def _main(args: argparse.Namespace, *, command: list[str]) -> int:
    bin_dir = localcluster.ensure_binaries(progress=lambda line: None)
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    config = settings.Settings()
    # The no-op server needs no cluster: started here, in this thread, so a plain `with` always stops it.
    with tempfile.TemporaryDirectory(prefix="webhook-apiserver-") as tmp, \
            localcluster.LocalCluster(bin_dir, progress=say) as cluster, \
            noop_webhook(pathlib.Path(tmp)) as (noop_url, noop_cert):
        cluster.add_nodes(localcluster.gpu_nodes(args.nodes, names=config.names), timeout_seconds=120)
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                       *demo.priority_classes(config)])  # the tier classes the webhook assigns
        say(f"cluster with {args.nodes} ready; {args.pods} pods per arm in blocks of {args.block}")
        measured = asyncio.run(
            measure(cluster, args, workdir=pathlib.Path(tmp), noop_url=noop_url, noop_cert=noop_cert))
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
