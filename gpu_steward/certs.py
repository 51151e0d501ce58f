"""Throwaway TLS material for a webhook served on the local machine: a CA and one serving certificate.

The kube-apiserver only trusts a webhook through the `caBundle` of its registration and (being Go)
checks the subject alternative names, never the common name — so the certificate carries
`IP:127.0.0.1` plus the DNS names asked for. Used by the end-to-end fixtures, the demo and the
webhook integration tests; production certificates come from cert-manager or the chart.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import pathlib
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Clocks of the machine and the test may disagree by a little; start validity a bit in the past.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclasses.dataclass(frozen=True)
class ServingCert:
    ca_file: pathlib.Path
    cert_file: pathlib.Path
    key_file: pathlib.Path
    ca_bundle: bytes  # PEM of the CA, what a webhook registration's `caBundle` carries (base64-encoded)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: pathlib.Path, data: bytes, *, private: bool = False) -> None:
    path.touch(mode=0o600 if private else 0o644, exist_ok=True)
    path.write_bytes(data)


def _builder(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    validity: tuple[datetime.datetime, datetime.datetime],
    ca: bool,
) -> x509.CertificateBuilder:
    """What the CA and the leaf share; they differ in what they may do with their key."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def generate(
    directory: pathlib.Path,
    *,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    common_name: str = "gpu-steward-webhook",
    valid_for: datetime.timedelta = datetime.timedelta(days=1),
) -> ServingCert:
    """Write `ca.crt`, `tls.crt` and `tls.key` (PEM, key mode 0600) into `directory` and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    not_before = datetime.datetime.now(datetime.UTC) - _BACKDATE
    validity = (not_before, not_before + _BACKDATE + valid_for)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{common_name} CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        _builder(subject=ca_name, issuer=ca_name, key=ca_key, validity=validity, ca=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        _builder(subject=_name(common_name), issuer=ca_name, key=key, validity=validity, ca=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    paths = ServingCert(
        ca_file=directory / "ca.crt",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
        ca_bundle=ca_pem,
    )
    _write(paths.ca_file, ca_pem)
    _write(paths.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.key_file, _pem_key(key), private=True)
    return paths
