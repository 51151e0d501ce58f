"""The gang-release loop: plan on the shared snapshot, then pin and un-gate, with Events and metrics.

Runs inside the descheduler process under its leader election:

    await gang_controller.run(config=cfg, source=feeder, api=api, changes=feeder.subscribe(),
                              registry=registry)

It wakes on every snapshot the feeder publishes and at least every `descheduler.gangs.resync_seconds`.
Nothing it needs lives only in memory: every pass re-derives the gangs from the cluster, so a
restart (or a new leader) picks up where the last one stopped. What memory it keeps is courtesy:
which Events were already posted (a restart may repeat one), and which pods it has just un-gated
(it plans nothing until the snapshot shows them un-gated, so their GPUs are not promised twice).

Order for a gang: pin every member, then remove our gate from every member. A failure while
pinning releases none (the next pass retries); a failure while un-gating leaves a started gang
whose rest the next pass releases (see `gang_release`, "already started").
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable

import aiohttp
import prometheus_client
from kubernetes_asyncio import client

from common import events, kube, settings, snapshot, source, timestamps
from descheduler import gang_patch, gang_release

logger = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
RELEASING = (gang_release.Action.RELEASE, gang_release.Action.RESUME, gang_release.Action.RELEASE_ALONE)


class Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.waiting = prometheus_client.Gauge(
            "gpu_steward_gangs_waiting", "Gated gangs waiting, by what they wait for.", ["reason"], registry=registry
        )
        self.wait_seconds = prometheus_client.Histogram(
            "gpu_steward_gang_wait_seconds",
            "From a gang's last member's creation to its release (seconds).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.releases = prometheus_client.Counter(
            "gpu_steward_gang_releases", "Gangs (or lone pods) un-gated, by kind.", ["kind"], registry=registry
        )
        self.timeouts = prometheus_client.Counter(
            "gpu_steward_gang_timeouts", "Gangs found incomplete past the timeout.", registry=registry
        )
        self.failures = prometheus_client.Counter(
            "gpu_steward_gang_release_failures", "Releases stopped by an API error (retried).", registry=registry
        )


def _release_kind(decision: gang_release.Decision) -> str:
    if decision.action is gang_release.Action.RELEASE_ALONE:
        return "orphaned" if decision.event_reason == gang_release.ORPHANED else "invalid"
    return "resumed" if decision.action is gang_release.Action.RESUME else "released"


def _pod_path(key: str) -> str:
    namespace, _, name = key.partition("/")
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def _rfc3339(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    def __init__(
        self,
        *,
        config: settings.Settings,
        source: source.SnapshotSource,
        api: client.ApiClient,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._source = source
        self._api = api
        self._metrics = metrics
        self._posted: dict[str, tuple[str, str]] = {}  # pod key -> what its last Event said (see _tell)
        self._ungated: dict[str, float] = {}  # pod key -> when we removed its gate

    async def reconcile(self, *, now: float) -> gang_release.Plan | None:
        """One pass; None when the snapshot cannot be trusted yet (stale, or behind our own writes)."""
        cluster = self._source.snapshot
        age = cluster.age(now)
        if age is None or age > self._config.descheduler.gangs.max_snapshot_age_seconds:
            logger.warning("gangs: snapshot age %s exceeds the limit; planning nothing", age)
            return None
        if self._behind(cluster, now=now):
            return None
        result = gang_release.plan(cluster, config=self._config, now=now)
        for decision in result.decisions:
            try:
                await self._apply(decision, cluster, now=now)
            except (kube.ApiError, aiohttp.ClientError, TimeoutError) as exc:
                self._metrics.failures.inc()
                logger.warning("gang %s: %s stopped: %s; retrying on the next pass", decision.gang,
                               decision.action, exc)
        self._count(result)
        live = {m.key for d in result.decisions for m in d.members}
        self._posted = {k: v for k, v in self._posted.items() if k in live}
        return result

    def _behind(self, cluster: snapshot.Snapshot, *, now: float) -> bool:
        """True while the snapshot still shows a pod we un-gated as gated (for at most one resync)."""
        gate, patience = self._config.names.gate, self._config.descheduler.gangs.resync_seconds
        self._ungated = {
            key: at
            for key, at in self._ungated.items()
            if key in cluster.pods and gate in cluster.pods[key].scheduling_gates and now - at < patience
        }
        return bool(self._ungated)

    async def _apply(self, decision: gang_release.Decision, cluster: snapshot.Snapshot, *, now: float) -> None:
        if decision.action is gang_release.Action.NONE:
            return
        if decision.action in RELEASING:
            await self._release(decision, cluster, now=now)
            return
        for key in decision.mark:
            await self._patch(key, gang_patch.mark(annotation=gang_release.complete_mark(self._config.names),
                                                   value=_rfc3339(now)), content_type=MERGE_PATCH)
        if decision.action is gang_release.Action.TIMED_OUT and any(
            self._posted.get(m.key, ("", ""))[0] != gang_release.INCOMPLETE for m in decision.members if m.gated
        ):
            self._metrics.timeouts.inc()
        await self._tell(decision, only_changes=True)

    async def _release(self, decision: gang_release.Decision, cluster: snapshot.Snapshot, *, now: float) -> None:
        gate = self._config.names.gate
        for key, node in decision.pins.items():
            patch = gang_patch.tighten(cluster.pods[key].raw, nodes=[node])
            if patch:
                await self._patch(key, patch, content_type=JSON_PATCH)
        for key in decision.ungate:
            patch = gang_patch.ungate(cluster.pods[key].raw, gate=gate)
            if patch:
                await self._patch(key, patch, content_type=JSON_PATCH)
                self._ungated[key] = now
        logger.info("gang %s: %s: %s", decision.gang, decision.action, decision.message)
        self._metrics.releases.labels(_release_kind(decision)).inc()
        if decision.action is not gang_release.Action.RELEASE_ALONE:
            newest = max((cluster.pods[m.key].created for m in decision.members), default="")
            started = timestamps.epoch(newest)
            if started is not None:
                self._metrics.wait_seconds.observe(max(0.0, now - started))
        await self._tell(decision, only_changes=False)

    async def _patch(self, key: str, body: object, *, content_type: str) -> None:
        await kube.request(self._api, "PATCH", _pod_path(key), body=body, content_type=content_type,
                           timeout_seconds=self._config.kubernetes.request_timeout_seconds)

    async def _tell(self, decision: gang_release.Decision, *, only_changes: bool) -> None:
        """One Event per member (gated ones, for a gang that releases: they are the ones it concerns)."""
        if decision.event_type is None or decision.event_reason is None:
            return
        message = f"gang {decision.gang}: {decision.message}"
        # A waiting gang is re-told only when what it waits for changes, not on every count.
        said = (decision.event_reason, decision.waiting.value if decision.waiting else message)
        for member in decision.members:
            if not member.gated:
                continue
            if only_changes and self._posted.get(member.key) == said:
                continue
            posted = await events.post(
                self._api,
                regarding=events.ObjectRef.pod(member.key, uid=member.uid),
                type=decision.event_type,
                reason=decision.event_reason,
                message=message,
                request_timeout=self._config.kubernetes.request_timeout_seconds,
            )
            if posted:
                self._posted[member.key] = said

    def _count(self, result: gang_release.Plan) -> None:
        counts = dict.fromkeys((w.value for w in gang_release.Waiting), 0)
        counts["timed-out"] = 0
        for decision in result.decisions:
            if decision.action is gang_release.Action.TIMED_OUT:
                counts["timed-out"] += 1
            elif decision.waiting is not None:
                counts[decision.waiting.value] += 1
        for reason, count in counts.items():
            self._metrics.waiting.labels(reason).set(count)


async def run(
    *,
    config: settings.Settings,
    source: source.SnapshotSource,
    api: client.ApiClient,
    changes: asyncio.Event | None = None,
    metrics: Metrics | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Release gangs until cancelled. `changes` is set by the snapshot's feeder on every new snapshot
    (`feeder.subscribe()`); without it only the periodic resync drives the loop. `metrics` outlive
    one run (a replica may lead, lose and regain leadership); by default they go to a private registry."""
    cfg = config.descheduler.gangs
    if not cfg.enabled:
        logger.info("gang release disabled (descheduler.gangs.enabled=false): gated pods stay gated")
        return
    controller = Controller(
        config=config,
        source=source,
        api=api,
        metrics=metrics if metrics is not None else Metrics(prometheus_client.CollectorRegistry()),
    )
    while True:
        if changes is not None:
            changes.clear()  # before reading the snapshot: a publication from here on wakes us again
        if source.synced:
            await controller.reconcile(now=clock())
        if changes is None:
            await asyncio.sleep(cfg.resync_seconds)
            continue
        try:
            async with asyncio.timeout(cfg.resync_seconds):
                await changes.wait()
        except TimeoutError:
            pass  # the periodic resync
