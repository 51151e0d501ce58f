"""The webhook's gate lifter: no gate of ours outlives the release controller (`admission.orphaned_gates`).

Runs in every webhook replica beside the server, every `descheduler.gangs.resync_seconds`, on the replica's own
snapshot and Lease watch: one JSON patch per due pod removes our gate (only ours, guarded by a `test`) and writes
why into `gpu-steward.io/release`, once the pod's claim of its own, if it has one, is made (`claims.ensure`).
Replicas racing on the same pod are harmless: the loser's `test` fails (422) or the pod is gone (404). Each lift is
a log line and `gpu_steward_admission_gates_lifted_total`. Needs `patch` on pods (the chart grants it to the
webhook).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import prometheus_client
from kubernetes_asyncio import client

from admission import orphaned_gates
from common import claims, gangs, gate_patch, kube, label_values, pod_groups, settings, snapshot, source

logger = logging.getLogger(__name__)
TOLERATED = (404, 409, 422)  # gone, changed, or lifted by another replica first


async def run(
    *,
    config: settings.Settings,
    source: source.SnapshotSource,
    api: client.ApiClient,
    controller: Callable[[], float | None],
    registry: prometheus_client.CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Lift due gates until cancelled. `controller`: when the descheduler's Lease was last seen renewed."""
    lifted = prometheus_client.Counter(
        "gpu_steward_admission_gates_lifted",
        "Pods whose gpu-steward gate the webhook lifted because no release controller ran past their bound.",
        registry=registry if registry is not None else prometheus_client.CollectorRegistry())
    watching_since = clock()
    while True:
        await asyncio.sleep(config.descheduler.gangs.resync_seconds)
        if not source.synced:
            continue
        now = clock()
        cluster = source.snapshot
        for lift in orphaned_gates.due(cluster, config=config, now=now, seen_at=controller(),
                                       watching_since=watching_since):
            logger.warning("%s: %s", lift.unit, lift.why)
            if not await _ensure_pod_groups(api, config=config, cluster=cluster, lift=lift):
                continue
            for key in lift.pods:
                if await _lift(api, config=config, pod=cluster.pods[key].raw, key=key, why=lift.why, now=now):
                    lifted.inc()


async def _ensure_pod_groups(api: client.ApiClient, *, config: settings.Settings, cluster: snapshot.Snapshot,
                             lift: orphaned_gates.Lift) -> bool:
    """Our gang's own PodGroup, made sure of before any of its members' gates is lifted (else they would wait in
    kube-scheduler for ever); False: it could not be, nothing is lifted, retried next time."""
    raws = [pod.raw for pod in cluster.pods.values()]
    groups = {group: key for key in lift.pods if (group := gangs.named_pod_group(cluster.pods[key].raw,
                                                                                names=config.names))}
    for key in groups.values():  # a gang's launcher without a tier names a PodGroup of its own
        members = gangs.same_pod_group(raws, like=cluster.pods[key].raw, names=config.names)
        try:
            await pod_groups.ensure(api, members=members, names=config.names,
                                    timeout_seconds=config.kubernetes.request_timeout_seconds)
        except (kube.ApiError, aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("%s: PodGroup not made sure of: %s; no gate lifted, retried next time", lift.unit, exc)
            return False
    return True


async def _lift(api: client.ApiClient, *, config: settings.Settings, pod: Mapping[str, Any], key: str, why: str,
                now: float) -> bool:
    ungate = gate_patch.ungate(pod, gate=config.names.gate)
    if not ungate:
        return False
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = gate_patch.annotate(pod, key=config.names.release, value=label_values.stamp(stamp, why))
    namespace, _, name = key.partition("/")
    try:
        made = await claims.ensure(api, pod=pod, names=config.names, domain=None,
                                   timeout_seconds=config.kubernetes.request_timeout_seconds)
    except (kube.ApiError, aiohttp.ClientError, TimeoutError) as exc:  # its template gone (404) included
        logger.warning("gate of %s not lifted: its claim of its own not made: %s; retried next time", key, exc)
        return False
    if made:
        logger.info("%s: %s", key, made)
    try:
        await kube.request(api, "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=[record, *ungate],
                           content_type="application/json-patch+json",
                           timeout_seconds=config.kubernetes.request_timeout_seconds)
    except kube.ApiError as exc:
        if exc.status not in TOLERATED:
            logger.warning("gate of %s not lifted: %s; retried next time", key, exc)
        return False
    except (aiohttp.ClientError, TimeoutError) as exc:
        logger.warning("gate of %s not lifted: %s; retried next time", key, exc)
        return False
    return True
