"""Reading and writing the reclaim cooldowns' Lease (see `descheduler.cooldowns` for the format)."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client

from common import kube, settings
from descheduler import cooldowns

logger = logging.getLogger(__name__)


def _path(config: settings.Settings, *, name: str | None = None) -> str:
    namespace = config.descheduler.leader_election.lease_namespace
    base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{base}/{name}" if name else base


async def _read(api: client.ApiClient, *, config: settings.Settings) -> dict[str, Any] | None:
    try:
        return await kube.get(
            api,
            _path(config, name=config.descheduler.reclaim.cooldown_lease_name),
            timeout_seconds=config.kubernetes.request_timeout_seconds,
        )
    except kube.ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def load(api: client.ApiClient, *, config: settings.Settings) -> cooldowns.State:
    """The stored cooldowns; none when the Lease does not exist yet. Raises kube.ApiError otherwise."""
    lease = await _read(api, config=config)
    if lease is None:
        return cooldowns.State()
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    state, problem = cooldowns.decode(annotations.get(config.names.cooldown))
    if problem:
        logger.warning("%s", problem)
    return state


async def save(api: client.ApiClient, state: cooldowns.State, *, config: settings.Settings, now: float) -> None:
    """Merge `state` into the stored cooldowns (optimistic concurrency: one retry on a 409 conflict)."""
    name = config.descheduler.reclaim.cooldown_lease_name
    timeout = config.kubernetes.request_timeout_seconds
    for attempt in range(2):
        lease = await _read(api, config=config)
        metadata: dict[str, Any] = {"name": name, "namespace": config.descheduler.leader_election.lease_namespace}
        stored = cooldowns.State()
        if lease is not None:
            metadata = dict(lease.get("metadata") or {})
            stored, _ = cooldowns.decode((metadata.get("annotations") or {}).get(config.names.cooldown))
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            config.names.cooldown: cooldowns.encode(stored.merged(state, now=now)),
        }
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": (lease or {}).get("spec") or {}}
        try:
            if lease is None:
                await kube.request(api, "POST", _path(config), body=body, timeout_seconds=timeout)
            else:
                await kube.request(api, "PUT", _path(config, name=name), body=body, timeout_seconds=timeout)
            return
        except kube.ApiError as exc:
            if exc.status != 409 or attempt:  # 409: someone wrote in between (or created it first)
                raise
