"""The Helm chart installs into a real control plane, and the webhook it configures answers real pod creates.

A cluster of its own: the chart registers a webhook for every namespace, which would also mutate the
other end-to-end tests' pods. The webhook process runs on this machine with exactly the settings
file and TLS material the release created (`values webhook.url` registers it by URL instead of the
in-cluster Service, which kwok cannot run).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import ssl
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from common import settings
from gpu_steward import localcluster
from tests.chart import helm

RELEASE, NAMESPACE = "gs", "gpu-steward"


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[localcluster.LocalCluster]:
    cluster = localcluster.LocalCluster(localcluster.ensure_binaries()).start()
    try:
        cluster.add_nodes(localcluster.gpu_nodes("2x8g2d", names=settings.Names()))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def installed(own_cluster: localcluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[int, helm.WebhookFiles, pathlib.Path]]:
    port = localcluster.free_port()
    helm.install(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                 values=helm.local_webhook_values(port))
    workdir = tmp_path_factory.mktemp("chart")
    files = helm.webhook_files(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                               dest=workdir / "release")
    env = {**os.environ, **files.env, "GPU_STEWARD_KUBERNETES__KUBECONFIG": str(own_cluster.kubeconfig)}
    server = localcluster.ManagedProcess(
        "webhook", [sys.executable, "-m", "gpu_steward", "webhook", "--host", "127.0.0.1", "--port", str(port)],
        log_file=workdir / "webhook.log", env=env)
    server.start()
    try:
        server.wait_http_ok(f"https://127.0.0.1:{port}/readyz",
                            ssl_context=ssl.create_default_context(cafile=str(files.ca)), timeout_seconds=60)
        own_cluster.kubectl("create", "namespace", "team")
        own_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", "team", "--timeout=30s")
        yield port, files, workdir
    finally:
        server.stop()
        with contextlib.suppress(helm.HelmError):
            helm.uninstall(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE)


def gpu_pod(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def create(cluster: localcluster.LocalCluster, pod: dict[str, Any]) -> dict[str, Any]:
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    got: dict[str, Any] = cluster.kubectl_json("get", "pod", pod["metadata"]["name"], "-n", "team")
    return got


def test_installed_chart_webhook_mutates_gpu_pods_and_honours_the_opt_out_label(
    own_cluster: localcluster.LocalCluster, installed: tuple[int, helm.WebhookFiles, pathlib.Path]
) -> None:
    classes = own_cluster.kubectl_json("get", "priorityclasses")["items"]
    ours = {c["metadata"]["name"]: c["value"] for c in classes if c["metadata"]["name"].startswith("gpu-steward-")}
    assert ours == {"gpu-steward-critical": 100_000, "gpu-steward-normal": 10_000, "gpu-steward-scavenger": 100}

    mutated = create(own_cluster, gpu_pod("train"))
    assert (mutated["spec"]["priorityClassName"], mutated["spec"]["priority"]) == ("gpu-steward-normal", 10_000)
    assert "tier normal: default tier" in mutated["metadata"]["annotations"]["gpu-steward.io/decision"]

    skipped = create(own_cluster, gpu_pod("opted-out", labels={"gpu-steward.io/skip": "true"}))
    assert "priorityClassName" not in skipped["spec"]  # the objectSelector kept it from the webhook
    assert "annotations" not in skipped["metadata"]


def test_upgrade_keeps_the_generated_ca_and_serving_certificate(
    own_cluster: localcluster.LocalCluster, installed: tuple[int, helm.WebhookFiles, pathlib.Path]
) -> None:
    port, before, workdir = installed
    helm.install(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                 values=helm.local_webhook_values(port, settings={"log_level": "DEBUG"}))
    after = helm.webhook_files(kubeconfig=own_cluster.kubeconfig, release=RELEASE, namespace=NAMESPACE,
                               dest=workdir / "upgraded")
    assert after.ca.read_bytes() == before.ca.read_bytes()
    assert after.cert.read_bytes() == before.cert.read_bytes()
    assert "log_level: DEBUG" in after.config.read_text()


@pytest.mark.parametrize(
    ("verb", "namespace", "allowed"),
    [
        pytest.param("list", NAMESPACE, "yes", id="list-in-the-release-namespace"),
        pytest.param("watch", NAMESPACE, "yes", id="watch-in-the-release-namespace"),
        pytest.param("update", NAMESPACE, "no", id="never-writes-it"),
        pytest.param("list", "team", "no", id="nowhere-else"),
    ],
)
def test_installed_webhook_may_watch_the_descheduler_lease_and_nothing_more(
    own_cluster: localcluster.LocalCluster, installed: tuple[int, helm.WebhookFiles, pathlib.Path],
    verb: str, namespace: str, allowed: str,
) -> None:
    """It gates pods for placement at release only while it sees the descheduler's leader Lease renewed."""
    account = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-gpu-steward-webhook"
    done = own_cluster.kubectl("auth", "can-i", verb, "leases.coordination.k8s.io", "-n", namespace,
                               "--as", account, check=False)
    assert done.stdout.strip() == allowed, done.stderr
