"""End-to-end fixtures: one real control plane per session (kube-apiserver, etcd, kube-scheduler,
kube-controller-manager, kwok), kwok GPU nodes, and our webhook process registered with the API server.

Every test under tests/e2e is marked `e2e`. If the control plane cannot be built or started the
fixtures fail (never skip): a missing control plane is a broken test environment, not a feature gap.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config

from common import settings, settings_loader
from gpu_steward_lab import certs, localcluster
from tests.support import kube

REPO = pathlib.Path(__file__).resolve().parents[2]
# The session's GPU nodes: 4 nodes of 8 GPUs in 2 NVLink domains, 2 nodes of 2 GPUs in one domain.
GPU_CLUSTER = "4x8g2d, 2x2g1d"
# Namespaces labelled with this are not sent to our webhook: tests of plain Kubernetes behaviour use them.
BYPASS_LABEL = "e2e.gpu-steward.io/bypass-webhook"
WEBHOOK_CONFIGURATION = "gpu-steward-e2e"
# Namespaces labelled with this may claim the critical tier by pod label (the webhook's tiers.label_claims).
CRITICAL_CLAIM_LABEL = "e2e.gpu-steward.io/may-claim-critical"
NATIVE_GANGS = {"GenericWorkload": True}
NATIVE_GANGS_API = {"scheduling.k8s.io/v1beta1": "true"}

Kubectl = Callable[..., Any]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def _progress(pytestconfig: pytest.Config) -> localcluster.Progress:
    """Show build/start progress live even under output capture (a cold build takes minutes)."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(message: str) -> None:
        with capture.global_and_fixture_disabled():
            sys.stderr.write(f"{message}\n")

    return say


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[localcluster.LocalCluster]:
    """The session's control plane, stopped (by PID) at the end even after failures, Ctrl-C or SIGTERM."""
    with localcluster.sigterm_as_interrupt():
        yield from _control_plane(pytestconfig)


def _control_plane(pytestconfig: pytest.Config) -> Iterator[localcluster.LocalCluster]:
    say = _progress(pytestconfig)
    problem: str | None = None
    try:
        bin_dir = localcluster.ensure_binaries(progress=say)
        # Native gang scheduling on (Kubernetes 1.37 beta, off by default): every test runs beside it, and
        # test_native_gangs_e2e shows which pods it takes over from us.
        # For a look inside kube-scheduler's queue: GPU_STEWARD_E2E_SCHEDULER_V=5 and GPU_STEWARD_E2E_KEEP_LOGS=dir.
        verbosity, keep = os.environ.get("GPU_STEWARD_E2E_SCHEDULER_V"), os.environ.get("GPU_STEWARD_E2E_KEEP_LOGS")
        cluster = localcluster.LocalCluster(bin_dir, progress=say, feature_gates=NATIVE_GANGS,
                                            runtime_config=NATIVE_GANGS_API,
                                            scheduler_verbosity=int(verbosity) if verbosity else None,
                                            keep_logs=pathlib.Path(keep) if keep else None).start()
    except localcluster.HarnessError as exc:
        problem = str(exc)  # failed outside the handler: the message is the whole story
    if problem is not None:
        pytest.fail(f"the local Kubernetes control plane is not available: {problem}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kubectl(control_plane: localcluster.LocalCluster) -> Kubectl:
    """`kubectl(*args, input=None, check=True)` against the session's cluster."""
    return control_plane.kubectl


@dataclasses.dataclass(frozen=True)
class GpuCluster:
    cluster: localcluster.LocalCluster
    description: str
    nodes: list[dict[str, Any]]  # the manifests as created

    @property
    def node_names(self) -> list[str]:
        return [node["metadata"]["name"] for node in self.nodes]


@pytest.fixture(scope="session")
def names() -> settings.Names:
    return settings.Names()


@pytest.fixture(scope="session")
def gpu_cluster(control_plane: localcluster.LocalCluster, names: settings.Names) -> GpuCluster:
    """The session's kwok GPU nodes (`GPU_CLUSTER`), all Ready."""
    nodes = localcluster.gpu_nodes(GPU_CLUSTER, names=names)
    control_plane.add_nodes(nodes)
    return GpuCluster(control_plane, GPU_CLUSTER, nodes)


@pytest.fixture
def spare_node(control_plane: localcluster.LocalCluster, names: settings.Names) -> Iterator[str]:
    """An 8-GPU kwok node of the test's own (two NVLink domains of 4), to cordon, delete or label; deleted after."""
    node = localcluster.gpu_nodes("1x8g2d", names=names, name_prefix=f"spare-{secrets.token_hex(3)}")[0]
    control_plane.add_nodes([node])
    name = str(node["metadata"]["name"])
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def _make_namespace(cluster: localcluster.LocalCluster, *, bypass_webhook: bool) -> Iterator[str]:
    name = f"e2e-{secrets.token_hex(4)}"
    labels = {BYPASS_LABEL: "true"} if bypass_webhook else {}
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}])
    # Pods are refused until the namespace's default ServiceAccount exists.
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    """A fresh namespace our webhook (when registered) sees; deleted after the test."""
    yield from _make_namespace(control_plane, bypass_webhook=False)


