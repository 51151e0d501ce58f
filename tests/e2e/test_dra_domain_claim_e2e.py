"""A claim of the pod's own that keeps its DRA GPUs in one NVLink domain (`settings.dra.domain_claims`,
common/domain_claim.py), on the real 1.37.2 control plane: our webhook (with the setting on; the session's webhook is
stopped, registered and failing open) points a governed template-claim pod's entry at a claim of its own, and every
path that lifts our gate makes that claim first:

- release (the descheduler): the fragmented-node scenario of test_dra_domain_share_e2e.py, without gpu-steward and
  with one-domain claims in one run: every 2- and 4-GPU pod gets one domain and the 8-GPU pod runs, where first
  fit alone left it Pending (docs/placement.md); a claim is deleted with its pod;
- `gpu-steward release-gates` (the uninstall hook's command), on a pod made from `generateName`;
- the webhook's gate lifter, once the release controller is gone past the bound.
None is left `SchedulingGated` without a gate (what a pod un-gated before its claim exists shows).
"""

from __future__ import annotations

import json
import os
import pathlib
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from common import dra, settings, settings_loader
from gpu_steward_lab import certs, localcluster
from tests import builders
from tests.e2e import conftest
from tests.e2e import test_dra_domain_share_e2e as share
from tests.e2e.test_dra_domain_share_e2e import arms  # noqa: F401  (the fixture, used by name)
from tests.e2e.test_dra_e2e import renew  # noqa: F401  (the fixture, used by name)
from tests.support import kube

pytestmark = pytest.mark.e2e

NAMES = settings.Names()
REGISTRATION = "gpu-steward-e2e-domain-claims"
STALE_SECONDS = 3  # our webhook's admission.controller_stale_seconds (the e2e Lease is renewed by hand)
BOUND_SECONDS = 20  # our webhook's descheduler.gangs.max_wait_seconds: its gate lifter's bound


@pytest.fixture
def claims_webhook(control_plane: localcluster.LocalCluster, webhook_stopped: conftest.WebhookServer,
                   tmp_path: pathlib.Path) -> Iterator[settings.Settings]:
    """Our webhook with one-domain claims on, registered in place of the session's (stopped for the test)."""
    serving = certs.generate(tmp_path / "tls", dns_names=["localhost"])
    port = localcluster.free_port()
    config_file = tmp_path / "claims-webhook.yaml"
    config_file.write_text(yaml.safe_dump({
        "webhook": {"host": "127.0.0.1", "port": port, "cert_file": str(serving.cert_file),
                    "key_file": str(serving.key_file)},
        "kubernetes": {"kubeconfig": str(control_plane.kubeconfig)},
        "admission": {"controller_stale_seconds": STALE_SECONDS},
        "descheduler": {"gangs": {"max_wait_seconds": BOUND_SECONDS, "resync_seconds": 1}},
        "dra": {"domain_claims": True},
    }))
    loaded = settings_loader.load(config_file=config_file)
    process = localcluster.ManagedProcess(
        "claims-webhook", [sys.executable, "-m", "gpu_steward", "webhook", "--config", str(config_file)],
        log_file=tmp_path / "claims-webhook.log", env={**os.environ, "PYTHONPATH": str(conftest.REPO)})
    registration = localcluster.mutating_webhook_configuration(
        name=REGISTRATION, url=f"https://127.0.0.1:{port}/mutate", ca_bundle=serving.ca_bundle,
        excluded_namespaces=loaded.admission.excluded_namespaces, bypass_label=conftest.BYPASS_LABEL)
    try:
        process.start()
        process.wait_http_ok(f"https://127.0.0.1:{port}/readyz",
                             ssl_context=ssl.create_default_context(cafile=str(serving.ca_file)))
        control_plane.apply([registration])
        yield loaded
    finally:
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", REGISTRATION, "--ignore-not-found",
                              check=False)
        process.stop()


def _record(pod: dict[str, Any]) -> dra.Record:
    record = dra.recorded(pod, annotation=NAMES.domain_claim)
    assert record is not None, pod["metadata"].get("annotations")
    return record


def _own_claim(cluster: localcluster.LocalCluster, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's claim of its own, checked to be owned by it and named in its entry."""
    record = _record(pod)
    assert [e.get("resourceClaimName") for e in pod["spec"]["resourceClaims"]] == [record.claim]
    claim = cluster.kubectl_json("get", "resourceclaim", record.claim, "-n", namespace)
    assert [(o["kind"], o["uid"]) for o in claim["metadata"]["ownerReferences"]] == [("Pod", pod["metadata"]["uid"])]
    return claim


def _wait_routed(cluster: localcluster.LocalCluster, namespace: str, lease: Callable[[], None]) -> None:
    """Until the API server sends pods to our webhook: a dry-run template pod comes back rewritten."""
    probe = builders.pod("probe", namespace=namespace, mutate=builders.with_claim_template("t4"))
    probe["metadata"].pop("uid")
    probe.pop("status")
    for _ in range(50):
        lease()
        done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe),
                               check=False)
        if done.returncode == 0 and dra.recorded(json.loads(done.stdout), annotation=NAMES.domain_claim):
            return
        time.sleep(0.2)
    raise AssertionError(f"our webhook does not rewrite claim entries: {done.stdout or done.stderr}")


