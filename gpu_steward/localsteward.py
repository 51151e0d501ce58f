"""gpu-steward's own processes on a local cluster (demo, benchmarks): the webhook, registered by URL."""

from __future__ import annotations

import contextlib
import pathlib
import ssl
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from common import settings
from gpu_steward import certs, localcluster

REGISTRATION = "gpu-steward"


def process(command: str, config_file: pathlib.Path, *, workdir: pathlib.Path) -> localcluster.ManagedProcess:
    """`gpu-steward COMMAND --config FILE` as a process of this Python, logging to WORKDIR/COMMAND.log."""
    return localcluster.ManagedProcess(
        command, [sys.executable, "-m", "gpu_steward", command, "--config", str(config_file)],
        log_file=workdir / f"{command}.log")


@contextlib.contextmanager
def webhook(
    cluster: localcluster.LocalCluster, workdir: pathlib.Path, *, config: Mapping[str, Any]
) -> Iterator[pathlib.Path]:
    """Run the webhook with `config` (settings; kubeconfig, listen address and TLS are filled in), wait
    until ready, register it with the API server; yield the settings file (other processes may share
    it). On exit the registration is removed and the process stopped."""
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
    try:
        server.start()
        trust = ssl.create_default_context(cafile=str(cert.ca_file))
        server.wait_http_ok(f"https://127.0.0.1:{port}/readyz", ssl_context=trust, timeout_seconds=60)
        cluster.apply([localcluster.mutating_webhook_configuration(
            name=REGISTRATION, url=f"https://127.0.0.1:{port}/mutate", ca_bundle=cert.ca_bundle)])
        yield config_file
    finally:
        with contextlib.suppress(localcluster.HarnessError):
            cluster.kubectl("delete", "mutatingwebhookconfiguration", REGISTRATION, "--ignore-not-found", check=False)
        server.stop()