@pytest.fixture
def plain_namespace(control_plane: localcluster.LocalCluster) -> Iterator[str]:
    """A fresh namespace our webhook never sees: plain Kubernetes behaviour."""
    yield from _make_namespace(control_plane, bypass_webhook=True)


@pytest.fixture
async def kube_api(control_plane: localcluster.LocalCluster) -> AsyncIterator[client.ApiClient]:
    """A kubernetes_asyncio client for the session's cluster (one per test: its event loop)."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


@dataclasses.dataclass
class WebhookServer:
    """Our webhook as a subprocess, registered through a MutatingWebhookConfiguration."""

    process: localcluster.ManagedProcess
    port: int
    serving: certs.ServingCert
    config_file: pathlib.Path
    settings: settings.Settings

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mutate"

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.serving.ca_file))

    def start(self) -> None:
        self.process.start()
        self.process.wait_http_ok(f"https://127.0.0.1:{self.port}/readyz", ssl_context=self.ssl_context())

    def stop(self) -> None:
        """Stop the process (the registration stays: failurePolicy Ignore lets pods through)."""
        self.process.stop()


def _wait_routed(cluster: localcluster.LocalCluster, server: WebhookServer, *, attempts: int = 50) -> None:
    """Wait until the API server sends pods to the webhook: a dry-run GPU pod comes back with a decision."""
    probe = kube.pod("webhook-probe", namespace="default", gpus=1)
    decision = server.settings.names.decision
    for _ in range(attempts):
        done = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(probe), check=False
        )
        if done.returncode == 0 and decision in (yaml.safe_load(done.stdout)["metadata"].get("annotations") or {}):
            return
        if not server.process.running():
            break
        time.sleep(0.2)  # the API server picks up a new registration within about a second
    raise localcluster.HarnessError(
        f"registered, but a GPU pod created through the API server comes back without {decision}:\n"
        f"{done.stderr or done.stdout}\n{server.process.log_tail()}"
    )


@pytest.fixture(scope="session")
def webhook(
    control_plane: localcluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookServer]:
    """`python -m gpu_steward webhook` serving TLS on 127.0.0.1 and registered for pod CREATE.

    The tier PriorityClasses are created too (the chart does that in a real install): without them the
    Priority plugin rejects every pod the webhook tiers.
    """
    workdir = tmp_path_factory.mktemp("webhook")
    serving = certs.generate(workdir / "tls", dns_names=["localhost"])
    port = localcluster.free_port()
    config_file = workdir / "settings.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "webhook": {
                    "host": "127.0.0.1",
                    "port": port,
                    "cert_file": str(serving.cert_file),
                    "key_file": str(serving.key_file),
                },
                "kubernetes": {"kubeconfig": str(control_plane.kubeconfig)},
                "tiers": {"label_claims": [
                    {"name": "e2e", "tier": "critical", "namespace_labels": {CRITICAL_CLAIM_LABEL: "true"}}]},
            }
        )
    )
    loaded = settings_loader.load(config_file=config_file)
    process = localcluster.ManagedProcess(
        "webhook",
        [sys.executable, "-m", "gpu_steward", "webhook", "--config", str(config_file)],
        log_file=workdir / "webhook.log",
        env=_env_with_repo_on_path(),
    )
    server = WebhookServer(process, port, serving, config_file, loaded)
    classes = [
        kube.priority_class(c.name, value=c.value, preemption_policy=c.preemption_policy)
        for c in (loaded.tiers.for_tier(t) for t in settings.Tier)
    ]
    registration = localcluster.mutating_webhook_configuration(
        name=WEBHOOK_CONFIGURATION,
        url=server.url,
        ca_bundle=serving.ca_bundle,
        excluded_namespaces=loaded.admission.excluded_namespaces,
        bypass_label=BYPASS_LABEL,
    )
    problem: str | None = None
    try:
        control_plane.apply(classes)
        server.start()
        control_plane.apply([registration])
        _wait_routed(control_plane, server)
    except BaseException as exc:
        _unregister(control_plane, server)
        if not isinstance(exc, localcluster.HarnessError):
            raise
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"our webhook is not serving the API server: {problem}", pytrace=False)
    try:
        yield server
    finally:
        _unregister(control_plane, server)


def _unregister(cluster: localcluster.LocalCluster, server: WebhookServer) -> None:
    cluster.kubectl("delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--ignore-not-found", check=False)
    server.stop()


def _env_with_repo_on_path() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


@pytest.fixture
def webhook_stopped(control_plane: localcluster.LocalCluster, webhook: WebhookServer) -> Iterator[WebhookServer]:
    """The session's webhook process stopped (still registered) for one test; started and routed again after."""
    webhook.stop()
    try:
        yield webhook
    finally:
        webhook.start()
        _wait_routed(control_plane, webhook)


