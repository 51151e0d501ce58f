"""The evictor: the only way the descheduler removes a pod. It owns safety and limits.

- Limits (per cycle, node, namespace, counted in decisions: `limits.Budget`) and the retry backoff are
  checked before any API call; only accepted evictions are charged, a gang once.
- Right before the call the pod is read live and its protections checked again (`protections`): the plan
  was made on a snapshot older than the utilisation query, and a pod that opted out (safe-to-evict false,
  skip, do-not-disrupt...) or started terminating since is not evicted (`protected`). A pod of another UID
  under the name is `gone` (the one judged was replaced).
- Eviction subresource: `policy/v1`, or `policy/v1beta1` when discovery shows the server lacks v1.
  The body carries the UID and the resourceVersion just read as preconditions, so neither a new pod that took
  the old one's name nor a pod changed since the check is hit.
- Answers: 201 evicted; 429 a PodDisruptionBudget blocks it (`blocked`, no backoff: the PDB is the judge;
  the loop cools the pod down and plans again without it); 404 already gone; 409 a precondition failed (the
  pod changed or was replaced since it was read: `changed`, judged again next cycle); anything else failed,
  retried on a later cycle after a doubling backoff.
- A plan's evictions are all or none per unit (a gang) and per demand: after one of them is not evicted, the
  rest are skipped. The planner checked every budget before the first call; a refusal after some victims of a
  demand were evicted is said in its outcome (`Outcome.partial`), for the loop to count and report.
- Dry-run swaps the client (`DryRunClient`), not the logic: limits and outcomes are the same.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from kubernetes_asyncio import client

from common import kube, settings, snapshot
from descheduler import limits, protections, reclaim

logger = logging.getLogger(__name__)


class Result(enum.StrEnum):
    EVICTED = "evicted"
    WOULD_EVICT = "would-evict"  # dry-run
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget
    GONE = "gone"  # 404, or 409 on the UID precondition
    FAILED = "failed"  # other errors: retried later with backoff
    LIMITED = "limited"  # a limit refused it before any call
    BACKOFF = "backoff"  # an earlier failure's backoff has not expired
    SKIPPED = "skipped"  # another member of its gang, or another victim of its demand, was not evicted
    PROTECTED = "protected"  # the live pod is protected now (opted out, terminating...): not evicted
    CHANGED = "changed"  # 409: the pod changed or was replaced since it was read


SUCCESS = frozenset({Result.EVICTED, Result.WOULD_EVICT})
_NAMES = settings.Names()


@dataclasses.dataclass(frozen=True)
class Outcome:
    eviction: reclaim.Eviction
    result: Result
    detail: str
    partial: tuple[str, ...] = ()  # not evicted after these victims of the same demand were: a broken transaction


class EvictionClient(Protocol):
    dry_run: bool

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it now; None when this client cannot read (no API: dry-run offline).
        Raise `kube.ApiError` (404: gone)."""
        ...

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
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

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await kube.get(self._api, f"/api/v1/namespaces/{namespace}/pods/{name}",
                              timeout_seconds=self._timeout)

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        version = await self.policy_version()
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {
            "apiVersion": f"policy/{version}",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": preconditions} if preconditions else {},
        }
        await kube.request(
            self._api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            body=body, timeout_seconds=self._timeout,
        )


class DryRunClient:
    """Accepts every eviction and does nothing: what would happen, without the eviction call. With an API client
    it reads pods live like the real one (a read changes nothing), so a dry-run shows the same re-checks."""

    dry_run = True

    def __init__(self, api: client.ApiClient | None = None, *, timeout_seconds: float = 5.0) -> None:
        self._api = api
        self._timeout = timeout_seconds

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self._api is None:
            return None
        return await kube.get(self._api, f"/api/v1/namespaces/{namespace}/pods/{name}",
                              timeout_seconds=self._timeout)

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None) -> None:
        return None


