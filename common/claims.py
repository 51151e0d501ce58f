"""Making sure a pod's claim of its own exists before our gate is lifted from it (`common.domain_claim`).

A pod whose claim entry names a claim that does not exist is kept out of kube-scheduler's queue once un-gated, and
still reads `SchedulingGated` with no gate left (tests/e2e/test_dra_domain_facts_e2e.py). So every path that lifts
our gate (release, the webhook's gate lifter, `gpu-steward release-gates`) calls `ensure` first, like
`pod_groups.ensure`, and lifts nothing if it raises. Needs `get` on resourceclaimtemplates and resourceclaims and
`create` on resourceclaims (the chart grants them to the descheduler, the webhook and the uninstall hook).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from common import domain_claim, dra, kube, settings


async def ensure(
    api: client.ApiClient,
    *,
    pod: Mapping[str, Any],
    names: settings.Names,
    domain: domain_claim.Domain | None,
    timeout_seconds: float,
) -> str | None:
    """Create the pod's own claim (`dra.recorded`, in our annotation `names.domain_claim`) from its template, asking
    `domain` first when planned: a server-side dry run, then the create. One there already is used as it is
    (`domain_claim.judge` says whose it is). What it did, for the log; None when the pod has no claim of its own.
    Raises `kube.ApiError` when the claim could not be made sure of (its template is gone: 404): the caller then
    lifts no gate."""
    record = dra.recorded(pod, annotation=names.domain_claim)
    if record is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    claims = f"/apis/{domain_claim.API_VERSION}/namespaces/{namespace}/resourceclaims"
    existing = await _get(api, f"{claims}/{record.claim}", timeout_seconds=timeout_seconds)
    if existing is None:
        template = await kube.get(
            api, f"/apis/{domain_claim.API_VERSION}/namespaces/{namespace}/resourceclaimtemplates/{record.template}",
            timeout_seconds=timeout_seconds)
        body = domain_claim.body(pod=pod, record=record, template=template, domain=domain)
        try:
            await kube.request(api, "POST", claims, body=body, query={"dryRun": "All"}, timeout_seconds=timeout_seconds)
            await kube.request(api, "POST", claims, body=body, timeout_seconds=timeout_seconds)
        except kube.ApiError as exc:
            if exc.status != 409:
                raise
            existing = await kube.get(api, f"{claims}/{record.claim}", timeout_seconds=timeout_seconds)
        else:
            asked = f"NVLink domain {list(domain.indices)} first" if domain is not None and domain.indices else (
                f"template {record.template}'s request")
            return f"claim {record.claim} created, asking {asked}"
    why = domain_claim.judge(claim=existing, pod=pod)
    return why or f"claim {record.claim} there already (made before a restart): used as it is"


async def _get(api: client.ApiClient, path: str, *, timeout_seconds: float) -> dict[str, Any] | None:
    try:
        return await kube.get(api, path, timeout_seconds=timeout_seconds)
    except kube.ApiError as exc:
        if exc.status == 404:
            return None
        raise
