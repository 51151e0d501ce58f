"""No gate outlives its controller (admission/gate_lifter.py), on the real 1.37.2 control plane: a pod held by our
gate while the descheduler lives stays gated; once the descheduler is killed for good, a webhook replica watching its
Lease lifts our gate (only ours, no pin) past the bound, and the pod is an ordinary pending pod that then runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import ssl
import sys
import time

import pytest
import yaml

from common import label_values, settings
from gpu_steward_lab import certs, localcluster
from tests.e2e import conftest
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
STALE_SECONDS = 3  # the webhook's admission.controller_stale_seconds (over the e2e Lease's 1 s renewal)
BOUND_SECONDS = 6  # the webhook's descheduler.gangs.max_wait_seconds
KUEUE_GATE = "kueue.x-k8s.io/admission"


def start_lifter(cluster: localcluster.LocalCluster, workdir: pathlib.Path,
                 election: settings.LeaderElection, *, gang_max_wait_seconds: float = 1800
                 ) -> localcluster.ManagedProcess:
    """A webhook replica (not registered: only its gate lifter acts here) watching the descheduler's Lease."""
    serving = certs.generate(workdir / "tls", dns_names=["localhost"])
    port = localcluster.free_port()
    config = {
        "webhook": {"host": "127.0.0.1", "port": port, "cert_file": str(serving.cert_file),
                    "key_file": str(serving.key_file)},
        "kubernetes": {"kubeconfig": str(cluster.kubeconfig)},
        "admission": {"controller_stale_seconds": STALE_SECONDS},
        "descheduler": {"leader_election": election.model_dump(mode="json", exclude_none=True),
                        "gangs": {"max_wait_seconds": BOUND_SECONDS, "resync_seconds": 1,
                                  "gang_max_wait_seconds": gang_max_wait_seconds}},
    }
    config_file = workdir / "lifter.yaml"
    config_file.write_text(yaml.safe_dump(config))
    process = localcluster.ManagedProcess(
        "webhook-lifter", [sys.executable, "-m", "gpu_steward", "webhook", "--config", str(config_file)],
        log_file=workdir / "lifter.log", env={**os.environ, "PYTHONPATH": str(conftest.REPO)})
    process.start()
    process.wait_http_ok(f"https://127.0.0.1:{port}/readyz",
                         ssl_context=ssl.create_default_context(cafile=str(serving.ca_file)))
    return process


def test_gate_is_lifted_once_the_descheduler_is_killed_for_good(
    gpu_cluster: conftest.GpuCluster, descheduler_factory: conftest.StartDescheduler, plain_namespace: str,
    spare_node: str, tmp_path: pathlib.Path,
) -> None:
    cluster, ns = gpu_cluster.cluster, plain_namespace
    kube.wait_gpus_free(cluster)
    # The descheduler keeps a pod that fits nowhere gated for 600 s: far past the webhook's bound.
    descheduler = descheduler_factory({"descheduler": {"reclaim": {"enabled": False},
                                                       "gangs": {"max_wait_seconds": 600}}})
    lifter = start_lifter(cluster, tmp_path, descheduler.settings.descheduler.leader_election)
    try:
        pool = f"e2e-pool-{secrets.token_hex(3)}"
        waiting = kube.pod("waiting", namespace=ns, gpus=4, gates=[NAMES.gate], node_selector={"e2e-pool": pool})
        foreign = kube.pod("foreign", namespace=ns, gpus=4, gates=[KUEUE_GATE, NAMES.gate],
                           node_selector={"e2e-pool": pool})
        for pod in (waiting, foreign):
            cluster.kubectl("create", "-f", "-", input=json.dumps(pod))

        # Past the webhook's bound, while the descheduler lives: nothing is lifted.
        held_until = time.monotonic() + BOUND_SECONDS + STALE_SECONDS + 2
        while time.monotonic() < held_until:
            pods = kube.pods(cluster, ns)
            assert all(NAMES.gate in kube.gates(p) for p in pods.values()), "lifted while the controller lives"
            time.sleep(0.5)

        os.kill(descheduler.process.pid or 0, signal.SIGKILL)  # for good: the Lease is never released nor renewed

        def lifted() -> dict[str, dict[str, object]] | None:
            pods = kube.pods(cluster, ns)
            return pods if all(NAMES.gate not in kube.gates(p) for p in pods.values()) else None

        pods = kube.poll("our gate lifted from both", lifted, timeout_seconds=STALE_SECONDS + 20)
        assert kube.gates(pods["foreign"]) == [KUEUE_GATE], "only our gate: Kueue's stays"
        _, why = label_values.stamped(pods["waiting"]["metadata"]["annotations"][NAMES.release])
        assert why.startswith("released unpinned by the webhook: the descheduler's Lease last seen renewed"), why
        assert "affinity" not in pods["waiting"]["spec"], "no pin: an ordinary pending pod"

        cluster.kubectl("label", "node", spare_node, f"e2e-pool={pool}")
        placed = kube.poll("waiting runs", lambda: (p := kube.pods(cluster, ns)["waiting"])["spec"].get("nodeName")
                           and p)
        assert placed["spec"]["nodeName"] == spare_node
    finally:
        lifter.stop()
