"""Leader election against a fake Lease API (real HTTP, real 409s), with fake clocks: acquire, renew, lose,
step down, and clock skew (a holder whose clock is an hour behind keeps its Lease while it renews)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator
from typing import Any

import prometheus_client
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from common import settings, settings_loader
from descheduler import leader
from tests.integration.test_evictor import FakeApi

NOW = 1_800_000_000.0
LEASE = "gpu-steward-descheduler"
CONFIG = settings_loader.load(overrides={"descheduler": {"leader_election": {"lease_namespace": "gs"}}})


@contextlib.asynccontextmanager
async def serving(api: FakeApi) -> AsyncIterator[client.ApiClient]:
    """`api` on a local port, and a client of it."""
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}")
    async with client.ApiClient(configuration) as api_client:
        try:
            yield api_client
        finally:
            await runner.cleanup()


@pytest.fixture
async def lease_api() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    api = FakeApi()
    async with serving(api) as api_client:
        yield api, api_client


async def start_leading(elector: leader.Elector) -> asyncio.Task[None]:
    """`elector.run(...)` as a task, once its work (waiting forever) has started."""
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    running = asyncio.create_task(elector.run(work))
    await asyncio.wait_for(started.wait(), 30)
    return running


class Clock:
    """One replica's clocks: `now` (its monotonic view, advanced by `sleep`) and a wall clock `skew` off."""

    def __init__(self, *, skew: float = 0.0) -> None:
        self.now = NOW
        self.skew = skew

    def wall(self) -> float:
        return self.now + self.skew

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def elector(api_client: client.ApiClient, clock: Clock, name: str, **kwargs: Any) -> leader.Elector:
    cfg = settings_loader.load(
        overrides={"descheduler": {"leader_election": {"lease_namespace": "gs", "identity": name}}})
    return leader.Elector(api_client, config=cfg, clock=lambda: clock.now, wall=clock.wall, sleep=clock.sleep,
                          **kwargs)


async def test_acquire_renew_and_take_over_after_the_lease_duration_of_silence(
    lease_api: tuple[FakeApi, client.ApiClient],
) -> None:
    api, api_client = lease_api
    clock_a, clock_b = Clock(), Clock()
    a, b = elector(api_client, clock_a, "a"), elector(api_client, clock_b, "b")
    assert await a.try_acquire() == (True, "the Lease has no holder")
    assert await b.try_acquire() == (False, "held by a for 15s more")
    clock_a.now += 10
    assert await a.try_acquire() == (True, "we hold the Lease")  # renewed: the record changed
    clock_b.now += 14
    assert await b.try_acquire() == (False, "held by a for 15s more")  # b saw the change just now
    clock_b.now += 14.9
    assert (await b.try_acquire())[0] is False
    clock_b.now += 0.1  # 15 s since b last saw the record change
    assert await b.try_acquire() == (True, "holder a has not renewed the Lease for 15s")
    spec = api.leases[LEASE]["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"], spec["leaseDurationSeconds"]) == ("b", 1, 15)
    assert (await a.try_acquire())[0] is False  # a lost it


@pytest.mark.parametrize("skew", [pytest.param(-3600.0, id="holder-an-hour-behind"),
                                  pytest.param(3600.0, id="holder-an-hour-ahead")])
async def test_clock_skew_never_makes_two_leaders(lease_api: tuple[FakeApi, client.ApiClient], skew: float) -> None:
    """Old code compared the holder's renewTime with the local clock: an hour behind, the Lease looked
    expired to every other replica at once, while its holder kept renewing and acting."""
    _, api_client = lease_api
    clock_a, clock_b = Clock(skew=skew), Clock()
    a, b = elector(api_client, clock_a, "a"), elector(api_client, clock_b, "b")
    assert (await a.try_acquire())[0]
    for _ in range(20):  # 40 s of a renewing every 2 s while b tries too
        clock_a.now += 2
        clock_b.now += 2
        assert (await a.try_acquire())[0]
        assert (await b.try_acquire())[0] is False


