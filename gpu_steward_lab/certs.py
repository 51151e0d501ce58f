"""Throwaway TLS material for a webhook served on the local machine: a CA and one serving certificate.

The kube-apiserver only trusts a webhook through the `caBundle` of its registration and (being Go)
checks the subject alternative names, never the common name — so the certificate carries
`IP:127.0.0.1` plus the DNS names asked for. Used by the end-to-end fixtures, the demo and the
webhook integration tests; in a cluster the webhook keeps its own (`admission/certmanager.py`)
or cert-manager issues them.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
from collections.abc import Sequence

from common import pki


@dataclasses.dataclass(frozen=True)
class ServingCert:
    ca_file: pathlib.Path
    cert_file: pathlib.Path
    key_file: pathlib.Path
    ca_bundle: bytes  # PEM of the CA, what a webhook registration's `caBundle` carries (base64-encoded)


def _write(path: pathlib.Path, data: bytes, *, private: bool = False) -> None:
    path.touch(mode=0o600 if private else 0o644, exist_ok=True)
    path.write_bytes(data)


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
    now = datetime.datetime.now(datetime.UTC)
    ca = pki.issue_ca(common_name=f"{common_name} CA", not_before=now, not_after=now + valid_for)
    leaf = pki.issue_serving(ca=ca, common_name=common_name, dns_names=dns_names, ip_addresses=ip_addresses,
                             not_before=now, not_after=now + valid_for)
    paths = ServingCert(
        ca_file=directory / "ca.crt",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
        ca_bundle=ca.cert,
    )
    _write(paths.ca_file, ca.cert)
    _write(paths.cert_file, leaf.cert)
    _write(paths.key_file, leaf.key, private=True)
    return paths
