"""Post a Kubernetes Event about any object — the one way gpu-steward tells users what it did and why.

Interface (shared by the descheduler's reclaim loop and the gang controller):

    ref = events.ObjectRef(kind="Pod", namespace="team-a", name="train-1", uid="...")
    ok = await events.post(api, regarding=ref, type="Normal", reason="IdleGPUReclaimed",
                           message="...", request_timeout=5)

`post()` never raises (except cancellation): an Event is a courtesy, so a failure is logged and
returned as False, never allowed to break the caller's loop. Events are core/v1 (`kubectl describe`
and `kubectl get events` show them on every server version); cluster-scoped objects (Nodes,
PriorityClasses) get their Event in the `default` namespace, as kubectl and the scheduler do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import secrets
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
        # Unique like client-go's recorder: object name plus a random suffix.
        "metadata": {"name": f"{regarding.name}.{secrets.token_hex(8)}", "namespace": namespace},
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
    try:
        namespace = document["metadata"]["namespace"]
        await kube.request(
            api, "POST", f"/api/v1/namespaces/{namespace}/events", body=document, timeout_seconds=request_timeout
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an Event must never break its caller
        logger.warning(
            "event %s %s on %s %s/%s not posted: %s",
            type, reason, regarding.kind, regarding.namespace or "", regarding.name, _describe(exc),
        )
        return False
    return True


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, kube.ApiError) else f"{type(exc).__name__}: {exc}"
