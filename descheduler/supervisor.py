"""Keeps one of the descheduler's loops running: an unexpected error in gang release must not stop
reclaim, nor the other way round.

    failures = supervisor.Failures(registry)
    await supervisor.keep_running("gangs", lambda: controller.run(...), failures=failures, cfg=cfg)

Each failure is logged with its traceback, counted in `gpu_steward_descheduler_loop_failures_total{loop}`,
and the loop is started again after a doubling, jittered wait (`descheduler.loop_restart_*`). The wait
starts over once a run lasted longer than the longest wait. Cancellation (leadership lost, shutdown) ends it.
A loop that returns (e.g. disabled in settings) is not restarted.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import prometheus_client

from common import settings

logger = logging.getLogger(__name__)


class Failures:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.counter = prometheus_client.Counter(
            "gpu_steward_descheduler_loop_failures",
            "Unexpected errors that ended a descheduler loop run (it is restarted after a backoff).",
            ["loop"], registry=registry,
        )


async def keep_running(
    name: str,
    start: Callable[[], Coroutine[Any, Any, None]],
    *,
    failures: Failures,
    cfg: settings.Descheduler,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    clock = clock or asyncio.get_running_loop().time
    failures.counter.labels(name)  # the series exists (at 0) before the first failure
    streak = 0
    while True:
        started = clock()
        try:
            await start()
            return
        except Exception as exc:  # anything but cancellation: this loop's bug must not end the other loop
            failures.counter.labels(name).inc()
            streak = 1 if clock() - started > cfg.loop_restart_max_seconds else streak + 1
            ceiling = min(cfg.loop_restart_max_seconds, cfg.loop_restart_initial_seconds * 2 ** min(streak - 1, 30))
            delay = random.uniform(ceiling / 2, ceiling)
            logger.error("descheduler loop %s failed (%s: %s); restarting in %.1fs", name, type(exc).__name__, exc,
                         delay, exc_info=exc)
        await sleep(delay)