# --- the descheduler -------------------------------------------------------------------------------

DESCHEDULER_NAMESPACE = "gpu-steward-e2e"  # holds the descheduler's Leases


@dataclasses.dataclass
class Descheduler:
    """`python -m gpu_steward descheduler` with one test's settings; leading (it holds its Lease)."""

    process: localcluster.ManagedProcess
    config_file: pathlib.Path
    settings: settings.Settings


StartDescheduler = Callable[[dict[str, Any]], Descheduler]


@pytest.fixture
def descheduler_factory(
    control_plane: localcluster.LocalCluster, tmp_path: pathlib.Path
) -> Iterator[StartDescheduler]:
    """`start(settings) -> Descheduler`: the real descheduler process (gang release + idle reclaim) with
    short intervals merged under `settings`, returned once it leads; stopped by PID at teardown.

    Each start gets Leases of its own name, so it never waits for a predecessor's Lease to expire.
    """
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DESCHEDULER_NAMESPACE}}])
    started: list[Descheduler] = []

    def start(overrides: dict[str, Any]) -> Descheduler:
        run = f"e2e-{secrets.token_hex(4)}"
        base = {
            "kubernetes": {"kubeconfig": str(control_plane.kubeconfig)},
            "descheduler": {
                "leader_election": {
                    "lease_name": run,
                    "lease_namespace": DESCHEDULER_NAMESPACE,
                    "identity": run,
                    "lease_duration_seconds": 6,
                    "renew_deadline_seconds": 4,
                    "retry_period_seconds": 1,
                },
                "reclaim": {"interval_seconds": 1, "cooldown_lease_name": f"{run}-cooldowns"},
                "gangs": {"resync_seconds": 1},
            },
        }
        config_file = tmp_path / f"descheduler-{run}.yaml"
        config_file.write_text(yaml.safe_dump(base))
        loaded = settings_loader.load(config_file=config_file, overrides=overrides)
        config_file.write_text(yaml.safe_dump(loaded.model_dump(mode="json", exclude_none=True)))
        process = localcluster.ManagedProcess(
            "descheduler",
            [sys.executable, "-m", "gpu_steward", "descheduler", "--config", str(config_file)],
            log_file=tmp_path / f"descheduler-{run}.log",
            env=_env_with_repo_on_path(),
        )
        server = Descheduler(process, config_file, loaded)
        started.append(server)
        process.start()
        _wait_leading(control_plane, server, lease=run)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.process.stop()


def _wait_leading(cluster: localcluster.LocalCluster, server: Descheduler, *, lease: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.process.running():
            raise localcluster.HarnessError(f"the descheduler exited before leading:\n{server.process.log_tail()}")
        holder = cluster.kubectl(
            "get", "lease", lease, "-n", DESCHEDULER_NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}", check=False
        )
        if holder.returncode == 0 and holder.stdout.strip() == lease:
            return
        time.sleep(0.2)
    raise localcluster.HarnessError(
        f"the descheduler holds no Lease after {timeout:.0f} s:\n{server.process.log_tail()}"
    )
