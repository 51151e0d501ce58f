"""The webhook's own TLS: a CA and a serving certificate kept in a Secret, the CA written into the
caBundle of our MutatingWebhookConfiguration — the pattern of Gatekeeper's and Kueue's cert-controller.

Why here and not in the chart: a `helm template` that generates certificates makes new ones on every
render (Argo CD, Flux), and the API server would then distrust the running webhook. The chart renders
neither the Secret nor the caBundle, so renders are stable; each webhook replica, before it serves:

1. reads the Secret; creates it when missing (a replica that loses the create race reads the
   winner's), renews what expires within `renew_before_days` or no longer names our DNS names/IPs;
2. writes the pair to `webhook.cert_file`/`key_file` (the server reloads changed files);
3. writes the Secret's CA bundle into every webhook of the configuration.

Then it repeats every `check_seconds`: a re-apply that dropped the caBundle is repaired, and the
replicas converge on one Secret. A renewed CA is issued with the old one kept in `ca.crt` until it
expires, so a replica still serving a certificate of the old CA stays trusted during the rollover.

`decide` is pure (material + wanted names + now -> action and reason); the rest is the I/O shell.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import datetime
import enum
import logging
import os
import pathlib
from collections.abc import Callable
from typing import Any

from cryptography import exceptions, x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client
from kubernetes_asyncio import config as k8s_config

from common import kube, pki, settings

log = logging.getLogger(__name__)

CA_CERT, CA_KEY, CERT, KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
_PEM = serialization.Encoding.PEM
# A failed check is retried after this, however long check_seconds is: until the caBundle is written
# the API server cannot call us.
RETRY_SECONDS = 5.0
COMMON_NAME = "gpu-steward-webhook"


class Action(enum.StrEnum):
    KEEP = "keep"
    NEW_CA = "new-ca"  # a new CA (kept beside the old while that is valid) and a serving pair it signs
    NEW_CERT = "new-cert"  # a new serving pair from the current CA


@dataclasses.dataclass(frozen=True)
class Material:
    """The Secret's data, decoded. `ca_bundle` is every CA the API server should trust, current first."""

    ca_bundle: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def to_secret_data(self) -> dict[str, str]:
        raw = {CA_CERT: self.ca_bundle, CA_KEY: self.ca_key, CERT: self.cert, KEY: self.key}
        return {name: base64.b64encode(value).decode() for name, value in raw.items()}

    @classmethod
    def from_secret_data(cls, data: dict[str, str]) -> Material | None:
        try:
            raw = {name: base64.b64decode(data[name], validate=True) for name in (CA_CERT, CA_KEY, CERT, KEY)}
        except (KeyError, binascii.Error):
            return None
        return cls(ca_bundle=raw[CA_CERT], ca_key=raw[CA_KEY], cert=raw[CERT], key=raw[KEY])


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def _names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return set(sans.get_values_for_type(x509.DNSName)), {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}


def decide(material: Material | None, *, cfg: settings.ManagedTls, now: datetime.datetime) -> Decision:
    """What to do with the Secret's material, and why."""
    if material is None:
        return Decision(Action.NEW_CA, "no usable Secret (missing, or a key is absent or not base64)")
    try:
        cas = x509.load_pem_x509_certificates(material.ca_bundle)
    except ValueError as exc:
        return Decision(Action.NEW_CA, f"unreadable CA: {exc}")
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
    except ValueError as exc:
        return Decision(Action.NEW_CERT, f"unreadable serving certificate: {exc}")
    renew_at = now + datetime.timedelta(days=cfg.renew_before_days)
    ca = cas[0]
    if ca.not_valid_after_utc <= renew_at:
        return Decision(Action.NEW_CA, f"the CA expires {ca.not_valid_after_utc:%Y-%m-%d}, within the renewal window")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, exceptions.InvalidSignature):
        return Decision(Action.NEW_CERT, "the serving certificate is not signed by the current CA")
    if cert.not_valid_after_utc <= renew_at:
        expires = f"{cert.not_valid_after_utc:%Y-%m-%d}"
        return Decision(Action.NEW_CERT, f"the serving certificate expires {expires}, within the renewal window")
    dns, ips = _names(cert)
    if (dns, ips) != (set(cfg.dns_names), set(cfg.ip_addresses)):
        return Decision(
            Action.NEW_CERT,
            f"the serving certificate names {sorted(dns | ips)}, not {sorted(cfg.dns_names + cfg.ip_addresses)}",
        )
    return Decision(Action.KEEP, "valid, signed by the current CA, names as configured")