def test_one_domain_claims_keep_every_pod_in_one_domain_and_the_8_gpu_pod_runs(
        control_plane: localcluster.LocalCluster, arms: dict[str, list[str]],  # noqa: F811
        plain_namespace: str, namespace: str, renew: Callable[[], None],  # noqa: F811
        claims_webhook: settings.Settings, descheduler_factory: conftest.StartDescheduler) -> None:
    descheduler_factory({"descheduler": {"gangs": {"max_wait_seconds": 60}}, "dra": {"domain_claims": True}})
    control_plane.apply([builders.claim_template("t4", namespace=namespace, spec=builders.claim_spec(4))])
    _wait_routed(control_plane, namespace, renew)
    started = time.monotonic()
    without = share._run_arm(control_plane, plain_namespace, arms["without"], lambda: None)
    with_claims = share._run_arm(control_plane, namespace, arms["with"], renew)
    print(f"\nwithout gpu-steward: {without}\nwith one-domain claims: {with_claims}\n"
          f"one-domain share: without {share._share(without)}, with claims {share._share(with_claims)}; "
          f"never ran: without {[n for n, g in without.items() if not g[2]]}, "
          f"with claims {[n for n, g in with_claims.items() if not g[2]]}; {time.monotonic() - started:.0f} s")
    assert share._share(with_claims) == (4, 4), with_claims
    assert [n for n, g in with_claims.items() if not g[2]] == [], with_claims  # the 8-GPU pod ran too
    pods = kube.pods(control_plane, namespace)
    for name in ("two-a", "four-b"):  # the template pods: each through a claim of its own
        claim = _own_claim(control_plane, namespace, pods[name])
        requests = claim["spec"]["devices"]["requests"]
        assert [s["name"] for s in requests[0]["firstAvailable"]] == ["domain", "any"], requests
    # On the fragmented node (device 1 taken) first fit gives 0, 2, 3, 4: four-b got the free domain by its claim.
    results = _own_claim(control_plane, namespace, pods["four-b"])["status"]["allocation"]["devices"]["results"]
    assert {r["request"] for r in results} == {"gpus/domain"}, results
    claim = _record(pods["four-b"]).claim
    control_plane.kubectl("delete", "pod", "four-b", "-n", namespace, "--wait=true")
    kube.poll(f"claim {claim} deleted with its pod", lambda: control_plane.kubectl(
        "get", "resourceclaim", claim, "-n", namespace, check=False).returncode != 0 or None, timeout_seconds=60)


def _gated(cluster: localcluster.LocalCluster, namespace: str, lease: Callable[[], None], *, pool: str,
           generate: str) -> dict[str, Any]:
    """A 4-GPU template pod made from `generateName`, gated by our webhook and pointed at a claim of its own."""
    body = share._pod("", namespace=namespace, pool=pool, template="t4")
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = generate
    lease()
    made = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body)).stdout)
    assert kube.gates(made) == [NAMES.gate], made["spec"]
    return made


def _bound(cluster: localcluster.LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod once bound (un-gated before its claim existed, it would stay `SchedulingGated` with no gate)."""
    def check() -> dict[str, Any] | None:
        pod = kube.pods(cluster, namespace).get(name) or {}
        return pod if pod.get("spec", {}).get("nodeName") else None
    return kube.poll(f"{name} bound", check, timeout_seconds=share.WAIT_SECONDS)


def test_release_gates_and_the_gate_lifter_make_the_claim_before_lifting(
        control_plane: localcluster.LocalCluster, arms: dict[str, list[str]],  # noqa: F811
        namespace: str, renew: Callable[[], None], claims_webhook: settings.Settings) -> None:  # noqa: F811
    """No descheduler runs: `gpu-steward release-gates` lifts one pod's gate at once, and the webhook's gate lifter the
    other's once the Lease it watches is stale past its bound. Both make the claim from the template's request."""
    pool = control_plane.kubectl_json("get", "node", arms["with"][0])["metadata"]["labels"][share.POOL]
    control_plane.apply([builders.claim_template("t4", namespace=namespace, spec=builders.claim_spec(4))])
    _wait_routed(control_plane, namespace, renew)
    by_hook = _gated(control_plane, namespace, renew, pool=pool, generate="by-hook-")
    record = _record(by_hook)
    # Made from generateName: the webhook saw no name (its claim is named after generateName, not the pod's name).
    assert record.claim.startswith("by-hook-gpus-") and by_hook["metadata"]["name"] not in record.claim, record
    done = subprocess.run([sys.executable, "-m", "gpu_steward", "release-gates", "-n", namespace, "--kubeconfig",
                           str(control_plane.kubeconfig)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(conftest.REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    _bound(control_plane, namespace, by_hook["metadata"]["name"])
    claim = _own_claim(control_plane, namespace, kube.pods(control_plane, namespace)[by_hook["metadata"]["name"]])
    requests = claim["spec"]["devices"]["requests"]  # the template's request alone: no plan to ask first
    assert [(r["name"], r["exactly"]["count"], "firstAvailable" in r) for r in requests] == [("gpus", 4, False)]

    by_lifter = _gated(control_plane, namespace, renew, pool=pool, generate="by-lifter-")
    # Not renewed any more: past STALE_SECONDS the webhook sees no controller, past BOUND_SECONDS it lifts the gate.
    pod = _bound(control_plane, namespace, by_lifter["metadata"]["name"])
    assert NAMES.release in pod["metadata"]["annotations"], pod["metadata"]
    _own_claim(control_plane, namespace, pod)
