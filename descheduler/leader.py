"""Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas never both act.

Shared by the reclaim loop and the gang controller:

    elector = leader.Elector(api, config=cfg, registry=registry)
    await elector.run(work)   # `work()` runs only while this replica holds the Lease

The rules are client-go's leaderelection: the times written in a Lease are the holder's clock, never
compared with ours. Each replica records, on its own clock, when it last saw the Lease record change
(`Observed`); a Lease held by another is free once it has not changed for its `leaseDurationSeconds`
since then. So clock skew between replicas cannot make two leaders. The holder renews every
`retry_period_seconds` and steps down (cancelling `work`) when it could not renew for
`renew_deadline_seconds` (< the lease duration, validated in settings: it stops before anyone may take
over). Writes carry the Lease's resourceVersion, so of two replicas racing for a free Lease only one
wins (409 for the other). On shutdown the holder releases the Lease (empty holder) so a successor need
not wait; a cancel (shutdown) waits for that release, bounded, before it propagates. The gauge
`gpu_steward_leader` is 1 while this process leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import prometheus_client
from kubernetes_asyncio import client

from common import kube, settings

logger = logging.getLogger(__name__)
RECORD_FIELDS = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")


class LostLeadership(Exception):
    """The Lease could not be renewed in time; whatever ran as leader has been cancelled."""


def micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Observed:
    """The Lease record as last seen, and when it was first seen so (our clock)."""

    record: tuple[Any, ...]
    since: float


def observe(previous: Observed | None, spec: Mapping[str, Any], *, now: float) -> Observed:
    record = tuple(spec.get(field) for field in RECORD_FIELDS)
    return previous if previous is not None and previous.record == record else Observed(record, now)


def may_acquire(spec: Mapping[str, Any], observed: Observed, *, identity: str, now: float) -> tuple[bool, str]:
    """Whether `identity` may take or keep the Lease with this spec at `now` (our clock), and why."""
    holder = spec.get("holderIdentity") or ""
    if not holder:
        return True, "the Lease has no holder"
    if holder == identity:
        return True, "we hold the Lease"
    duration = spec.get("leaseDurationSeconds")
    duration = float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool) else 0.0
    left = observed.since + duration - now
    if left <= 0:
        return True, f"holder {holder} has not renewed the Lease for {now - observed.since:.0f}s"
    return False, f"held by {holder} for {left:.0f}s more"


class Elector:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        config: settings.Settings,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`clock` measures intervals on this replica (monotonic by default); `wall` gives the times written
        into the Lease (UTC unix seconds, for people and other tools to read); `sleep` waits."""
        self._api = api
        self._cfg = config.descheduler.leader_election
        self._timeout = min(config.kubernetes.request_timeout_seconds, self._cfg.renew_deadline_seconds)
        self.identity = self._cfg.identity or f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self._clock = clock or asyncio.get_running_loop().time
        self._wall: Callable[[], float] = wall or (lambda: datetime.datetime.now(datetime.UTC).timestamp())
        self._sleep = sleep
        # A release is one read and one write, each bounded by the request timeout.
        self.release_bound_seconds = 2 * self._timeout
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{self._cfg.lease_namespace}/leases"
        self._observed: Observed | None = None
        self.leading = prometheus_client.Gauge(
            "gpu_steward_leader", "1 while this process holds the leader Lease and acts, else 0.",
            registry=registry if registry is not None else prometheus_client.CollectorRegistry(),
        )

    async def try_acquire(self) -> tuple[bool, str]:
        """One attempt to take or renew the Lease. Never raises for API errors: (False, why)."""
        try:
            lease = await self._read()
            now = self._clock()
            spec = dict((lease or {}).get("spec") or {})
            self._observed = observe(self._observed, spec, now=now)
            allowed, why = may_acquire(spec, self._observed, identity=self.identity, now=now)
            if not allowed:
                return False, why
            written = self._wall()
            if spec.get("holderIdentity") != self.identity:
                spec.update(acquireTime=micro_time(written),
                            leaseTransitions=int(spec.get("leaseTransitions") or 0) + (1 if lease else 0))
            spec.update(holderIdentity=self.identity, renewTime=micro_time(written),
                        leaseDurationSeconds=int(self._cfg.lease_duration_seconds))
            await self._write(lease, spec)
            self._observed = observe(None, spec, now=now)
        except kube.ApiError as exc:
            return False, f"Lease {self._cfg.lease_name}: {exc}"
        except (OSError, TimeoutError) as exc:
            return False, f"Lease {self._cfg.lease_name}: {type(exc).__name__}: {exc}"
        return True, why

    async def release(self) -> None:
        """Give the Lease up if we hold it (best effort, bounded)."""
        with contextlib.suppress(kube.ApiError, OSError, TimeoutError):
            lease = await self._read()
            spec = dict((lease or {}).get("spec") or {})
            if lease is not None and spec.get("holderIdentity") == self.identity:
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self._wall()))
                await self._write(lease, spec)
                logger.info("released Lease %s", self._cfg.lease_name)

    async def _release_on_the_way_out(self) -> None:
        """Release the Lease even when we are being cancelled (SIGTERM): a cancel that arrives while the
        release is under way waits for it, at most `release_bound_seconds`, then goes on. Shielding alone
        would return at once and leave the release running unowned (maybe never done: the loop closes)."""
        releasing = asyncio.create_task(self.release(), name="leader:release")
        try:
            await asyncio.shield(releasing)
        except asyncio.CancelledError:
            try:
                await asyncio.wait({releasing}, timeout=self.release_bound_seconds)
            finally:
                if not releasing.done():
                    releasing.cancel()
                    logger.warning("gave up releasing Lease %s after %.1fs", self._cfg.lease_name,
                                   self.release_bound_seconds)
            raise

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: wait to become leader, run `work` while leading, start over when leadership is lost."""
        while True:
            acquired, why = await self.try_acquire()
            if not acquired:
                logger.debug("not leader: %s", why)
                await self._sleep(self._cfg.retry_period_seconds)
                continue
            logger.info("leading as %s (%s)", self.identity, why)
            self.leading.set(1)
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._renew(), name="leader:renew")
                    tg.create_task(work(), name="leader:work")
            except* LostLeadership as group:
                logger.warning("%s", group.exceptions[0])
            finally:
                self.leading.set(0)
                await self._release_on_the_way_out()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancel (shutdown) that came while the TaskGroup handled LostLeadership is swallowed by it
                # (Python 3.11): honour it here, or the process would go on electing after SIGTERM.
                raise asyncio.CancelledError()

    async def _renew(self) -> None:
        last = self._clock()
        while True:
            await self._sleep(self._cfg.retry_period_seconds)
            renewed, why = await self.try_acquire()
            if renewed:
                last = self._clock()
            elif self._clock() - last >= self._cfg.renew_deadline_seconds:
                raise LostLeadership(f"stepping down, Lease not renewed for {self._clock() - last:.1f}s: {why}")

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await kube.get(self._api, f"{self._path}/{self._cfg.lease_name}", timeout_seconds=self._timeout)
        except kube.ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _write(self, lease: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> None:
        metadata = dict((lease or {}).get("metadata") or {
            "name": self._cfg.lease_name, "namespace": self._cfg.lease_namespace})
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": dict(spec)}
        if lease is None:
            await kube.request(self._api, "POST", self._path, body=body, timeout_seconds=self._timeout)
        else:
            await kube.request(self._api, "PUT", f"{self._path}/{self._cfg.lease_name}", body=body,
                               timeout_seconds=self._timeout)