def _still_valid(bundle: bytes, *, now: datetime.datetime) -> list[x509.Certificate]:
    try:
        return [ca for ca in x509.load_pem_x509_certificates(bundle) if ca.not_valid_after_utc > now]
    except ValueError:
        return []


def issue(
    material: Material | None, decision: Decision, *, cfg: settings.ManagedTls, now: datetime.datetime
) -> Material:
    """The material `decision` asks for (KEEP: `material` as it is)."""
    if decision.action is Action.KEEP and material is not None:
        return material
    if decision.action is Action.NEW_CERT and material is not None:
        ca = pki.Pair(x509.load_pem_x509_certificates(material.ca_bundle)[0].public_bytes(_PEM), material.ca_key)
        bundle = material.ca_bundle
    else:
        ca = pki.issue_ca(
            common_name=f"{COMMON_NAME} CA",
            not_before=now,
            not_after=now + datetime.timedelta(days=cfg.ca_validity_days),
        )
        old = _still_valid(material.ca_bundle, now=now) if material is not None else []
        bundle = ca.cert + b"".join(cert.public_bytes(_PEM) for cert in old)
    leaf = pki.issue_serving(
        ca=ca,
        common_name=COMMON_NAME,
        dns_names=cfg.dns_names,
        ip_addresses=cfg.ip_addresses,
        not_before=now,
        not_after=now + datetime.timedelta(days=cfg.cert_validity_days),
    )
    return Material(ca_bundle=bundle, ca_key=ca.key, cert=leaf.cert, key=leaf.key)


# --- the I/O shell ----------------------------------------------------------------------------------


def _secret_path(cfg: settings.ManagedTls, *, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{cfg.secret_namespace}/secrets"
    return f"{base}/{name}" if name else base


def _configuration_path(cfg: settings.ManagedTls) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{cfg.webhook_configuration}"


async def _ensure_secret(
    api: client.ApiClient, cfg: settings.ManagedTls, *, now: datetime.datetime, request_timeout_seconds: float
) -> Material:
    """The Secret's material, created or renewed first if `decide` says so; a lost race re-reads."""
    for _ in range(3):
        try:
            secret: dict[str, Any] | None = await kube.get(
                api, _secret_path(cfg, name=cfg.secret_name), timeout_seconds=request_timeout_seconds
            )
        except kube.ApiError as exc:
            if exc.status != 404:
                raise
            secret = None
        current = Material.from_secret_data(secret.get("data") or {}) if secret else None
        decision = decide(current, cfg=cfg, now=now)
        if decision.action is Action.KEEP and current is not None:
            return current
        fresh = issue(current, decision, cfg=cfg, now=now)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            # kubernetes.io/tls: the type cert-manager and kubectl use (tls.crt + tls.key); type is immutable.
            "type": (secret or {}).get("type", "kubernetes.io/tls"),
            "data": fresh.to_secret_data(),
            "metadata": _kept_metadata(secret, name=cfg.secret_name, namespace=cfg.secret_namespace),
        }
        try:
            if secret is None:
                await kube.request(api, "POST", _secret_path(cfg), body=body, timeout_seconds=request_timeout_seconds)
            else:  # carries metadata.resourceVersion: a concurrent writer makes this 409
                await kube.request(
                    api,
                    "PUT",
                    _secret_path(cfg, name=cfg.secret_name),
                    body=body,
                    timeout_seconds=request_timeout_seconds,
                )
        except kube.ApiError as exc:
            if exc.status == 409:
                continue  # another replica wrote first: use what it wrote
            raise
        log.info(
            "webhook TLS Secret %s/%s: %s (%s)", cfg.secret_namespace, cfg.secret_name, decision.action, decision.reason
        )
        return fresh
    raise kube.ApiError(409, f"Secret {cfg.secret_namespace}/{cfg.secret_name} kept changing under us")


def _kept_metadata(current: dict[str, Any] | None, *, name: str, namespace: str) -> dict[str, Any]:
    """What an update carries over: identity, resourceVersion (optimistic concurrency), labels and owners."""
    meta = (current or {}).get("metadata") or {}
    kept = {key: meta[key] for key in ("resourceVersion", "labels", "annotations", "ownerReferences") if key in meta}
    return {**kept, "name": name, "namespace": namespace}


def _write_atomically(path: pathlib.Path, data: bytes, *, mode: int) -> bool:
    """Replace `path` by `data` in one rename (the server never reads half a file); False if unchanged."""
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    temporary.replace(path)
    return True


