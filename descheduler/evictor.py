"""The evictor: the only way the descheduler removes a pod. It owns safety and limits.

- Limits (per cycle, node, namespace, counted in decisions: `limits.Budget`) and the retry backoff are
  checked before any API call; only accepted evictions are charged, a gang once.
- Eviction subresource: `policy/v1`, or `policy/v1beta1` when discovery shows the server lacks v1.
  The body carries a UID precondition, so a new pod that took the old one's name is never hit.
- Answers: 201 evicted; 429 a PodDisruptionBudget blocks it (skipped, no backoff: the PDB is the
  judge); 404 already gone; 409 the UID changed (the pod we judged is gone); anything else failed,
  retried on a later cycle after a doubling backoff.
- The members of a unit (a gang) go together: after a member is not evicted, the rest are skipped.
- Dry-run swaps the client (`DryRunClient`), not the logic: limits and outcomes are the same.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from kubernetes_asyncio import client

from common import kube, settings
from descheduler import limits, reclaim

logger = logging.getLogger(__name__)


class Result(enum.StrEnum):
    EVICTED = "evicted"
    WOULD_EVICT = "would-evict"  # dry-run
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget
    GONE = "gone"  # 404, or 409 on the UID precondition
    FAILED = "failed"  # other errors: retried later with backoff
    LIMITED = "limited"  # a limit refused it before any call
    BACKOFF = "backoff"  # an earlier failure's backoff has not expired
    SKIPPED = "skipped"  # another member of its gang was not evicted


SUCCESS = frozenset({Result.EVICTED, Result.WOULD_EVICT})


@dataclasses.dataclass(frozen=True)
class Outcome:
    eviction: reclaim.Eviction
    result: Result
    detail: str


class EvictionClient(Protocol):
    dry_run: bool

    async def evict(self, *, namespace: str, name: str, uid: str) -> None:
        """Raise `kube.ApiError` (with the HTTP status) when the server refuses."""
        ...


class ApiEvictionClient:
    dry_run = False

    def __init__(self, api: client.ApiClient, *, timeout_seconds: float) -> None:
        self._api = api
        self._timeout = timeout_seconds
        self._version: str | None = None

    async def policy_version(self) -> str:
        """`v1` unless discovery of the policy group lists only v1beta1 (Kubernetes < 1.22 servers)."""
        if self._version is None:
            try:
                group = await kube.get(self._api, "/apis/policy", timeout_seconds=self._timeout)
            except kube.ApiError as exc:
                logger.warning("discovery of the policy API group failed (%s); assuming policy/v1", exc)
                return "v1"
            versions = {v.get("version") for v in group.get("versions") or []}
            self._version = "v1" if "v1" in versions or "v1beta1" not in versions else "v1beta1"
        return self._version

    async def evict(self, *, namespace: str, name: str, uid: str) -> None:
        version = await self.policy_version()
        body = {
            "apiVersion": f"policy/{version}",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}} if uid else {},
        }
        await kube.request(
            self._api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            body=body, timeout_seconds=self._timeout,
        )


class DryRunClient:
    """Accepts every eviction and does nothing: what would happen, without the API call."""

    dry_run = True

    async def evict(self, *, namespace: str, name: str, uid: str) -> None:
        return None


class Evictor:
    def __init__(self, evictions: EvictionClient, *, config: settings.Reclaim) -> None:
        self._client = evictions
        self._config = config
        self._failures: dict[str, tuple[int, float]] = {}  # pod uid or key -> (failures, retry not before)

    @property
    def dry_run(self) -> bool:
        return self._client.dry_run

    async def evict_plan(
        self,
        evictions: Iterable[reclaim.Eviction],
        *,
        now: float,
        record: Callable[[Outcome], Awaitable[None]] | None = None,
    ) -> list[Outcome]:
        """Evict in plan order under a fresh budget; a unit stops at its first member not evicted.
        `record` is awaited after each outcome, before the next call (the caller's bookkeeping)."""
        budget = limits.Budget(self._config.limits)
        outcomes: list[Outcome] = []
        broken: dict[str, str] = {}  # unit -> the member that was not evicted
        for eviction in evictions:
            if eviction.unit in broken:
                outcome = Outcome(eviction, Result.SKIPPED, f"gang member {broken[eviction.unit]} was not evicted")
            else:
                outcome = await self.evict(eviction, budget=budget, now=now)
                if outcome.result not in SUCCESS and outcome.result is not Result.GONE:
                    broken[eviction.unit] = eviction.pod
            outcomes.append(outcome)
            if record is not None:
                await record(outcome)
        return outcomes

    async def evict(self, eviction: reclaim.Eviction, *, budget: limits.Budget, now: float) -> Outcome:
        slot = [(eviction.unit, eviction.namespace, eviction.node)]
        identity = eviction.uid or eviction.pod
        failures, not_before = self._failures.get(identity, (0, 0.0))
        if now < not_before:
            return Outcome(eviction, Result.BACKOFF,
                           f"{failures} failed attempt(s); next try in {not_before - now:.0f}s")
        refused = budget.refuse(slot)
        if refused:
            return Outcome(eviction, Result.LIMITED, refused)
        namespace, _, name = eviction.pod.partition("/")
        try:
            await self._client.evict(namespace=namespace, name=name, uid=eviction.uid)
        except kube.ApiError as exc:
            if exc.status == 429:
                return Outcome(eviction, Result.BLOCKED, f"a PodDisruptionBudget blocks the eviction: {exc}")
            if exc.status == 404:
                return Outcome(eviction, Result.GONE, "already gone")
            if exc.status == 409:
                return Outcome(eviction, Result.GONE, f"the pod was replaced (UID precondition failed): {exc}")
            return self._failed(eviction, identity, failures, now, str(exc))
        except (OSError, TimeoutError) as exc:
            return self._failed(eviction, identity, failures, now, f"{type(exc).__name__}: {exc}")
        self._failures.pop(identity, None)
        budget.charge(slot)
        return Outcome(eviction, Result.WOULD_EVICT if self.dry_run else Result.EVICTED, eviction.reason)

    def _failed(self, eviction: reclaim.Eviction, identity: str, failures: int, now: float, error: str) -> Outcome:
        delay = min(self._config.retry_backoff_max_seconds,
                    self._config.retry_backoff_initial_seconds * 2 ** failures)
        self._failures[identity] = (failures + 1, now + delay)
        return Outcome(eviction, Result.FAILED, f"{error}; retried after {delay:.0f}s")
