"""Acting on stuck pins (`recovery`): evict what its controller re-creates, re-create bare pods, report the rest.

Called by the release controller after each pass's releases. Every recovery is a log line, a metric
(`gpu_steward_pin_recoveries_total{cause,how}`) and Events on the pod and on its owner; the pins stuck past their
deadline are a gauge (`gpu_steward_pins_stuck`) the chart's PrometheusRule alerts on. A pin past its deadline that
is waited on (`recovery.waiting`: kube-scheduler nominated it to its node) is a log line, a Normal `PinWaiting` Event
on the pod saying which wait and until when (once per text), and a gauge (`gpu_steward_pins_waiting{wait}`).

A bare pod is re-created through a journal, so that no restart can lose it: its manifest (`patches.recreation`)
is written first to a ConfigMap in the Lease namespace (`gpu-steward-recreate-<uid>`), then the pod is deleted
(precondition: its uid), then each pass replays the journals: a pod that is gone is created from its journal, and a
journal whose pod exists again (created by us or anyone) is deleted. Creating the pod again goes through admission,
so our webhook gates it and release places it afresh.

A unit may hold running members (a gang whose release is part-bound, `recovery`), and the Eviction API may refuse
to evict a running pod (HTTP 429: a PodDisruptionBudget allows no disruption now; a Pending pod is never refused).
So a unit is never left half done by a refusal that could be foreseen: its running members to evict are first
evicted in dry run (`dryRun=All`: the API server checks the budgets and changes nothing); any refusal and the whole
unit is reported (Warning `PinStuck`, metric how=report) and nothing is touched — the next pass tries again. Then
the unit's pods are acted on in `Recovery.in_order`, running members to evict first, so that a refusal no dry run
could foresee (two evictions drawing on one budget that allows one) stops the unit before any of its pinned pods or
bare members are touched; it is reported too, and the next pass takes up the rest: the members still running are
still of the stuck pods' release, and the one evicted comes back gated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import prometheus_client
from kubernetes_asyncio import client

from common import events, kube, settings, snapshot
from descheduler.release import patches, planning, recovery

logger = logging.getLogger(__name__)

JOURNAL_PREFIX = "gpu-steward-recreate-"
FAILURES = (kube.ApiError, aiohttp.ClientError, TimeoutError)


class Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.recoveries = prometheus_client.Counter(
            "gpu_steward_pin_recoveries",
            "Pinned pods found stuck (not bound past the deadline, node gone or cordoned), by cause and by what was "
            "done: evict (its controller re-creates it), recreate (a bare pod), report (left, with a Warning).",
            ["cause", "how"], registry=registry)
        self.stuck = prometheus_client.Gauge(
            "gpu_steward_pins_stuck", "Pinned pods stuck at the last pass (recovered ones leave it at the next).",
            registry=registry)
        self.waiting = prometheus_client.Gauge(
            "gpu_steward_pins_waiting", "Pinned pods past their deadline that were waited on at the last pass, by "
            "why: victims-leaving (kube-scheduler preempts on their node), retry-due (nominated there, room free).",
            ["wait"], registry=registry)


def _journal_label(names: settings.Names) -> str:
    return f"{names.prefix}recreate"


def _owner_ref(pod: snapshot.Pod) -> events.ObjectRef | None:
    for ref in (pod.raw.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return events.ObjectRef(kind=str(ref.get("kind")), name=str(ref.get("name")), namespace=pod.namespace,
                                    uid=ref.get("uid"), api_version=str(ref.get("apiVersion") or "v1"))
    return None


def journal(manifest: Mapping[str, Any], *, key: str, uid: str, names: settings.Names) -> dict[str, Any]:
    """The ConfigMap that holds a bare pod's manifest while it is deleted and created again."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": JOURNAL_PREFIX + uid, "labels": {_journal_label(names): "true"},
                     "annotations": {_journal_label(names): f"{key} uid {uid}"}},
        "data": {"pod.json": json.dumps(manifest, sort_keys=True), "uid": uid},
    }


def recreated(pod: Mapping[str, Any], *, names: settings.Names) -> dict[str, Any]:
    """The manifest a stuck bare pod is created again from: `patches.recreation` without our annotations — the
    release record, the gang's complete mark, and the webhook's decision record. With the decision record left on,
    the webhook skips the new pod as already mutated: a gang member came back without its gate and started alone
    (its gang part-running), and a governed pod was never placed afresh."""
    return patches.recreation(pod, ours=[names.release, planning.complete_mark(names), names.decision])


