"""The descheduler's HTTP endpoints (plain HTTP on `--metrics-port`), served inside its asyncio loop.

- `/healthz`: 200 while the descheduler's work task runs; 503 with the reason once it has ended
  (failed, finished or cancelled). The answer comes from the same loop that runs the work, so any
  answer at all proves that loop is not blocked: a wedged loop times the liveness probe out.
- `/readyz`: 200 once the cluster snapshot has synced, 503 before.
- `/metrics`: the registry the feeder, the gang controller and the reclaim loop record into.
"""

from __future__ import annotations

import asyncio
from typing import Any

import prometheus_client
from aiohttp import web

from common import httpserver
from common import source as sources

WORK: web.AppKey[asyncio.Future[Any]] = web.AppKey("work")
SOURCE: web.AppKey[sources.SnapshotSource] = web.AppKey("source")
REGISTRY = web.AppKey("registry", prometheus_client.CollectorRegistry)


def create_app(
    *,
    work: asyncio.Future[Any],
    source: sources.SnapshotSource,
    registry: prometheus_client.CollectorRegistry,
) -> web.Application:
    """`work` is the task doing the descheduler's job (sync, leader election, gang release, reclaim)."""
    app = web.Application()
    app[WORK] = work
    app[SOURCE] = source
    app[REGISTRY] = registry
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app


def problem(work: asyncio.Future[Any]) -> str | None:
    """Why `work` no longer runs, or None while it does."""
    if not work.done():
        return None
    if work.cancelled():
        return "descheduler work was cancelled"
    error = work.exception()
    if error is not None:
        return f"descheduler work failed: {type(error).__name__}: {error}"
    return "descheduler work has finished"


async def healthz(request: web.Request) -> web.Response:
    why = problem(request.app[WORK])
    if why is not None:
        return web.Response(status=503, text=f"{why}\n")
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    # Readiness does not depend on leadership: a standby replica has a synced snapshot too and takes
    # over as soon as the Lease is free. Were it unready, a rolling update would wait on it forever
    # and the Service would drop its /metrics; who leads is recorded in the Lease.
    return httpserver.readiness(request.app[SOURCE])


async def metrics_page(request: web.Request) -> web.Response:
    return httpserver.exposition(request.app[REGISTRY])
