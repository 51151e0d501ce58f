"""gpu-steward's own processes on a local cluster (demo, benchmarks): the webhook, registered by URL."""

from __future__ import annotations

import contextlib
import pathlib
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

from common import settings
from gpu_steward_lab import certs, localcluster

REGISTRATION = "gpu-steward"


def process(command: str, config_file: pathlib.Path, *, workdir: pathlib.Path,
            flags: Sequence[str] = ()) -> localcluster.ManagedProcess:
    """`gpu-steward COMMAND --config FILE [FLAGS]` as a process of this Python, logging to WORKDIR/COMMAND.log."""
    return localcluster.ManagedProcess(
        command, [sys.executable, "-m", "gpu_steward", command, "--config", str(config_file), *flags],
        log_file=workdir / f"{command}.log")


LEASE_AGE = "gpu_steward_admission_controller_lease_age_seconds"


def _sees_controller(url: str, trust: ssl.SSLContext) -> bool:
    """The webhook's /metrics says it saw the descheduler's Lease renewed (so it gates governed pods)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=trust) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return False
    ages = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(LEASE_AGE)]
    return bool(ages) and 0 <= ages[0] < settings.Admission().controller_stale_seconds


@contextlib.contextmanager
def webhook(
    cluster: localcluster.LocalCluster, workdir: pathlib.Path, *, config: Mapping[str, Any],
    descheduler: bool = False, descheduler_metrics_port: int | None = None, timeout_seconds: float = 60,
) -> Iterator[pathlib.Path]:
    """Run the webhook with `config` (settings; kubeconfig, listen address and TLS are filled in), wait
    until ready, register it with the API server; yield the settings file (other processes may share
    it). `descheduler`: run the descheduler too, with the same settings, and yield only once the webhook has
    seen its Lease renewed, so every governed pod created from then on is placed at release; with
    `descheduler_metrics_port` it serves its /metrics there (plain HTTP, `--metrics-port`). On exit the
    registration is removed and the processes stopped."""
    cert = certs.generate(workdir / "tls")
    port = localcluster.free_port()
    data = settings.merge(dict(config), {
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
        "webhook": {"host": "127.0.0.1", "port": port, "cert_file": str(cert.cert_file),
                    "key_file": str(cert.key_file)},
    })
    config_file = workdir / "gpu-steward.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    server = process("webhook", config_file, workdir=workdir)
    flags = ("--metrics-port", str(descheduler_metrics_port)) if descheduler_metrics_port else ()
    releaser = process("descheduler", config_file, workdir=workdir, flags=flags)
    try:
        server.start()
        trust = ssl.create_default_context(cafile=str(cert.ca_file))
        server.wait_http_ok(f"https://127.0.0.1:{port}/readyz", ssl_context=trust, timeout_seconds=60)
        cluster.apply([localcluster.mutating_webhook_configuration(
            name=REGISTRATION, url=f"https://127.0.0.1:{port}/mutate", ca_bundle=cert.ca_bundle)])
        if descheduler:
            releaser.start()
            deadline = time.monotonic() + timeout_seconds
            while not _sees_controller(f"https://127.0.0.1:{port}/metrics", trust):
                if not releaser.running() or time.monotonic() > deadline:
                    raise localcluster.HarnessError(
                        f"the webhook did not see the descheduler lead within {timeout_seconds:.0f} s:\n"
                        f"{releaser.log_tail()}")
                time.sleep(0.5)
        yield config_file
    finally:
        with contextlib.suppress(localcluster.HarnessError):
            cluster.kubectl("delete", "mutatingwebhookconfiguration", REGISTRATION, "--ignore-not-found", check=False)
        releaser.stop()
        server.stop()