class Recoverer:
    def __init__(self, *, config: settings.Settings, api: client.ApiClient, metrics: Metrics) -> None:
        self._config = config
        self._api = api
        self._metrics = metrics
        self._timeout = config.kubernetes.request_timeout_seconds
        self._reported: set[tuple[str, str]] = set()  # courtesy: (pod key, message) already told
        self._waits_told: set[tuple[str, str]] = set()  # courtesy: (pod key, why) of waits already told
        self._replayed_at: float | None = None  # courtesy: journals are listed once per resync (and after a recreate)

    async def run(self, cluster: snapshot.Snapshot, *, now: float) -> tuple[recovery.Recovery, ...]:
        """One pass: read the Jobs that matter, decide, act; then replay the journals of bare pods."""
        wanted = recovery.jobs_to_read(cluster, config=self._config, now=now)
        jobs = {key: facts for key in wanted if (facts := await self._job(key)) is not None}
        found = recovery.assess(cluster, config=self._config, now=now, jobs=jobs)
        self._metrics.stuck.set(sum(1 for r in found for p in r.pods if p.cause is not None))
        live: set[tuple[str, str]] = set()
        for item in found:
            said = item.message
            try:
                said = await self._one(item, cluster)
            except FAILURES as exc:
                logger.warning("pin recovery of %s stopped: %s; retried on the next pass", item.unit, exc)
            live |= {(p.key, said) for p in item.pods}
        self._reported &= live
        await self._tell_waits(recovery.waiting(cluster, config=self._config, now=now), cluster)
        recreated = any(p.how is recovery.How.RECREATE for r in found if r.acting for p in r.pods)
        resync = self._config.descheduler.gangs.resync_seconds
        if recreated or self._replayed_at is None or now - self._replayed_at >= resync:
            self._replayed_at = now
            await self._replay()
        return found

    async def _tell_waits(self, waits: tuple[recovery.Waiting, ...], cluster: snapshot.Snapshot) -> None:
        for wait in recovery.Wait:
            self._metrics.waiting.labels(wait.value).set(sum(1 for w in waits if w.wait is wait))
        told = {(w.key, w.why) for w in waits}
        for item in waits:
            if (item.key, item.why) in self._waits_told:
                continue
            message = f"pinned to {item.node}, not bound past its deadline: {item.why}"
            logger.info("pin waited on: %s: %s", item.key, message)
            regarding = events.ObjectRef.pod(item.key, uid=cluster.pods[item.key].uid)
            if not await events.post(self._api, regarding=regarding, type="Normal", reason=recovery.WAITING,
                                     message=message, request_timeout=self._timeout):
                told.discard((item.key, item.why))  # told again on the next pass
        self._waits_told = told

    async def _one(self, item: recovery.Recovery, cluster: snapshot.Snapshot) -> str:
        """Act on one unit (or report it); what it told."""
        if not item.acting:
            return await self._report(item, cluster, item.message)
        for pod in item.in_order:
            if pod.bound and pod.how is recovery.How.EVICT and (refused := await self._evict(pod.key, dry_run=True)):
                return await self._report(item, cluster, _refused(item, f"{pod.key}: {refused}; nothing was done"))
        logger.warning("pin recovered: %s", item.message)
        await self._tell(item, cluster, type_="Warning", reason=recovery.RECOVERED, message=item.message)
        for done, pod in enumerate(item.in_order):
            if pod.how is recovery.How.RECREATE:
                await self._recreate(cluster.pods[pod.key])
            elif refused := await self._evict(pod.key):
                return await self._report(item, cluster, _refused(
                    item, f"{pod.key}: {refused}; {done} of its {len(item.pods)} pods taken down, the rest is "
                          "taken on a later pass"))
        self._metrics.recoveries.labels(item.cause.value, item.how.value).inc()
        return item.message

    async def _report(self, item: recovery.Recovery, cluster: snapshot.Snapshot, message: str) -> str:
        """A Warning on the unit's pods and owners, once per message; metric how=report."""
        if all((p.key, message) in self._reported for p in item.pods):
            return message
        logger.warning("pin stuck: %s", message)
        self._metrics.recoveries.labels(item.cause.value, recovery.How.REPORT.value).inc()
        await self._tell(item, cluster, type_="Warning", reason=recovery.STUCK, message=message)
        self._reported |= {(p.key, message) for p in item.pods}
        return message

    async def _tell(self, item: recovery.Recovery, cluster: snapshot.Snapshot, *, type_: events.EventType,
                    reason: str, message: str) -> None:
        owners: dict[tuple[str, str], events.ObjectRef] = {}
        for stuck in item.pods:
            await events.post(self._api, regarding=events.ObjectRef.pod(stuck.key, uid=stuck.uid), type=type_,
                              reason=reason, message=message, request_timeout=self._timeout)
            ref = _owner_ref(cluster.pods[stuck.key])
            if ref is not None:
                owners[(ref.kind, ref.name)] = ref
        for ref in owners.values():
            await events.post(self._api, regarding=ref, type=type_, reason=reason, message=message,
                              request_timeout=self._timeout)

    async def _job(self, key: str) -> recovery.JobFacts | None:
        namespace, _, name = key.partition("/")
        try:
            job = await kube.get(self._api, f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
                                 timeout_seconds=self._timeout)
        except FAILURES as exc:
            logger.warning("pin recovery: Job %s not read (%s): its pods are reported, not evicted", key, exc)
            return None
        return recovery.job_facts(job)

    async def _evict(self, key: str, *, dry_run: bool = False) -> str | None:
        """Evict the pod (`dry_run`: only ask whether the API server would); why it refuses, None when it does not."""
        namespace, _, name = key.partition("/")
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            await kube.request(self._api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body,
                               query={"dryRun": "All"} if dry_run else None, timeout_seconds=self._timeout)
        except kube.ApiError as exc:
            if exc.status == 429:  # a PodDisruptionBudget allows no disruption now
                return f"eviction refused ({exc})"
            if exc.status != 404:  # gone already: what we wanted
                raise
        return None

    def _journal_path(self, name: str = "") -> str:
        namespace = self._config.descheduler.leader_election.lease_namespace
        return f"/api/v1/namespaces/{namespace}/configmaps" + (f"/{name}" if name else "")

    async def _recreate(self, pod: snapshot.Pod) -> None:
        names = self._config.names
        manifest = recreated(pod.raw, names=names)
        try:
            await kube.request(self._api, "POST", self._journal_path(), timeout_seconds=self._timeout,
                               body=journal(manifest, key=pod.key, uid=pod.uid, names=names))
        except kube.ApiError as exc:
            if exc.status != 409:  # written by an earlier pass: the same manifest
                raise
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        try:
            await kube.request(self._api, "DELETE", path, body={"preconditions": {"uid": pod.uid}},
                               timeout_seconds=self._timeout)
        except kube.ApiError as exc:
            if exc.status not in (404, 409):  # gone, or another pod by that name now: the replay settles both
                raise

    async def _replay(self) -> None:
        label = _journal_label(self._config.names)
        try:
            listed = await kube.get(self._api, self._journal_path(), timeout_seconds=self._timeout,
                                    query={"labelSelector": f"{label}=true"})
        except FAILURES as exc:
            logger.warning("pin recovery: journals not listed (%s); replayed on the next pass", exc)
            return
        for journal in listed.get("items") or ():
            try:
                await self._settle(journal)
            except FAILURES as exc:
                logger.warning("pin recovery: journal %s not replayed (%s); next pass",
                               (journal.get("metadata") or {}).get("name"), exc)

    async def _settle(self, journal: Mapping[str, Any]) -> None:
        data = journal.get("data") or {}
        manifest: dict[str, Any] = json.loads(data.get("pod.json") or "{}")
        meta = manifest.get("metadata") or {}
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods"
        try:
            current = await kube.get(self._api, f"{path}/{meta.get('name')}", timeout_seconds=self._timeout)
        except kube.ApiError as exc:
            if exc.status != 404:
                raise
            current = None
        if current is not None and (current.get("metadata") or {}).get("uid") == data.get("uid"):
            return  # the old pod is still being deleted
        if current is None:
            try:
                await kube.request(self._api, "POST", path, body=manifest, timeout_seconds=self._timeout)
                logger.info("pin recovery: %s/%s created again without its pin", meta.get("namespace"),
                            meta.get("name"))
            except kube.ApiError as exc:
                if exc.status != 409:
                    raise
        name = (journal.get("metadata") or {}).get("name")
        try:
            await kube.request(self._api, "DELETE", self._journal_path(str(name)), timeout_seconds=self._timeout)
        except kube.ApiError as exc:
            if exc.status != 404:
                raise


def _refused(item: recovery.Recovery, why: str) -> str:
    """The report of a unit whose eviction the API server refused."""
    what = item.message.partition("; recovered")[0]
    return f"{what}; not recovered, retried on each pass: {why}"
