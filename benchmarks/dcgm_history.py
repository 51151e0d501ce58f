"""DCGM history at cluster scale in a real Prometheus, for benchmarks/reclaim_cycle.py.

    with dcgm_history.backfilled(workdir, devices, hours=4, scrape_seconds=15, ahead_seconds=...) as history:
        ... query history.server.url ...

A library, not a benchmark: running it does nothing.

One `DCGM_FI_DEV_GPU_UTIL` series per GPU, labelled as dcgm-exporter writes it (gpu, UUID, Hostname,
pod, namespace, container, modelName), a sample every `scrape_seconds` for `hours` before now and
`ahead_seconds` after it (so that at the store's time, minutes after the backfill started, the newest
sample is still one scrape old, as on a live Prometheus). Written as OpenMetrics in one pass (each
series' lines from one precomputed suffix list per value pattern: ~1 GB at 10,000 GPUs x 4 h x 15 s),
backfilled with `promtool tsdb create-blocks-from openmetrics`, then the server started on it. The
OpenMetrics file is deleted once the blocks exist; the whole directory when the context ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

from gpu_steward_lab import localprometheus

METRIC = "DCGM_FI_DEV_GPU_UTIL"
PATTERNS = 16  # distinct value sequences per kind (idle, busy): enough variety, cheap to write


@dataclasses.dataclass(frozen=True)
class Device:
    node: str
    index: int
    namespace: str
    pod: str
    idle: bool


@dataclasses.dataclass
class History:
    server: localprometheus.PrometheusServer
    now: float  # the time the history was written against
    samples: int
    openmetrics_bytes: int
    seconds: dict[str, float]  # write, promtool, start
    blocks_bytes: int


def _suffixes(*, idle: bool, count: int, start: int, step: int, rng: random.Random) -> list[str]:
    """`" value timestamp"` for every sample of one pattern: idle pods stay below 4 %, busy ones swing
    between 20 and 95 % (a busy pod is busy at its peak; it may dip, as serving pods do)."""
    low, high = (0, 3) if idle else (20, 95)
    return [f" {rng.randint(low, high)} {start + i * step}" for i in range(count)]


def write_openmetrics(path: pathlib.Path, devices: Sequence[Device], *, now: int, hours: float,
                      scrape_seconds: int, ahead_seconds: int, seed: int = 7, cluster: str | None = None,
                      twice_every: int = 0) -> tuple[int, int]:
    """Write the history; returns (samples, bytes). `cluster`: every series carries the external label
    `cluster="<cluster>"` (a shared store); `twice_every` N > 0: one GPU in N also reaches the store through a
    second scrape path (`job="federated"`, relabelled without the `gpu` label), with the same samples."""
    rng = random.Random(seed)
    start = now - int(hours * 3600)
    count = (int(hours * 3600) + ahead_seconds) // scrape_seconds + 1
    patterns = {idle: [_suffixes(idle=idle, count=count, start=start, step=scrape_seconds, rng=rng)
                       for _ in range(PATTERNS)] for idle in (True, False)}
    written = 0
    with path.open("w") as out:
        out.write(f"# TYPE {METRIC} gauge\n")
        scope = f'cluster="{cluster}",' if cluster else ""
        for n, device in enumerate(devices):
            paths = [f'gpu="{device.index}",']
            if twice_every and n % twice_every == 0:
                paths.append('job="federated",')
            for path_labels in paths:
                labels = (f'Hostname="{device.node}",UUID="GPU-{device.node}-{device.index}",{scope}container="main",'
                          f'{path_labels}modelName="NVIDIA H100 80GB HBM3",namespace="{device.namespace}",'
                          f'pod="{device.pod}"')
                prefix = f"{METRIC}{{{labels}}}"
                suffixes = patterns[device.idle][n % PATTERNS]
                out.write("\n".join(prefix + s for s in suffixes))
                out.write("\n")
                written += len(suffixes)
        out.write("# EOF\n")
    return written, path.stat().st_size


def _size(directory: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@contextlib.contextmanager
def backfilled(workdir: pathlib.Path, devices: Sequence[Device], *, hours: float, scrape_seconds: int,
               ahead_seconds: int, say: Callable[[str], None] = print, cluster: str | None = None,
               twice_every: int = 0) -> Iterator[History]:
    """Write, backfill and start; everything under `workdir` is removed at the end. `cluster`, `twice_every`:
    see `write_openmetrics`."""
    seconds: dict[str, float] = {}
    now = int(time.time())
    workdir.mkdir(parents=True, exist_ok=True)
    data, source = workdir / "data", workdir / "history.om"
    try:
        started = time.perf_counter()
        samples, size = write_openmetrics(source, devices, now=now, hours=hours, scrape_seconds=scrape_seconds,
                                          ahead_seconds=ahead_seconds, cluster=cluster, twice_every=twice_every)
        seconds["write"] = time.perf_counter() - started
        copies = (len(devices) + twice_every - 1) // twice_every if twice_every else 0
        say(f"  {len(devices) + copies} series, {samples:,} samples, {size / 1e6:.0f} MB of OpenMetrics in "
            f"{seconds['write']:.0f}s; promtool backfill ...")
        started = time.perf_counter()
        subprocess.run([localprometheus.PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                       check=True, capture_output=True, timeout=3600)
        seconds["promtool"] = time.perf_counter() - started
        source.unlink()
        blocks = _size(data)
        started = time.perf_counter()
        server = localprometheus.start_prometheus(workdir, [], now=now)
        seconds["start"] = time.perf_counter() - started
        say(f"  backfilled in {seconds['promtool']:.0f}s ({blocks / 1e6:.0f} MB of blocks); Prometheus ready in "
            f"{seconds['start']:.1f}s")
        try:
            yield History(server, float(now), samples, size, seconds, blocks)
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def rss_mb(pid: int, *, peak: bool = False) -> float:
    """Resident memory of a process (VmHWM: its peak) in MB."""
    key = "VmHWM:" if peak else "VmRSS:"
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (seconds): its cost, whatever else runs on the machine."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
