"""The webhook's own TLS manager (admission/certmanager.py) against the real API server: replicas starting
together converge on one Secret, and a renewal keeps the CA the API server already trusts."""

from __future__ import annotations

import asyncio
import base64
import datetime
import pathlib
import secrets
from collections.abc import Iterator

import pytest
from kubernetes_asyncio import client

from admission import certmanager
from common import settings
from gpu_steward_lab import localcluster


@pytest.fixture
def registration(control_plane: localcluster.LocalCluster, namespace: str) -> Iterator[str]:
    """A MutatingWebhookConfiguration of two webhooks that no pod ever reaches (objectSelector)."""
    name = f"certs-e2e-{secrets.token_hex(4)}"
    never = {"matchExpressions": [{"key": "e2e.gpu-steward.io/never", "operator": "Exists"}]}
    hooks = [{
        "name": f"{hook}.certs.e2e.gpu-steward.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Ignore", "clientConfig": {"url": "https://127.0.0.1:1/mutate"}, "objectSelector": never,
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
    } for hook in ("a", "b")]  # fmt: skip
    control_plane.apply([{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                          "metadata": {"name": name}, "webhooks": hooks}])
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False)


def webhook(directory: pathlib.Path, *, namespace: str, registration: str, dns: str) -> settings.Webhook:
    directory.mkdir(parents=True, exist_ok=True)
    return settings.Webhook(
        cert_file=directory / "tls.crt", key_file=directory / "tls.key",
        managed_tls=settings.ManagedTls(enabled=True, secret_name="webhook-tls", secret_namespace=namespace,
                                        webhook_configuration=registration, dns_names=[dns]),
    )


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def test_replicas_converge_on_one_secret_and_a_renewal_keeps_the_ca(
    control_plane: localcluster.LocalCluster, kube_api: client.ApiClient, namespace: str, registration: str,
    tmp_path: pathlib.Path,
) -> None:
    replicas = [webhook(tmp_path / name, namespace=namespace, registration=registration, dns="wh.ns.svc")
                for name in ("a", "b", "c")]
    made = await asyncio.gather(*(certmanager.reconcile(kube_api, w, request_timeout_seconds=10, now=now)
                                  for w in replicas))
    assert made[0] == made[1] == made[2]  # the losers of the create race read the winner's Secret
    written = [pathlib.Path(r.cert_file) for r in replicas if r.cert_file is not None]
    assert len(written) == 3 and all(p.read_bytes() == made[0].cert for p in written)
    configuration = control_plane.kubectl_json("get", "mutatingwebhookconfiguration", registration)
    bundles = {hook["clientConfig"]["caBundle"] for hook in configuration["webhooks"]}
    assert bundles == {base64.b64encode(made[0].ca_bundle).decode()}

    # The Service was renamed: a new serving certificate from the same CA, so nothing the API server
    # trusts changes while replicas roll.
    renamed = webhook(tmp_path / "d", namespace=namespace, registration=registration, dns="renamed.ns.svc")
    renewed = await certmanager.reconcile(kube_api, renamed, request_timeout_seconds=10, now=now)
    assert (renewed.ca_bundle, renewed.ca_key) == (made[0].ca_bundle, made[0].ca_key)
    assert renewed.cert != made[0].cert
    stored = control_plane.kubectl_json("get", "secret", "webhook-tls", "-n", namespace)["data"]
    assert certmanager.Material.from_secret_data(stored) == renewed