async def test_leader_steps_down_when_it_cannot_renew(lease_api: tuple[FakeApi, client.ApiClient]) -> None:
    """Another replica takes the Lease (e.g. after a long pause of ours): renewals fail, and after
    renew_deadline_seconds the work is cancelled and the gauge drops to 0; the Lease is not released
    (it is not ours)."""
    api, api_client = lease_api
    clock = Clock()
    registry = prometheus_client.CollectorRegistry()
    a = elector(api_client, clock, "a", registry=registry)
    started, cancelled_at = asyncio.Event(), []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_at.append(clock.now)
            raise

    running = asyncio.create_task(a.run(work))
    try:
        await asyncio.wait_for(started.wait(), 30)
        assert registry.get_sample_value("gpu_steward_leader") == 1
        took_over = clock.now
        api.leases[LEASE]["spec"]["holderIdentity"] = "other"
        async with asyncio.timeout(30):  # a bound for a hang, not a speed assert
            while not cancelled_at or registry.get_sample_value("gpu_steward_leader") != 0:
                # The other holder renews (its record keeps changing): we never get the Lease back.
                api.leases[LEASE]["spec"]["renewTime"] = datetime.datetime.now(datetime.UTC).isoformat()
                await asyncio.sleep(0)
        # The deadline counts from the last good renewal, which preceded the take-over by at most one retry.
        assert 10 <= cancelled_at[0] - took_over + 2 and cancelled_at[0] - took_over <= 10 + 2
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    assert api.leases[LEASE]["spec"]["holderIdentity"] == "other"


async def test_release_on_shutdown_lets_a_successor_in_at_once(lease_api: tuple[FakeApi, client.ApiClient]) -> None:
    api, api_client = lease_api
    clock_a, clock_b = Clock(), Clock()
    registry = prometheus_client.CollectorRegistry()
    a, b = elector(api_client, clock_a, "a", registry=registry), elector(api_client, clock_b, "b")
    assert (await b.try_acquire())[0] is True
    await b.release()
    running = await start_leading(a)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert api.leases[LEASE]["spec"]["holderIdentity"] == ""
    assert registry.get_sample_value("gpu_steward_leader") == 0
    assert await b.try_acquire() == (True, "the Lease has no holder")


class SlowReleaseApi(FakeApi):
    """Answers the write that empties the holder only after `delay` seconds (a loaded API server)."""

    def __init__(self, *, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.release_started = asyncio.Event()

    async def replace_lease(self, request: web.Request) -> web.Response:
        body = await request.json()  # aiohttp keeps the body: the parent reads it again
        if body["spec"].get("holderIdentity") == "":
            self.release_started.set()
            await asyncio.sleep(self.delay)
        return await super().replace_lease(request)


async def test_a_second_cancel_during_the_release_still_releases_and_leaks_nothing() -> None:
    """SIGTERM while the Lease is being given up (e.g. a step-down's release, or a supervisor cancelling
    twice): the old code shielded release() and returned at once, leaving the release running unowned —
    the Lease stayed held until it expired and the task leaked. Now the cancel waits for the release."""
    api = SlowReleaseApi(delay=0.3)
    async with serving(api) as api_client:
        running = await start_leading(elector(api_client, Clock(), "a"))
        running.cancel()
        await asyncio.wait_for(api.release_started.wait(), 30)
        running.cancel()  # again, while the release's write is in flight
        with pytest.raises(asyncio.CancelledError):
            await running
        assert api.leases[LEASE]["spec"]["holderIdentity"] == ""


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"lease_duration_seconds": 10, "renew_deadline_seconds": 10},
                     "renew_deadline_seconds (10) must be less than lease_duration_seconds (10)", id="renew-not-below"),
        pytest.param({"renew_deadline_seconds": 2, "retry_period_seconds": 2},
                     "retry_period_seconds (2) times 1.2 must be less than renew_deadline_seconds (2)",
                     id="retry-not-below-renew"),
    ],
)
def test_timing_is_validated_naming_the_keys(values: dict[str, float], message: str) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        settings_loader.load(overrides={"descheduler": {"leader_election": values}})
    assert "descheduler.leader_election" in str(caught.value) and message in str(caught.value)
