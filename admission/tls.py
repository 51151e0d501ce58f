"""The webhook's serving TLS context, which follows certificate rotation without a restart.

cert-manager (or any Secret update) replaces the mounted cert and key files in place. Every TLS
handshake passes through the context's SNI callback — also when the client sends no server name,
as the API server does for an IP address — which, at most every `cert_check_seconds`, compares the
files with what was loaded and hands the handshake a freshly loaded context when they changed.
Established connections keep their old pair; new ones get the new pair.
"""

from __future__ import annotations

import logging
import pathlib
import ssl
import time
from collections.abc import Callable

from common import settings

log = logging.getLogger(__name__)


def _load(cert_file: pathlib.Path, key_file: pathlib.Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


def _read(cert_file: pathlib.Path, key_file: pathlib.Path) -> tuple[bytes, bytes]:
    return cert_file.read_bytes(), key_file.read_bytes()


class _Reloader:
    def __init__(
        self,
        *,
        cert_file: pathlib.Path,
        key_file: pathlib.Path,
        check_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._check_seconds = check_seconds
        self._clock = clock
        # Contents, not mtimes: a Secret volume swaps symlinks, and coarse mtimes can repeat.
        self._loaded = _read(cert_file, key_file)
        self.context = _load(cert_file, key_file)
        self._checked_at = clock()

    def current(self) -> ssl.SSLContext:
        now = self._clock()
        if now - self._checked_at < self._check_seconds:
            return self.context
        self._checked_at = now
        try:
            contents = _read(self._cert_file, self._key_file)
            if contents != self._loaded:
                self.context = _load(self._cert_file, self._key_file)
                self._loaded = contents
                log.info("serving certificate reloaded from %s", self._cert_file)
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation (one file new, one old, or briefly absent): keep serving the old pair.
            log.warning("serving certificate not reloaded, keeping the previous one: %s", exc)
        return self.context


def ssl_context(webhook: settings.Webhook, *, clock: Callable[[], float] = time.monotonic) -> ssl.SSLContext:
    """A server context for the cert/key files of `webhook`; OSError/SSLError if they cannot be loaded."""
    if webhook.cert_file is None or webhook.key_file is None:
        raise ValueError("webhook.cert_file and webhook.key_file are required to serve TLS")
    reloader = _Reloader(
        cert_file=pathlib.Path(webhook.cert_file),
        key_file=pathlib.Path(webhook.key_file),
        check_seconds=webhook.cert_check_seconds,
        clock=clock,
    )
    entry = reloader.context

    def on_client_hello(ssl_object: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        ssl_object.context = reloader.current()

    entry.sni_callback = on_client_hello
    return entry
