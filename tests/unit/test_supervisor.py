"""descheduler.supervisor: an unexpected error in one loop (gang release, reclaim) is logged, counted and
retried with backoff, and never stops the other loop; cancellation still ends both."""

from __future__ import annotations

import asyncio
import logging

import prometheus_client
import pytest

from common import settings
from descheduler import supervisor

CFG = settings.Descheduler(loop_restart_initial_seconds=1, loop_restart_max_seconds=8)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


async def test_a_failing_loop_never_stops_the_other(caplog: pytest.LogCaptureFixture) -> None:
    registry = prometheus_client.CollectorRegistry()
    failures = supervisor.Failures(registry)
    time = FakeTime()
    reclaim_cycles = 0
    enough = asyncio.Event()

    async def gangs() -> None:
        raise KeyError("a bug in gang planning")

    async def reclaim() -> None:
        nonlocal reclaim_cycles
        while True:
            reclaim_cycles += 1
            if reclaim_cycles == 20:
                enough.set()
            await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="descheduler.supervisor"):
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(supervisor.keep_running(name, start, failures=failures, cfg=CFG,
                                                            clock=time.clock, sleep=time.sleep))
                     for name, start in (("gangs", gangs), ("reclaim", reclaim))]
            await enough.wait()
            assert not any(t.done() for t in tasks)
            for task in tasks:
                task.cancel()
    assert all(t.cancelled() for t in tasks)
    assert registry.get_sample_value("gpu_steward_descheduler_loop_failures_total", {"loop": "gangs"}) >= 6
    assert registry.get_sample_value("gpu_steward_descheduler_loop_failures_total", {"loop": "reclaim"}) == 0
    # Doubling, jittered into [ceiling/2, ceiling], capped at the maximum.
    for wait, ceiling in zip(time.waits, (1, 2, 4, 8, 8, 8), strict=False):
        assert ceiling / 2 <= wait <= ceiling
    assert "descheduler loop gangs failed (KeyError: 'a bug in gang planning'); restarting in" in caplog.text
    assert caplog.records[0].exc_info is not None  # the traceback is logged


async def test_a_loop_that_returns_is_not_restarted() -> None:
    calls = 0

    async def disabled() -> None:
        nonlocal calls
        calls += 1

    failures = supervisor.Failures(prometheus_client.CollectorRegistry())
    await supervisor.keep_running("gangs", disabled, failures=failures, cfg=CFG, clock=lambda: 0.0)
    assert calls == 1


async def test_a_loop_that_ran_long_before_failing_restarts_after_the_first_wait() -> None:
    """The backoff grows only over failures in a row; a loop that ran for longer than the longest wait starts over."""
    time = FakeTime()
    runs = 0

    async def fails_after_a_while() -> None:
        nonlocal runs
        runs += 1
        if runs == 5:
            raise asyncio.CancelledError  # end the test (as a shutdown would)
        time.now += 100  # longer than loop_restart_max_seconds
        raise RuntimeError("rare bug")

    failures = supervisor.Failures(prometheus_client.CollectorRegistry())
    with pytest.raises(asyncio.CancelledError):
        await supervisor.keep_running("reclaim", fails_after_a_while, failures=failures, cfg=CFG,
                                      clock=time.clock, sleep=time.sleep)
    assert len(time.waits) == 4 and all(0.5 <= w <= 1 for w in time.waits), time.waits