class Evictor:
    def __init__(self, evictions: EvictionClient, *, config: settings.Reclaim,
                 names: settings.Names = _NAMES) -> None:
        self._client = evictions
        self._config = config
        self._names = names
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
        budget: limits.Budget | None = None,
    ) -> list[Outcome]:
        """Evict in plan order under `budget` (default: a fresh one); a unit, and a demand, stop at their first
        victim not evicted. `record` is awaited after each outcome, before the next call (the caller's
        bookkeeping)."""
        budget = budget if budget is not None else limits.Budget(self._config.limits)
        outcomes: list[Outcome] = []
        broken: dict[str, str] = {}  # unit -> the member that was not evicted
        stopped: dict[str, str] = {}  # demand -> its victim that was not evicted
        done: dict[str, list[str]] = {}  # demand -> its victims evicted (or gone) so far
        for eviction in evictions:
            demand = eviction.preemptor
            if eviction.unit in broken:
                outcome = Outcome(eviction, Result.SKIPPED, f"gang member {broken[eviction.unit]} was not evicted")
            elif demand is not None and demand in stopped:
                outcome = Outcome(eviction, Result.SKIPPED,
                                  f"victim {stopped[demand]} of the same demand {demand} was not evicted")
            else:
                outcome = await self.evict(eviction, budget=budget, now=now)
                if outcome.result not in SUCCESS and outcome.result is not Result.GONE:
                    broken[eviction.unit] = eviction.pod
                    if demand is not None:
                        stopped[demand] = eviction.pod
                        before = tuple(done.get(demand, ()))
                        if before:
                            outcome = dataclasses.replace(outcome, partial=before, detail=(
                                f"{outcome.detail}; {len(before)} victim(s) of {demand} already evicted "
                                f"({', '.join(before)}): it is served in part"))
                elif demand is not None:
                    done.setdefault(demand, []).append(eviction.pod)
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
            live = await self._client.read(namespace=namespace, name=name)
            checked = self._recheck(eviction, live)
            if isinstance(checked, Outcome):
                return checked
            await self._client.evict(namespace=namespace, name=name, uid=eviction.uid, resource_version=checked)
        except kube.ApiError as exc:
            if exc.status == 429:
                return Outcome(eviction, Result.BLOCKED, f"a PodDisruptionBudget blocks the eviction: {exc}")
            if exc.status == 404:
                return Outcome(eviction, Result.GONE, "already gone")
            if exc.status == 409:
                return Outcome(eviction, Result.CHANGED,
                               f"the pod changed or was replaced since it was read (precondition failed): {exc}")
            return self._failed(eviction, identity, failures, now, str(exc))
        except (OSError, TimeoutError) as exc:
            return self._failed(eviction, identity, failures, now, f"{type(exc).__name__}: {exc}")
        self._failures.pop(identity, None)
        budget.charge(slot)
        return Outcome(eviction, Result.WOULD_EVICT if self.dry_run else Result.EVICTED, eviction.reason)

    def _recheck(self, eviction: reclaim.Eviction, live: Mapping[str, Any] | None) -> Outcome | str | None:
        """The live pod's resourceVersion (the eviction's precondition) if it may still go, else the outcome.
        None: no live object to check (a dry-run without API), evicted on the plan's word."""
        if live is None:
            return None
        meta = live.get("metadata") or {}
        if eviction.uid and meta.get("uid") != eviction.uid:
            return Outcome(eviction, Result.GONE, f"the pod was replaced (UID {meta.get('uid')}, judged "
                                                  f"{eviction.uid})")
        why = protections.why_protected(snapshot.parse_pod(live), node=None, names=self._names,
                                        conventions=self._config.conventions)
        if why:
            return Outcome(eviction, Result.PROTECTED, f"protected on the live pod: {why}")
        return str(meta.get("resourceVersion") or "") or None

    def _failed(self, eviction: reclaim.Eviction, identity: str, failures: int, now: float, error: str) -> Outcome:
        delay = min(self._config.retry_backoff_max_seconds,
                    self._config.retry_backoff_initial_seconds * 2 ** failures)
        self._failures[identity] = (failures + 1, now + delay)
        return Outcome(eviction, Result.FAILED, f"{error}; retried after {delay:.0f}s")
