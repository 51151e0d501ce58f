"""A real, local Prometheus (Debian `prometheus` + `promtool`) for the demo, tests and benchmarks:
history backfilled with promtool, then the server on loopback, optionally scraping targets.

    server = start_prometheus(workdir, [Series("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, [(120, 3.0)])])
    try: ... query server.url ...
    finally: server.stop()

Verified with Debian's prometheus/promtool 2.42:
- `promtool tsdb create-blocks-from openmetrics FILE DIR` before start makes the history queryable
  at once, including samples only seconds old: no `--storage.tsdb.allow-overlapping-blocks` (deprecated
  since 2.39; overlapping blocks are always allowed) and no waiting for the head block's range.
- The file: one `# TYPE` per metric family with its samples contiguous, timestamps in seconds
  ascending per series, `# EOF` last. An empty history is skipped (promtool refuses it).
- A plain instant selector looks back 5 minutes (the default lookback delta), so a series whose
  last sample is older than that has vanished from instant queries at `now`.
- With scrape targets, live samples go to the head block beside the backfilled blocks; both are
  queried together. The first scrape lands about one scrape interval after start.
- Ready (`/-/ready` answers 200) well under a second after start on this machine.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
READY_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Series:
    """One time series: `samples` are (seconds before now, value), in any order."""

    metric: str
    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]


@dataclasses.dataclass
class PrometheusServer:
    url: str
    now: float  # the "now" the history was written against (unix seconds)
    process: subprocess.Popen[bytes]
    log: pathlib.Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def openmetrics(series: Sequence[Series], *, now: float) -> str:
    """The OpenMetrics text promtool backfills from."""
    lines: list[str] = []
    families: dict[str, list[Series]] = {}
    for s in series:
        families.setdefault(s.metric, []).append(s)
    for metric, members in families.items():
        lines.append(f"# TYPE {metric} gauge")
        for s in members:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            for ago, value in sorted(s.samples, key=lambda sample: -sample[0]):
                if ago < 0:
                    raise ValueError(f"{metric}{{{labels}}}: sample {ago}s in the future")
                lines.append(f"{metric}{{{labels}}} {_number(value)} {now - ago:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config(scrape_targets: Sequence[str], scrape_interval: str) -> str:
    lines = ["global:", f"  scrape_interval: {scrape_interval}", f"  evaluation_interval: {scrape_interval}"]
    if scrape_targets:
        targets = ", ".join(f'"{t}"' for t in scrape_targets)
        lines += ["scrape_configs:", "  - job_name: test", "    static_configs:", f"      - targets: [{targets}]"]
    return "\n".join(lines) + "\n"


def _wait_ready(server: PrometheusServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {server.process.returncode}:\n{server.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"prometheus not ready after {READY_TIMEOUT_SECONDS}s:\n{server.log.read_text()}")


def start_prometheus(
    directory: pathlib.Path,
    series: Sequence[Series],
    *,
    scrape_targets: Sequence[str] = (),
    scrape_interval: str = "1s",
    now: float | None = None,
    port: int | None = None,
    flags: Sequence[str] = (),
) -> PrometheusServer:
    """Backfill `series` relative to `now` (default: the current time), start (with extra command-line `flags`,
    e.g. `--storage.tsdb.retention.time=2h`), wait until ready.

    The caller must `stop()` it (the `prometheus_factory` fixture does).
    """
    now = time.time() if now is None else now
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "data"
    if series:
        history = directory / "history.om"
        history.write_text(openmetrics(series, now=now))
        subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    config = directory / "prometheus.yml"
    config.write_text(_config(scrape_targets, scrape_interval))
    log = directory / "prometheus.log"
    port = port or free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                *flags,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(url=f"http://127.0.0.1:{port}", now=now, process=process, log=log)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server
