"""The gang-release loop: plan on the shared snapshot, then nominate and un-gate, with Events and metrics.

Runs inside the descheduler process under its leader election:

    await controller.run(config=cfg, source=feeder, api=api, changes=feeder.subscribe(), metrics=metrics)

It wakes on every snapshot the feeder publishes and at least every `descheduler.gangs.resync_seconds`.
Nothing it needs lives only in memory: every pass re-derives the gangs from the cluster, so a
restart (or a new leader) picks up where the last one stopped. What memory it keeps is courtesy:
which Events were already posted (a restart may repeat one), and the pods it has released that the
snapshot does not show released yet (`assumed`, like kube-scheduler's assume cache and Kueue's
expectations): they hold the node they were nominated to and are not planned again, so their GPUs are
never promised twice and a burst of single pods is released pass after pass without waiting for the
watch to catch up.

A pod is released by two calls (`patches`): its nomination (`pods/status`, while it is still gated), then one
patch writing its release record and removing our gate. Before either, the PodGroups of ours that the members name
(`descheduler.gangs.native_binding`: kube-scheduler then binds the gang all-or-nothing) are made sure of
(`common.pod_groups`): un-gated while its PodGroup is missing, a member would wait in kube-scheduler's queue for ever.
A gang's members are all nominated first, then all
un-gated together, so a failure while nominating releases none (the next pass keeps the nominations already set
and places the rest); a failure while un-gating leaves a started gang whose rest the next pass releases (see
`planning`, "already started"). Calls run concurrently, at most `descheduler.gangs.max_concurrent_patches` in
flight.

Right before a release's first call (a single pod: once its nomination has a slot; a gang: before any member is
nominated) the release is re-checked on the freshest snapshot the feeder holds and the pods its watch delivered since
that snapshot was built (`planning.overtaken`, `feeder.Feeder.unbuilt`): when a node planned for it was taken since
the plan, it is held back (`gpu_steward_release_overtaken_total`), a gang as a unit, and the next pass, woken by the
newer snapshot (published already, or being built from the change that took the node), plans it afresh.

After the releases, every pass checks what earlier releases came to (`outcomes`, level-triggered) and tells each
outcome once (`_record`: a log line, `gpu_steward_release_outcomes_total{cause}` and an Event on the pod). It never
acts on one: nothing in gpu-steward deletes, evicts or re-creates a pod to repair a placement.

Events are posted off the pass (`_post`): a pass ends once its patches have returned, so the next pass, which
releases the pods that came meanwhile, never waits for the API server to take an Event. They have slots of their own
(as many as the patches'); one whose post fails is told again by a later pass that still finds it to tell. `settle()`
waits for those in flight; on cancellation they get `EVENT_GRACE_SECONDS` to finish, then are cancelled.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
import prometheus_client
from kubernetes_asyncio import client

from common import claims, domain_claim, events, kube, pod_groups, settings, snapshot, source, timestamps
from descheduler.release import outcomes, patches, planning

logger = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
RELEASING = (planning.Action.RELEASE, planning.Action.RESUME, planning.Action.RELEASE_ALONE)
EVENT_GRACE_SECONDS = 2.0  # how long Events in flight may still finish once the loop is cancelled (SIGTERM)


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
        self.pass_seconds = prometheus_client.Histogram(
            "gpu_steward_release_pass_seconds", "One release pass: planning, then every patch (its Events are "
            "posted beside the next passes) (seconds).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=registry,
        )
        self.failures = prometheus_client.Counter(
            "gpu_steward_gang_release_failures", "Releases stopped by an API error (retried).", registry=registry
        )
        self.overtaken = prometheus_client.Counter(
            "gpu_steward_release_overtaken", "Releases held back right before their first patch because a node "
            "planned for them was taken since the plan (planned afresh on the next pass).", registry=registry,
        )
        self.outcomes = prometheus_client.Counter(
            "gpu_steward_release_outcomes", "Released pods whose release did not go as planned, told once each, by "
            "cause: placed-elsewhere, split-domains, not-bound, gang-not-bound, gang-spread (descheduler/release/"
            "outcomes.py).", ["cause"], registry=registry,
        )


def _release_kind(decision: planning.Decision) -> str:
    if decision.event_reason == planning.PREEMPTING:  # a single pod, or a gang with members that need a preemption
        return "preempting"
    if decision.action is planning.Action.RELEASE_ALONE:
        return {planning.ORPHANED: "orphaned", planning.UNPLACED: "unplaced"}.get(
            decision.event_reason or "", "invalid")
    return "resumed" if decision.action is planning.Action.RESUME else "released"


def _domain(cluster: snapshot.Snapshot, member: planning.MemberStatus) -> domain_claim.Domain | None:
    """The NVLink domain planned for the member on its DRA node, for its claim of its own (None: not planned)."""
    devices = cluster.dra.devices.get(member.node or "") or ()
    return domain_claim.Domain(devices[0].id.driver, member.domain) if devices and member.domain else None


async def _all(calls: Iterable[Awaitable[object]]) -> None:
    """Run the calls concurrently; once all have finished, raise the first unexpected error, else the first API
    failure (if any)."""
    failed = [r for r in await asyncio.gather(*calls, return_exceptions=True) if isinstance(r, BaseException)]
    unexpected = [e for e in failed if not isinstance(e, kube.ApiError | aiohttp.ClientError | TimeoutError)]
    if unexpected or failed:
        raise (unexpected or failed)[0]


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
        source: source.LiveSource,
        api: client.ApiClient,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._source = source
        self._api = api
        self._metrics = metrics
        self._posted: dict[str, tuple[str, str]] = {}  # pod key -> what its last Event said (see _tell)
        self._assumed: dict[str, tuple[str, float]] = {}  # pod key -> (nominated node or "", when released)
        self._told: set[tuple[str, outcomes.Cause]] = set()  # (pod uid, cause) outcomes already told (see _record)
        self._calls = asyncio.Semaphore(config.descheduler.gangs.max_concurrent_patches)
        self._event_slots = asyncio.Semaphore(config.descheduler.gangs.max_concurrent_patches)
        self._posting: set[asyncio.Task[None]] = set()  # Events in flight (see _post)

    async def reconcile(self, *, now: float) -> planning.ReleasePlan | None:
        """One pass; None when the snapshot cannot be trusted (stale)."""
        cluster = self._source.snapshot
        age = cluster.age(now)
        if age is None or age > self._config.descheduler.gangs.max_snapshot_age_seconds:
            logger.warning("gangs: snapshot age %s exceeds the limit; planning nothing", age)
            return None
        self._forget_seen(cluster, now=now)
        started = time.perf_counter()
        result = planning.plan(cluster, config=self._config, now=now,
                                   assumed={key: node for key, (node, _) in self._assumed.items()})
        planned = time.perf_counter()
        await asyncio.gather(*(self._apply_safely(d, cluster, result, now=now) for d in result.decisions))
        done = time.perf_counter()
        self._metrics.pass_seconds.observe(done - started)
        logger.debug("release pass: %d decisions planned in %.3fs, applied in %.3fs", len(result.decisions),
                     planned - started, done - planned)
        self._count(result)
        live = {m.key for d in result.decisions for m in d.members}
        self._posted = {k: v for k, v in self._posted.items() if k in live}
        await self._observe(cluster, now=now)
        return result

    async def _observe(self, cluster: snapshot.Snapshot, *, now: float) -> None:
        """Tell every outcome of earlier releases not told yet (`outcomes`); forget those no longer found, so one
        that comes back is told again."""
        found = outcomes.assess(cluster, config=self._config, now=now)
        for outcome in found:
            if (outcome.uid, outcome.cause) not in self._told:
                self._record(outcome)
        self._told &= {(o.uid, o.cause) for o in found}

    def _record(self, outcome: outcomes.Outcome) -> None:
        """The one place a release outcome is told: log line + metric + Event (told again while its post fails)."""
        kind, reason = outcome.event
        logger.log(logging.WARNING if kind == "Warning" else logging.INFO, "release outcome %s %s: %s",
                   outcome.cause.value, outcome.key, outcome.message)
        self._metrics.outcomes.labels(outcome.cause.value).inc()
        told = (outcome.uid, outcome.cause)
        self._told.add(told)
        self._post(events.ObjectRef.pod(outcome.key, uid=outcome.uid), type="Warning" if kind == "Warning" else
                   "Normal", reason=reason, message=outcome.message, failed=lambda: self._told.discard(told))

    def _post(self, regarding: events.ObjectRef, *, type: events.EventType, reason: str, message: str,
              failed: Callable[[], None]) -> None:
        """Post the Event in the background, in a slot of its own; `failed` runs when the API server did not take
        it (so a later pass tells it again)."""
        async def post() -> None:
            async with self._event_slots:
                if not await events.post(self._api, regarding=regarding, type=type, reason=reason, message=message,
                                         request_timeout=self._config.kubernetes.request_timeout_seconds):
                    failed()

        task = asyncio.create_task(post())
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def settle(self, *, within: float | None = None) -> None:
        """Wait for the Events in flight; those still posting after `within` seconds are cancelled."""
        if not self._posting:
            return
        _, late = await asyncio.wait(set(self._posting), timeout=within)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    def _forget_seen(self, cluster: snapshot.Snapshot, *, now: float) -> None:
        """Drop released pods once the snapshot shows them released (or gone); keep none past one resync
        (a lost watch event must not hold a node forever)."""
        gate, patience = self._config.names.gate, self._config.descheduler.gangs.resync_seconds
        self._assumed = {
            key: (node, at)
            for key, (node, at) in self._assumed.items()
            if key in cluster.pods and gate in cluster.pods[key].scheduling_gates and now - at < patience
        }

    async def _apply_safely(self, decision: planning.Decision, cluster: snapshot.Snapshot,
                            result: planning.ReleasePlan, *, now: float) -> None:
        try:
            await self._apply(decision, cluster, result, now=now)
        except (kube.ApiError, aiohttp.ClientError, TimeoutError) as exc:
            self._metrics.failures.inc()
            logger.warning("gang %s: %s stopped: %s; retrying on the next pass", decision.gang, decision.action, exc)

    async def _apply(self, decision: planning.Decision, cluster: snapshot.Snapshot, result: planning.ReleasePlan,
                     *, now: float) -> None:
        if decision.action is planning.Action.NONE:
            return
        if decision.action in RELEASING:
            await self._release(decision, cluster, result, now=now)
            return
        for key in decision.mark:
            await self._patch(key, patches.mark(annotation=planning.complete_mark(self._config.names),
                                                   value=_rfc3339(now)), content_type=MERGE_PATCH)
        if decision.action is planning.Action.TIMED_OUT and any(
            self._posted.get(m.key, ("", ""))[0] != planning.INCOMPLETE for m in decision.members if m.gated
        ):
            self._metrics.timeouts.inc()
        self._tell(decision, only_changes=True)

    def _overtaken(self, decision: planning.Decision, cluster: snapshot.Snapshot, result: planning.ReleasePlan,
                   ) -> str | None:
        """Why the release must not go out as planned, judged on the freshest snapshot (`planning.overtaken`)."""
        # Pods this pass nominates count in the plan already, whether or not their call has returned yet.
        ours = {key: node for d in result.decisions for key, node in d.nominations.items()}
        why = planning.overtaken(decision, planned=cluster, fresh=self._source.snapshot, left=result.left,
                                 names=self._config.names,
                                 assumed={**{key: node for key, (node, _) in self._assumed.items()}, **ours},
                                 unbuilt=self._source.unbuilt())
        if why:
            self._metrics.overtaken.inc()
            logger.info("%s %s: held back, planned afresh on the next pass: %s", "pod" if decision.single else "gang",
                        decision.gang, why)
        return why

    async def _release(self, decision: planning.Decision, cluster: snapshot.Snapshot, result: planning.ReleasePlan,
                       *, now: float) -> None:
        gate, nominations = self._config.names.gate, decision.nominations
        single = len(decision.ungate) == 1
        # A member naming our gang's own PodGroup never binds while it is missing: made sure of before anything.
        await pod_groups.ensure(self._api, members=[cluster.pods[m.key].raw for m in decision.members],
                                names=self._config.names,
                                timeout_seconds=self._config.kubernetes.request_timeout_seconds)
        if nominations:
            # Every member nominated before any is un-gated, so a failure half-way releases none (the next pass keeps
            # the nominations set and places the rest). Judged as a unit on the freshest snapshot first: a node taken
            # since the plan holds back every member; a single pod is judged once its call has a slot.
            if not single and self._overtaken(decision, cluster, result):
                return
            bodies = {key: body for key, node in nominations.items()
                      if (body := patches.nominate(cluster.pods[key].raw, node=node)) is not None}
            if single:
                guard = lambda: self._overtaken(decision, cluster, result)  # noqa: E731
                for key, body in bodies.items():
                    if not await self._patch(key, body, content_type=MERGE_PATCH, status=True, guard=guard):
                        return
            else:
                await _all(self._patch(key, body, content_type=MERGE_PATCH, status=True)
                           for key, body in bodies.items())

        # A pod's claim of its own is made before any member is un-gated (un-gated without it, a pod waits for ever);
        # a failure stops the release here, retried on the next pass.
        for member in decision.members:
            if member.key in decision.ungate and (made := await claims.ensure(
                    self._api, pod=cluster.pods[member.key].raw, names=self._config.names,
                    domain=_domain(cluster, member), timeout_seconds=self._config.kubernetes.request_timeout_seconds)):
                logger.info("%s: %s", member.key, made)

        # Every release is recorded on the pod in the same patch that un-gates it: when, where it was nominated and
        # why (what `outcomes` checks); then one short Event per released pod says where and why.
        at = _rfc3339(now)

        async def one(key: str) -> None:
            pod = cluster.pods[key].raw
            node = nominations.get(key)
            member = next(m for m in decision.members if m.key == key)
            record = (self._config.names.release,
                      outcomes.record(at=at, node=node, one_domain=member.one_domain, why=decision.message))
            patch = patches.release(pod, gate=gate, record=record)
            if patch and await self._patch(key, patch, content_type=JSON_PATCH):
                self._assumed[key] = (node or "", now)

        await _all(one(key) for key in decision.ungate)
        logger.info("%s %s: %s: %s", "pod" if decision.single else "gang", decision.gang, decision.action,
                    decision.message)
        self._metrics.releases.labels(_release_kind(decision)).inc()
        if decision.action is not planning.Action.RELEASE_ALONE:
            newest = max((cluster.pods[m.key].created for m in decision.members), default="")
            started = timestamps.epoch(newest)
            if started is not None:
                self._metrics.wait_seconds.observe(max(0.0, now - started))
        self._tell(decision, only_changes=False)  # one Event per release, a single pod's too

    async def _patch(self, key: str, body: object, *, content_type: str, status: bool = False,
                     guard: Callable[[], str | None] | None = None) -> bool:
        """Send the patch (to `pods/status` when `status`) once a slot is free; not if `guard` then says why not
        (False)."""
        async with self._calls:
            if guard is not None and guard():
                return False
            path = _pod_path(key) + ("/status" if status else "")
            await kube.request(self._api, "PATCH", path, body=body, content_type=content_type,
                               timeout_seconds=self._config.kubernetes.request_timeout_seconds)
            return True

    def _tell(self, decision: planning.Decision, *, only_changes: bool) -> None:
        """One Event per member (gated ones, for a gang that releases: they are the ones it concerns)."""
        if decision.event_type is None or decision.event_reason is None:
            return
        text = decision.summary or decision.message
        message = text if decision.single else f"gang {decision.gang}: {text}"
        # A waiting gang is re-told only when what it waits for changes, not on every count.
        said = (decision.event_reason, decision.waiting.value if decision.waiting else message)
        for member in decision.members:
            if not member.gated:
                continue
            if only_changes and self._posted.get(member.key) == said:
                continue
            if only_changes:  # a release is logged once per gang by _release
                logger.info("%s %s: %s: %s", "pod" if decision.single else "gang", member.key, decision.event_reason,
                            message)
            self._posted[member.key] = said
            self._post(events.ObjectRef.pod(member.key, uid=member.uid), type=decision.event_type,
                       reason=decision.event_reason, message=message,
                       failed=functools.partial(self._unsay, member.key, said))

    def _unsay(self, key: str, said: tuple[str, str]) -> None:
        """An Event not taken counts as not said, unless a newer one has been said since."""
        if self._posted.get(key) == said:
            del self._posted[key]

    def _count(self, result: planning.ReleasePlan) -> None:
        counts = dict.fromkeys((w.value for w in planning.Waiting), 0)
        counts["timed-out"] = 0
        for decision in result.decisions:
            if decision.action is planning.Action.TIMED_OUT:
                counts["timed-out"] += 1
            elif decision.waiting is not None:
                counts[decision.waiting.value] += 1
        for reason, count in counts.items():
            self._metrics.waiting.labels(reason).set(count)


async def run(
    *,
    config: settings.Settings,
    source: source.LiveSource,
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
    try:
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
    finally:
        await controller.settle(within=EVENT_GRACE_SECONDS)
