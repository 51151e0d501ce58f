"""Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas never both act.

Shared by the reclaim loop and the gang controller:

    elector = leader.Elector(api, config=cfg)
    await elector.run(work)   # `work()` runs only while this replica holds the Lease

The rules follow client-go's leaderelection: a Lease is free when it has no holder or its holder
has not renewed it within `leaseDurationSeconds`; the holder renews every `retry_period_seconds`
and gives up (cancelling `work`) when it could not renew for `renew_deadline_seconds`. Writes use
the Lease's resourceVersion, so of two replicas racing for a free Lease only one wins (409 for the
other). On shutdown the holder releases the Lease (empty holder) so a successor need not wait.
`may_acquire()` is the pure decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import secrets
import socket
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from kubernetes_asyncio import client

from common import kube, settings, timestamps

logger = logging.getLogger(__name__)


class LostLeadership(Exception):
    """The Lease could not be renewed in time; whatever ran as leader has been cancelled."""


def micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_acquire(spec: Mapping[str, Any], *, identity: str, now: float) -> tuple[bool, str]:
    """Whether `identity` may take or keep the Lease with this spec at `now`, and why."""
    holder = spec.get("holderIdentity") or ""
    if not holder:
        return True, "the Lease has no holder"
    if holder == identity:
        return True, "we hold the Lease"
    renewed = timestamps.epoch(spec.get("renewTime")) or timestamps.epoch(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None or renewed + duration < now:
        return True, f"holder {holder} let the Lease expire"
    return False, f"held by {holder} for {renewed + duration - now:.0f}s more"


class Elector:
    def __init__(
        self, api: client.ApiClient, *, config: settings.Settings, clock: Callable[[], float] | None = None
    ) -> None:
        self._api = api
        self._cfg = config.descheduler.leader_election
        self._timeout = min(config.kubernetes.request_timeout_seconds, self._cfg.renew_deadline_seconds)
        self.identity = self._cfg.identity or f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC).timestamp())
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{self._cfg.lease_namespace}/leases"

    async def try_acquire(self) -> tuple[bool, str]:
        """One attempt to take or renew the Lease. Never raises for API errors: (False, why)."""
        now = self._clock()
        try:
            lease = await self._read()
            spec = dict((lease or {}).get("spec") or {})
            allowed, why = may_acquire(spec, identity=self.identity, now=now)
            if not allowed:
                return False, why
            if spec.get("holderIdentity") != self.identity:
                spec.update(acquireTime=micro_time(now),
                            leaseTransitions=int(spec.get("leaseTransitions") or 0) + (1 if lease else 0))
            spec.update(holderIdentity=self.identity, renewTime=micro_time(now),
                        leaseDurationSeconds=int(self._cfg.lease_duration_seconds))
            await self._write(lease, spec)
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
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self._clock()))
                await self._write(lease, spec)
                logger.info("released Lease %s", self._cfg.lease_name)

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: wait to become leader, run `work` while leading, start over when leadership is lost."""
        while True:
            acquired, why = await self.try_acquire()
            if not acquired:
                logger.debug("not leader: %s", why)
                await asyncio.sleep(self._cfg.retry_period_seconds)
                continue
            logger.info("leading as %s (%s)", self.identity, why)
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._renew(), name="leader:renew")
                    tg.create_task(work(), name="leader:work")
            except* LostLeadership as group:
                logger.warning("%s", group.exceptions[0])
            finally:
                await asyncio.shield(self.release())

    async def _renew(self) -> None:
        last = self._clock()
        while True:
            await asyncio.sleep(self._cfg.retry_period_seconds)
            renewed, why = await self.try_acquire()
            if renewed:
                last = self._clock()
            elif self._clock() - last > self._cfg.renew_deadline_seconds:
                raise LostLeadership(f"leadership lost: {why}")

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
