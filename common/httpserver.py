"""What the webhook's and the descheduler's HTTP servers share: the `/readyz` answer of a snapshot
source, the `/metrics` page of a registry, and running an aiohttp app on a site in the caller's loop.

    async with httpserver.serving(app, host="127.0.0.1", port=0, shutdown_seconds=3) as (host, port):
        ...  # serving until the block ends

Each server keeps its own routes and app state; only these answers and the runner's life cycle are common.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator

import prometheus_client
from aiohttp import web

from common import source

NOT_SYNCED = "cluster snapshot not synced yet"


def readiness(cluster: source.SnapshotSource) -> web.Response:
    """200 once the snapshot has synced; before, decisions would read an empty or partial cluster."""
    if not cluster.synced:
        return web.Response(status=503, text=f"{NOT_SYNCED}\n")
    return web.Response(text="ok\n")


def exposition(registry: prometheus_client.CollectorRegistry) -> web.Response:
    """The Prometheus text exposition of `registry`."""
    response = web.Response(body=prometheus_client.generate_latest(registry))
    response.headers["Content-Type"] = prometheus_client.CONTENT_TYPE_LATEST
    return response


def listen(port: int) -> socket.socket:
    """A socket bound to `port` on every address (IPv4 and, where the host has it, IPv6).

    Binding before the loop starts makes a taken port an error at start, before any work begins;
    raises OSError (port taken, no permission) or OverflowError (not a port number).
    """
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


@contextlib.asynccontextmanager
async def serving(
    app: web.Application,
    *,
    shutdown_seconds: float,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[str, int]]:
    """Serve `app` on `sock` (already bound), else on `host`:`port`, until the block ends; yields the
    address served. At the end, requests in flight get `shutdown_seconds` before connections close."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_seconds)
    await runner.setup()
    try:
        site: web.BaseSite
        if sock is not None:
            site = web.SockSite(runner, sock, ssl_context=ssl_context)
        else:
            site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        served_host, served_port = runner.addresses[0][:2]
        yield served_host, served_port
    finally:
        await runner.cleanup()
