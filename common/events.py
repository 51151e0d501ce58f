"""Post a Kubernetes Event about any object — the one way gpu-steward tells users what it did and why.

Interface (shared by the descheduler's reclaim loop and the gang controller):

    ref = events.ObjectRef(kind="Pod", namespace="team-a", name="train-1", uid="...")
    ok = await events.post(api, regarding=ref, type="Normal", reason="IdleGPUReclaimed",
                           message="...", request_timeout=5)

`post()` never raises (except cancellation): an Event is a courtesy, so a failure is logged and
returned as False, never allowed to break the caller's loop. Repeats aggregate as client-go's
recorder does: the Event's name is derived from what it says about which object, so the same
Event again (an eviction a PodDisruptionBudget keeps blocking every cycle) bumps `count` and
`lastTimestamp` of the existing one instead of adding another. Events are core/v1 (`kubectl describe`
and `kubectl get events` show them on every server version); cluster-scoped objects (Nodes,
PriorityClasses) get their Event in the `default` namespace, as kubectl and the scheduler do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import logging
from typing import Any, Literal

from kubernetes_asyncio import client

from common import kube

logger = logging.getLogger(__name__)

COMPONENT = "gpu-steward"
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"
MAX_MESSAGE = 1024  # the API server rejects longer core/v1 Event messages

EventType = Literal["Normal", "Warning"]


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """What the Event is about. `namespace=None` for cluster-scoped kinds."""

    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    api_version: str = "v1"

    @classmethod
    def pod(cls, key: str, *, uid: str | None = None) -> ObjectRef:
        """From a `namespace/name` pod key."""
        namespace, _, name = key.partition("/")
        return cls(kind="Pod", name=name, namespace=namespace, uid=uid or None)


def _name(regarding: ObjectRef, *, type: EventType, reason: str, message: str) -> str:
    """The same Event about the same object gets the same name (object name + a digest)."""
    said = "\0".join((regarding.kind, regarding.namespace or "", regarding.name, regarding.uid or "", type, reason,
                      message[:MAX_MESSAGE]))
    return f"{regarding.name}.{hashlib.sha256(said.encode()).hexdigest()[:16]}"


def body(
    *, regarding: ObjectRef, type: EventType, reason: str, message: str, component: str, now: datetime.datetime
) -> dict[str, Any]:
    """The core/v1 Event document (pure; exposed for tests)."""
    namespace = regarding.namespace or CLUSTER_SCOPED_EVENT_NAMESPACE
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"kind": regarding.kind, "name": regarding.name, "apiVersion": regarding.api_version}
    if regarding.namespace:
        involved["namespace"] = regarding.namespace
    if regarding.uid:
        involved["uid"] = regarding.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": _name(regarding, type=type, reason=reason, message=message), "namespace": namespace},
        "involvedObject": involved,
        "type": type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post(
    api: client.ApiClient,
    *,
    regarding: ObjectRef,
    type: EventType,
    reason: str,
    message: str,
    request_timeout: float,
    component: str = COMPONENT,
) -> bool:
    """Create the Event; True when the API server accepted it. Never raises (but lets cancellation through)."""
    document = body(
        regarding=regarding,
        type=type,
        reason=reason,
        message=message,
        component=component,
        now=datetime.datetime.now(datetime.UTC),
    )
    namespace, name = document["metadata"]["namespace"], document["metadata"]["name"]
    try:
        try:
            await kube.request(
                api, "POST", f"/api/v1/namespaces/{namespace}/events", body=document, timeout_seconds=request_timeout
            )
        except kube.ApiError as exc:
            if exc.status != 409:
                raise
            path = f"/api/v1/namespaces/{namespace}/events/{name}"
            await _repeat(api, path, document, timeout_seconds=request_timeout)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an Event must never break its caller
        logger.warning(
            "event %s %s on %s %s/%s not posted: %s",
            type, reason, regarding.kind, regarding.namespace or "", regarding.name, _describe(exc),
        )
        return False
    return True


async def _repeat(api: client.ApiClient, path: str, document: dict[str, Any], *, timeout_seconds: float) -> None:
    """The same Event exists: count one more occurrence (merge patch, guarded by resourceVersion)."""
    existing = await kube.get(api, path, timeout_seconds=timeout_seconds)
    patch = {
        "metadata": {"resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")},
        "count": int(existing.get("count") or 1) + 1,
        "lastTimestamp": document["lastTimestamp"],
    }
    await kube.request(api, "PATCH", path, body=patch, timeout_seconds=timeout_seconds,
                       content_type="application/merge-patch+json")


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, kube.ApiError) else f"{type(exc).__name__}: {exc}"
