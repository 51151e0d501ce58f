"""Cost of reading the learned idle windows' history (descheduler/reclaim/idle_history.py) from a real Prometheus.

    python benchmarks/idle_history_cost.py [--gpus 250 1000] [--hours 6] [--repeats 5] [--out FILE]

For each GPU count: `--hours` of 15 s DCGM history, one series per GPU shaped as dcgm-exporter writes it
(pod/namespace/Hostname/gpu/UUID labels; 30 % of pods idle, the rest alternating busy and idle), backfilled
with promtool into a real Prometheus; then the Learner's two kinds of read, each timed `--repeats` times
through the product's client and the Learner's own fold:
- backfill chunk: `chunk_seconds` (6 h by default) of history in one range query at the 5-min step;
- refresh: the last `refresh_seconds` (30 min).
Each query's wall time and Prometheus' CPU seconds for it (wall counts a loaded machine's neighbours; CPU does not).
Goal (issue 21's, for every query): < 1 s at 10,000 GPUs. The history's cost is linear in GPUs x hours read
(each raw sample is read once), so it is fitted on the measured counts and extrapolated; printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import dcgm_history  # noqa: E402
from common import prometheus, settings_loader  # noqa: E402
from descheduler.reclaim import idle_history  # noqa: E402
from gpu_steward_lab import localprometheus  # noqa: E402

SCRAPE_SECONDS = 15
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "idle_history_cost.json"


def history(gpus: int, *, hours: float) -> list[localprometheus.Series]:
    out = []
    span = int(hours * 3600)
    for i in range(gpus):
        idle = i % 10 < 3
        samples = [(float(ago), 1.0 if idle or (ago // 1200) % 2 else 60.0)
                   for ago in range(0, span, SCRAPE_SECONDS)]
        labels = {"gpu": str(i % 8), "UUID": f"GPU-{i:06d}", "Hostname": f"node-{i // 8}", "namespace": "team",
                  "pod": f"w{i // 4}-7d9f8-{i:05d}", "container": "main", "modelName": "NVIDIA H100"}
        out.append(localprometheus.Series("DCGM_FI_DEV_GPU_UTIL", labels, samples))
    return out


class Timed:
    """The product's client, timing each range query and counting the points it returns."""

    def __init__(self, client: prometheus.Client, *, pid: int) -> None:
        self.client = client
        self.pid = pid  # Prometheus' process: its CPU seconds per query
        self.seconds: list[float] = []
        self.cpu: list[float] = []
        self.points = 0
        self.series = 0

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        started, used = time.perf_counter(), dcgm_history.cpu_seconds(self.pid)
        rows = await self.client.query_range(promql, start=start, end=end, step=step)
        self.seconds.append(time.perf_counter() - started)
        self.cpu.append(dcgm_history.cpu_seconds(self.pid) - used)
        self.points, self.series = sum(len(r.get("values") or ()) for r in rows), len(rows)
        return rows


async def measure(url: str, *, pid: int, now: float, repeats: int) -> dict[str, Any]:
    base = settings_loader.load().descheduler.reclaim.learned_window
    out = {}
    for name, span in (("chunk", base.chunk_seconds), ("refresh", base.refresh_seconds)):
        # A Learner whose whole look-back is this span: its first read is one query of exactly that much history.
        config = settings_loader.load(overrides={
            "prometheus": {"url": url, "timeout_seconds": 60},
            "descheduler": {"reclaim": {"learned_window": {"lookback_seconds": span, "chunk_seconds": span}}}})
        timed = Timed(prometheus.Client(config.prometheus), pid=pid)
        reads = []
        try:
            for _ in range(repeats):
                learner = idle_history.Learner(config=config, prometheus=timed)
                started = time.perf_counter()
                await learner.read(threshold=5.0, now=now)
                reads.append(time.perf_counter() - started)
                assert learner.fresh(now) and learner.errors == 0
        finally:
            timed.client.close()
        out[name] = {"span_seconds": span, "query_seconds_median": round(statistics.median(timed.seconds), 3),
                     "query_seconds_max": round(max(timed.seconds), 3),
                     "prometheus_cpu_seconds_median": round(statistics.median(timed.cpu), 3),
                     "prometheus_cpu_seconds_max": round(max(timed.cpu), 3), "points": timed.points,
                     "series": timed.series, "read_and_fold_seconds_median": round(statistics.median(reads), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="CI size: 100 GPUs, 1 h of history, 2 repeats")
    args = parser.parse_args()
    rows = []
    if args.quick:
        args.gpus, args.hours, args.repeats = [100], 1.0, 2
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="idle-history-") as tmp:
            started = time.perf_counter()
            now = float(int(time.time()))
            server = localprometheus.start_prometheus(pathlib.Path(tmp), history(gpus, hours=args.hours), now=now)
            try:
                backfill = time.perf_counter() - started
                found = asyncio.run(measure(server.url, pid=server.process.pid, now=now, repeats=args.repeats))
            finally:
                server.stop()
        rows.append({"gpus": gpus, "history_hours": args.hours, "backfill_seconds": round(backfill, 1), **found})
        print(json.dumps(rows[-1]))
    # Linear in GPUs: seconds per GPU from the largest count, times 10,000.
    top = rows[-1]
    fit = {kind: round(top[kind]["query_seconds_median"] / top["gpus"] * 10_000, 2) for kind in ("chunk", "refresh")}
    result = {"command": " ".join(["python", "benchmarks/idle_history_cost.py", *sys.argv[1:]]), "rows": rows,
              "extrapolated_seconds_at_10000_gpus": fit,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average": [round(x, 2) for x in os.getloadavg()]}}
    print(f"extrapolated to 10,000 GPUs (linear from {top['gpus']}): {fit}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
