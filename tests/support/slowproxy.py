"""A slow API server: an aiohttp reverse proxy that holds every request `delay_seconds` before passing it on.

    async with SlowProxy(upstream="http://127.0.0.1:PORT", delay_seconds=0.2, on_request=hook) as proxy:
        ... point the client at proxy.url ...

`on_request(method, path)` is called as each request arrives (before the delay): a test advances the metrics
store's clock there, so that the store moves on while the API answers slowly. Plain HTTP upstream only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Self

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"})


class SlowProxy:
    def __init__(self, *, upstream: str, delay_seconds: float,
                 on_request: Callable[[str, str], None] | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay_seconds = delay_seconds
        self.on_request = on_request
        self.requests: list[tuple[str, str]] = []  # (method, path with query) in arrival order
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        self.requests.append((request.method, request.path_qs))
        if self.on_request is not None:
            self.on_request(request.method, request.path_qs)
        await asyncio.sleep(self.delay_seconds)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(request.method, f"{self.upstream}{request.path_qs}", headers=headers,
                                         data=await request.read()) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=answer.status, body=body, headers=kept)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
