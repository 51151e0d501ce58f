"""Making sure our gang's own PodGroup exists before our gate is lifted from a member that names it.

kube-scheduler keeps a pod whose `spec.schedulingGroup` names a PodGroup that does not exist in its queue, with no
condition and no Event, until the PodGroup appears (tests/e2e/test_native_gang_binding_facts_e2e.py). So every
path that lifts our gate (release, the webhook's gate lifter, `gpu-steward release-gates`) calls `ensure` first and
lifts nothing if it fails. The bodies come from `gangs.pod_group_bodies`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client

from common import gangs, kube, settings


async def ensure(
    api: client.ApiClient,
    *,
    members: Sequence[Mapping[str, Any]],
    names: settings.Names,
    timeout_seconds: float,
) -> list[str]:
    """Create each PodGroup of ours `members` (the live pods of one gang) name, or lower an existing one's
    minCount to the members naming it; their namespace/name. Raises `kube.ApiError` when one could not be made
    sure of: the caller then lifts no gate."""
    made = []
    for body in gangs.pod_group_bodies(members, names=names):
        meta = body["metadata"]
        collection = f"/apis/scheduling.k8s.io/{gangs.OWN_POD_GROUP_VERSION}/namespaces/{meta['namespace']}/podgroups"
        try:
            await kube.request(api, "POST", collection, body=body, timeout_seconds=timeout_seconds)
        except kube.ApiError as exc:
            if exc.status != 409:
                raise
            await _lower(api, f"{collection}/{meta['name']}",
                         wanted=body["spec"]["schedulingPolicy"]["gang"]["minCount"], timeout_seconds=timeout_seconds)
        made.append(f"{meta['namespace']}/{meta['name']}")
    return made


async def _lower(api: client.ApiClient, path: str, *, wanted: int, timeout_seconds: float) -> None:
    """An existing PodGroup asking for more members than there are would hold them in kube-scheduler for ever."""
    existing = await kube.get(api, path, timeout_seconds=timeout_seconds)
    gang = ((existing.get("spec") or {}).get("schedulingPolicy") or {}).get("gang") or {}
    if isinstance(gang.get("minCount"), int) and gang["minCount"] > wanted:
        await kube.request(api, "PATCH", path, body={"spec": {"schedulingPolicy": {"gang": {"minCount": wanted}}}},
                           content_type="application/merge-patch+json", timeout_seconds=timeout_seconds)
