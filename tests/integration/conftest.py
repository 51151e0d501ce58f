"""Shared fixtures of the integration tests: TLS material, settings, and a real TLS webhook server."""

from __future__ import annotations

import contextlib
import json
import pathlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from admission import server, tls
from common import httpserver, settings, settings_loader, source
from gpu_steward_lab import certs

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "admission"
CLUSTER_STATE = FIXTURES / "cluster.json"


def review_fixture(name: str) -> dict[str, Any]:
    """An AdmissionReview as kube-apiserver sends it, from tests/fixtures/admission/NAME.json."""
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


@pytest.fixture
def serving_cert(tmp_path: pathlib.Path) -> certs.ServingCert:
    return certs.generate(tmp_path / "tls")


@pytest.fixture
def webhook_config(serving_cert: certs.ServingCert) -> settings.Settings:
    return settings_loader.load(
        overrides={
            "webhook": {
                "host": "127.0.0.1",
                "cert_file": str(serving_cert.cert_file),
                "key_file": str(serving_cert.key_file),
            }
        }
    )


@pytest.fixture
def cluster(webhook_config: settings.Settings) -> source.StaticSource:
    """Stamped with the fixture's creation time, so a test can set the server's clock relative to it."""
    taken_at = time.time()
    return source.from_file(CLUSTER_STATE, names=webhook_config.names, clock=lambda: taken_at)


def client_context(serving_cert: certs.ServingCert) -> ssl.SSLContext:
    """What the API server does: trust only the registration's caBundle, verify the IP SAN."""
    return ssl.create_default_context(cafile=serving_cert.ca_file)


class Webhook:
    """A running webhook: its base URL and a client session that trusts its CA."""

    def __init__(self, *, url: str, session: aiohttp.ClientSession, app: web.Application) -> None:
        self.url = url
        self.session = session
        self.app = app

    async def post(self, body: bytes | dict[str, Any]) -> aiohttp.ClientResponse:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(
            f"{self.url}/mutate", data=data, headers={"Content-Type": "application/json"}
        ) as response:
            await response.read()
            return response

    async def review(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST a review that must be answered 200; return the AdmissionReview answer."""
        response = await self.post(body)
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(f"{self.url}{path}") as response:
            return response.status, await response.text()


StartWebhook = Callable[..., contextlib.AbstractAsyncContextManager[Webhook]]


@pytest.fixture
def start_webhook(
    webhook_config: settings.Settings, cluster: source.StaticSource, serving_cert: certs.ServingCert
) -> StartWebhook:
    """`async with start_webhook(**create_app_overrides) as hook:` — the real app behind real TLS."""

    @contextlib.asynccontextmanager
    async def start(*, ssl_context: ssl.SSLContext | None = None, **overrides: Any) -> AsyncIterator[Webhook]:
        app = server.create_app(**{"config": webhook_config, "source": cluster, **overrides})
        context = ssl_context or tls.ssl_context(webhook_config.webhook)
        served = httpserver.serving(app, host="127.0.0.1", port=0, ssl_context=context, shutdown_seconds=1)
        async with served as (_, port):
            timeout = aiohttp.ClientTimeout(total=10)
            connector = aiohttp.TCPConnector(ssl=client_context(serving_cert))
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                yield Webhook(url=f"https://127.0.0.1:{port}", session=session, app=app)

    return start


@pytest.fixture
async def webhook(start_webhook: StartWebhook) -> AsyncIterator[Webhook]:
    """The webhook as shipped: default engine, the fixture cluster, fresh TLS material, and a live descheduler
    (its Lease seen renewed just now)."""
    async with start_webhook(controller=time.time) as hook:
        yield hook