def _write_pair(material: Material, *, cert_file: pathlib.Path, key_file: pathlib.Path) -> None:
    # Key first: the server reloads when either changes and loads both, and a new key with the old
    # certificate fails to load (it keeps the previous pair) while the reverse would be served.
    key_changed = _write_atomically(key_file, material.key, mode=0o600)
    if _write_atomically(cert_file, material.cert, mode=0o644) or key_changed:
        log.info("webhook serving certificate written to %s", cert_file)


async def _inject(
    api: client.ApiClient, cfg: settings.ManagedTls, *, ca_bundle: bytes, request_timeout_seconds: float
) -> None:
    """Every webhook of our configuration trusts `ca_bundle`; a concurrent update (409) is retried."""
    encoded = base64.b64encode(ca_bundle).decode()
    for _ in range(3):
        configuration = await kube.get(api, _configuration_path(cfg), timeout_seconds=request_timeout_seconds)
        hooks = configuration.get("webhooks") or []
        stale = [hook["name"] for hook in hooks if (hook.get("clientConfig") or {}).get("caBundle") != encoded]
        if not stale:
            return
        for hook in hooks:
            hook.setdefault("clientConfig", {})["caBundle"] = encoded
        configuration.get("metadata", {}).pop("managedFields", None)
        try:
            await kube.request(
                api, "PUT", _configuration_path(cfg), body=configuration, timeout_seconds=request_timeout_seconds
            )
        except kube.ApiError as exc:
            if exc.status == 409:
                continue
            raise
        log.info(
            "caBundle written into MutatingWebhookConfiguration %s (webhooks %s)",
            cfg.webhook_configuration,
            ", ".join(stale),
        )
        return
    raise kube.ApiError(409, f"MutatingWebhookConfiguration {cfg.webhook_configuration} kept changing under us")


def _pair_files(webhook: settings.Webhook) -> tuple[pathlib.Path, pathlib.Path]:
    if webhook.cert_file is None or webhook.key_file is None:
        raise ValueError("webhook.managed_tls needs webhook.cert_file and webhook.key_file: where to write the pair")
    return pathlib.Path(webhook.cert_file), pathlib.Path(webhook.key_file)


async def reconcile(
    api: client.ApiClient,
    webhook: settings.Webhook,
    *,
    request_timeout_seconds: float,
    now: Callable[[], datetime.datetime],
) -> Material:
    """One pass: Secret, files, caBundle. Raises kube.ApiError (or OSError for the files)."""
    cfg = webhook.managed_tls
    cert_file, key_file = _pair_files(webhook)
    material = await _ensure_secret(api, cfg, now=now(), request_timeout_seconds=request_timeout_seconds)
    _write_pair(material, cert_file=cert_file, key_file=key_file)
    await _inject(api, cfg, ca_bundle=material.ca_bundle, request_timeout_seconds=request_timeout_seconds)
    return material


async def bootstrap(config: settings.Settings, *, attempts: int = 12) -> None:
    """Before serving: the pair on disk and the CA registered, retried for a while (the configuration
    may appear a moment after our pod in an install). Raises the last error if it never succeeds."""
    _pair_files(config.webhook)  # fail before any API call
    try:
        api = await kube.api_client(config.kubernetes)
    except k8s_config.ConfigException as exc:
        raise ValueError(f"no Kubernetes client configuration: {exc}") from exc
    try:
        for attempt in range(attempts):
            try:
                await reconcile(
                    api, config.webhook, request_timeout_seconds=config.kubernetes.request_timeout_seconds, now=_utcnow
                )
                return
            except (kube.ApiError, OSError) as exc:
                if attempt == attempts - 1:
                    raise
                log.warning(
                    "webhook TLS not ready (attempt %d/%d), retrying in %.0f s: %s",
                    attempt + 1,
                    attempts,
                    RETRY_SECONDS,
                    exc,
                )
                await asyncio.sleep(RETRY_SECONDS)
    finally:
        await api.close()


async def keep(api: client.ApiClient, webhook: settings.Webhook, *, request_timeout_seconds: float) -> None:
    """Re-check forever (until cancelled); errors are logged and retried soon."""
    while True:
        try:
            await reconcile(api, webhook, request_timeout_seconds=request_timeout_seconds, now=_utcnow)
            delay = webhook.managed_tls.check_seconds
        except (kube.ApiError, OSError) as exc:
            log.warning("webhook TLS check failed, retrying in %.0f s: %s", RETRY_SECONDS, exc)
            delay = min(RETRY_SECONDS, webhook.managed_tls.check_seconds)
        await asyncio.sleep(delay)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
