"""The webhook's own TLS material: what `decide` does with each state of the Secret, and what `issue` makes."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
from collections.abc import Callable

import pytest
from cryptography import x509

from admission import certmanager
from common import pki, settings
from gpu_steward import cli

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
CFG = settings.ManagedTls(enabled=True, dns_names=["wh.ns.svc"], ip_addresses=["127.0.0.1"], renew_before_days=30)


def material(*, ca_days: int = 3650, cert_days: int = 365, dns: tuple[str, ...] = ("wh.ns.svc",),
             ips: tuple[str, ...] = ("127.0.0.1",), other_ca: bool = False) -> certmanager.Material:
    ca = pki.issue_ca(common_name="ca", not_before=NOW - DAY, not_after=NOW + ca_days * DAY)
    signer = pki.issue_ca(common_name="other", not_before=NOW - DAY, not_after=NOW + ca_days * DAY) if other_ca else ca
    leaf = pki.issue_serving(ca=signer, common_name="wh", dns_names=dns, ip_addresses=ips, not_before=NOW - DAY,
                             not_after=NOW + cert_days * DAY)
    return certmanager.Material(ca_bundle=ca.cert, ca_key=ca.key, cert=leaf.cert, key=leaf.key)


def garbled() -> certmanager.Material:
    return dataclasses.replace(material(), cert=b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")


def garbled_ca() -> certmanager.Material:
    return dataclasses.replace(material(), ca_bundle=b"junk")


@pytest.mark.parametrize(
    ("make", "action", "reason"),
    [
        pytest.param(lambda: None, certmanager.Action.NEW_CA, "no usable Secret", id="no-secret"),
        pytest.param(garbled_ca, certmanager.Action.NEW_CA, "unreadable CA", id="garbled-ca"),
        pytest.param(garbled, certmanager.Action.NEW_CERT, "unreadable serving certificate", id="garbled-certificate"),
        pytest.param(lambda: material(ca_days=20), certmanager.Action.NEW_CA, "the CA expires 2026-06-21",
                     id="ca-in-renewal-window"),
        pytest.param(lambda: material(other_ca=True), certmanager.Action.NEW_CERT, "not signed by the current CA",
                     id="cert-of-another-ca"),
        pytest.param(lambda: material(cert_days=29), certmanager.Action.NEW_CERT,
                     "the serving certificate expires 2026-06-30", id="cert-in-renewal-window"),
        pytest.param(lambda: material(dns=("old.ns.svc",)), certmanager.Action.NEW_CERT,
                     "names ['127.0.0.1', 'old.ns.svc'], not ['127.0.0.1', 'wh.ns.svc']", id="cert-names-changed"),
        pytest.param(lambda: material(ips=()), certmanager.Action.NEW_CERT,
                     "names ['wh.ns.svc'], not ['127.0.0.1', 'wh.ns.svc']", id="cert-lacks-the-ip"),
        pytest.param(lambda: material(cert_days=31), certmanager.Action.KEEP, "valid, signed by the current CA",
                     id="valid-just-outside-the-window"),
    ],
)
def test_decide(make: Callable[[], certmanager.Material | None], action: certmanager.Action, reason: str) -> None:
    decision = certmanager.decide(make(), cfg=CFG, now=NOW)
    assert (decision.action, reason in decision.reason) == (action, True), decision.reason


def test_secret_data_round_trips_and_a_missing_key_is_no_material() -> None:
    got = material()
    data = got.to_secret_data()
    assert certmanager.Material.from_secret_data(data) == got
    assert certmanager.Material.from_secret_data({k: v for k, v in data.items() if k != "ca.key"}) is None
    assert certmanager.Material.from_secret_data({**data, "tls.crt": "%%%"}) is None


def _bundle(material: certmanager.Material) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(material.ca_bundle)


@pytest.mark.parametrize("make", [pytest.param(lambda: None, id="first"), pytest.param(garbled_ca, id="garbled-ca")])
def test_issued_material_is_what_decide_keeps(make: Callable[[], certmanager.Material | None]) -> None:
    before = make()
    fresh = certmanager.issue(before, certmanager.decide(before, cfg=CFG, now=NOW), cfg=CFG, now=NOW)
    assert certmanager.decide(fresh, cfg=CFG, now=NOW).action is certmanager.Action.KEEP
    (ca,) = _bundle(fresh)
    x509.load_pem_x509_certificate(fresh.cert).verify_directly_issued_by(ca)


def test_new_cert_keeps_the_ca_so_every_replica_stays_trusted() -> None:
    before = material(dns=("old.ns.svc",))
    fresh = certmanager.issue(before, certmanager.decide(before, cfg=CFG, now=NOW), cfg=CFG, now=NOW)
    assert (fresh.ca_bundle, fresh.ca_key) == (before.ca_bundle, before.ca_key)
    assert fresh.cert != before.cert
    assert certmanager.decide(fresh, cfg=CFG, now=NOW).action is certmanager.Action.KEEP


def test_a_renewed_ca_keeps_the_old_one_in_the_bundle_until_it_expires() -> None:
    before = material(ca_days=20)
    fresh = certmanager.issue(before, certmanager.decide(before, cfg=CFG, now=NOW), cfg=CFG, now=NOW)
    new_ca, old_ca = _bundle(fresh)
    assert old_ca == _bundle(before)[0]  # a replica still serving the old pair is trusted
    x509.load_pem_x509_certificate(fresh.cert).verify_directly_issued_by(new_ca)
    later = NOW + 21 * DAY  # the old CA has expired: the next renewal drops it
    expired = dataclasses.replace(fresh, ca_bundle=_bundle(before)[0].public_bytes(certmanager._PEM))
    again = certmanager.issue(expired, certmanager.Decision(certmanager.Action.NEW_CA, "test"), cfg=CFG, now=later)
    assert len(_bundle(again)) == 1


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca = pki.issue_ca(common_name="ca", not_before=NOW, not_after=NOW + 10 * DAY)
    leaf = pki.issue_serving(ca=ca, common_name="wh", dns_names=["a"], ip_addresses=[], not_before=NOW,
                             not_after=NOW + 100 * DAY)
    assert x509.load_pem_x509_certificate(leaf.cert).not_valid_after_utc == NOW + 10 * DAY


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({}, "needs webhook.cert_file and webhook.key_file", id="nowhere-to-write-the-pair"),
        pytest.param({"GPU_STEWARD_WEBHOOK__CERT_FILE": "{tmp}/tls.crt",
                      "GPU_STEWARD_WEBHOOK__KEY_FILE": "{tmp}/tls.key",
                      "GPU_STEWARD_KUBERNETES__KUBECONFIG": "{tmp}/missing-kubeconfig"},
                     "missing-kubeconfig (kubernetes.kubeconfig) does not exist", id="no-kubeconfig"),
    ],
)
def test_the_webhook_refuses_to_start_with_a_clear_message(
    env: dict[str, str], message: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GPU_STEWARD_WEBHOOK__MANAGED_TLS__ENABLED", "true")
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    assert cli.main(["webhook"]) == 2
    assert message in capsys.readouterr().err
