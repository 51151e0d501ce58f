"""Issuing a webhook's TLS material in memory: a CA and serving certificates it signs (PEM bytes).

The kube-apiserver trusts a webhook only through the `caBundle` of its registration and (being Go)
checks the subject alternative names, never the common name. Keys are ECDSA P-256. Used by the
webhook's own certificate manager (`admission/certmanager.py`) and by the throwaway certificates of
tests and the demo (`gpu_steward/certs.py`); no file or network I/O here.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Clocks of the issuer and the API server may disagree a little: validity starts a bit in the past.
BACKDATE = datetime.timedelta(minutes=5)


@dataclasses.dataclass(frozen=True)
class Pair:
    cert: bytes  # PEM certificate
    key: bytes  # PEM PKCS#8 private key, unencrypted


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    ca: bool,
) -> x509.CertificateBuilder:
    """What the CA and the leaf share; they differ in what they may do with their key."""
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(usage, critical=True)
    )


def issue_ca(*, common_name: str, not_before: datetime.datetime, not_after: datetime.datetime) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(subject=name, issuer=name, key=key, not_before=not_before, not_after=not_after, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue_serving(
    *,
    ca: Pair,
    common_name: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> Pair:
    """A serving certificate for `dns_names` + `ip_addresses`, signed by `ca`, never outliving it."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(
            subject=_name(common_name),
            issuer=ca_cert.subject,
            key=key,
            not_before=not_before,
            not_after=min(not_after, ca_cert.not_valid_after_utc),
            ca=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))
