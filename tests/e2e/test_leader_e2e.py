"""Leader election with two real descheduler processes against the real API server: one leads (its
`gpu_steward_leader` gauge is 1, the other's 0); killed without a chance to release its Lease (SIGKILL),
it is replaced by the other within the lease duration, timed on the survivor's own clock."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
import yaml
from prometheus_client import parser

from gpu_steward_lab import localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 6, 4, 1


@dataclasses.dataclass
class Replicas:
    lease: str
    processes: dict[str, localcluster.ManagedProcess]
    ports: dict[str, int]  # each replica's /metrics port

    def gauge(self, name: str) -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gpu_steward_leader":
                    return float(sample.value)
        return None

    def holder(self, cluster: localcluster.LocalCluster) -> str:
        done = cluster.kubectl("get", "lease", self.lease, "-n", conftest.DESCHEDULER_NAMESPACE, "-o",
                               "jsonpath={.spec.holderIdentity}", check=False)
        return done.stdout.strip() if done.returncode == 0 else ""


@pytest.fixture
def replicas(control_plane: localcluster.LocalCluster, tmp_path: pathlib.Path) -> Iterator[Replicas]:
    """Replicas `a` and `b` of one descheduler (one Lease, their own /metrics ports); stopped by PID."""
    control_plane.apply([{"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": conftest.DESCHEDULER_NAMESPACE}}])
    group = Replicas(f"e2e-failover-{secrets.token_hex(4)}", {}, {})
    for name in ("a", "b"):
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump({
            "kubernetes": {"kubeconfig": str(control_plane.kubeconfig)},
            "descheduler": {
                "leader_election": {
                    "lease_name": group.lease, "lease_namespace": conftest.DESCHEDULER_NAMESPACE, "identity": name,
                    "lease_duration_seconds": LEASE_SECONDS, "renew_deadline_seconds": RENEW_SECONDS,
                    "retry_period_seconds": RETRY_SECONDS,
                },
                "reclaim": {"enabled": False},
                "gangs": {"enabled": False},  # nothing acts on the cluster: only the Lease is at stake
            },
        }))
        group.ports[name] = localcluster.free_port()
        group.processes[name] = localcluster.ManagedProcess(
            f"descheduler-{name}",
            [sys.executable, "-m", "gpu_steward", "descheduler", "--config", str(config),
             "--metrics-port", str(group.ports[name])],
            log_file=tmp_path / f"{name}.log", env=conftest._env_with_repo_on_path())
    try:
        for process in group.processes.values():
            process.start()
        yield group
    finally:
        for process in group.processes.values():
            process.stop()
        control_plane.kubectl("delete", "lease", group.lease, "-n", conftest.DESCHEDULER_NAMESPACE,
                              "--ignore-not-found", check=False)


def test_the_standby_takes_over_within_the_lease_duration_when_the_leader_dies(
    control_plane: localcluster.LocalCluster, replicas: Replicas
) -> None:
    first = kube.poll("a replica holds the Lease", lambda: replicas.holder(control_plane), timeout_seconds=60)
    other = "b" if first == "a" else "a"
    kube.poll("the leader's gauge is 1, the standby's 0",
              lambda: replicas.gauge(first) == 1 and replicas.gauge(other) == 0, timeout_seconds=60)
    deadline = time.monotonic() + 2 * LEASE_SECONDS  # longer than a Lease: the standby never takes a live one
    while time.monotonic() < deadline:
        assert replicas.holder(control_plane) == first
        time.sleep(0.5)

    pid = replicas.processes[first].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # no release: the standby must wait the Lease out
    killed = time.monotonic()
    kube.poll("the standby holds the Lease", lambda: replicas.holder(control_plane) == other,
              timeout_seconds=3 * LEASE_SECONDS, interval_seconds=0.1)
    took = time.monotonic() - killed
    # It saw the record change at most one retry before the kill; it may take the Lease one retry after expiry.
    assert LEASE_SECONDS - RETRY_SECONDS - 1 <= took <= LEASE_SECONDS + 2 * RETRY_SECONDS + 1, took
    kube.poll("the new leader's gauge is 1", lambda: replicas.gauge(other) == 1)
    assert replicas.processes[other].running(), replicas.processes[other].log_tail()
